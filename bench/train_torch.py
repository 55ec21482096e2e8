#!/usr/bin/env python3
"""The GPT of tools/gpt.c in PyTorch, timed the way `nabla train` times itself.

Same model (token and position embeddings, pre-norm blocks with causal
self-attention and a tanh-GELU MLP, biases on every linear, tied head), same
optimizer (AdamW, betas 0.9/0.99, eps 1e-8, decay 0.1 on weights only,
global-norm clipping at 1.0) and
the same per-step host read of the loss, in f32 with TF32 off (nabla trains
in f32 with exact f32 GEMMs). Prints tokens/s for eager and torch.compile:

  python3 bench/train_torch.py --layers 6 --heads 6 --dim 384 --context 256 \
      --batch 64 --vocab 96 --steps 200
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, dim, heads, layers):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)
        res_std = 0.02 / math.sqrt(2 * layers)
        for lin, std in ((self.qkv, 0.02), (self.proj, res_std), (self.fc, 0.02), (self.out, res_std)):
            nn.init.normal_(lin.weight, 0.0, std)
            nn.init.zeros_(lin.bias)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, dim):
        super().__init__()
        self.wte = nn.Parameter(torch.randn(vocab, dim) * 0.02)
        self.wpe = nn.Parameter(torch.randn(context, dim) * 0.02)
        self.blocks = nn.ModuleList(Block(dim, heads, layers) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte[idx] + self.wpe[:T]
        for b in self.blocks:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.t()
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_optimizer(model, lr):
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.ndim == 2]
    ids = {id(p) for p in decay}
    plain = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-8)


def time_training(a, compiled):
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = GPT(a.vocab, a.context, a.layers, a.heads, a.dim).to(dev)
    opt = make_optimizer(model, a.lr)
    step_model = torch.compile(model) if compiled else model
    # Rotating random batches, made up front: the timed loop is the step alone.
    batches = [torch.randint(0, a.vocab, (a.batch, a.context + 1), device=dev) for _ in range(8)]

    def step(i):
        seq = batches[i % len(batches)]
        loss = step_model(seq[:, :-1], seq[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # nabla train reads every step's loss too

    for i in range(a.warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(a.steps):
        last = step(i)
    torch.cuda.synchronize()
    sec = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    return {"mode": "compile" if compiled else "eager", "tokens_per_s": a.steps * a.batch * a.context / sec,
            "ms_per_step": 1e3 * sec / a.steps, "params": params, "last_loss": last,
            "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("layers", 6), ("heads", 6), ("dim", 384), ("context", 256), ("batch", 64),
                          ("vocab", 96), ("steps", 200), ("warmup", 20)):
        p.add_argument("--" + name, type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("train_torch.py: needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = []
    for compiled in (False,) if a.no_compile else (False, True):
        torch.cuda.reset_peak_memory_stats()
        r = time_training(a, compiled)
        results.append(r)
        print(f"torch {r['mode']:8s} {r['tokens_per_s']:10.0f} tokens/s  {r['ms_per_step']:8.2f} ms/step  "
              f"{r['params']} params  peak {r['peak_mem_mb']:.0f} MiB  loss {r['last_loss']:.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
