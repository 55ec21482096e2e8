#!/usr/bin/env python3
"""The GPT of tools/gpt.c in PyTorch, timed the way `nabla train` times itself.

Same model (token and position embeddings, pre-norm blocks with causal
self-attention and a tanh-GELU MLP, biases on every linear, tied head), same
optimizer (AdamW, betas 0.9/0.99, eps 1e-8, decay 0.1 on weights only,
global-norm clipping at 1.0), the same initialisation (qkv and the MLP's
first layer at normal(0, 1/sqrt(dim)), the residual projections at that
over sqrt(2 layers), embeddings at 0.02) and the same per-step host read of
the loss. --precision f32 (TF32 off: nabla's f32 GEMMs are exact f32) or
bf16 (torch.autocast to bf16 around the forward, f32 weights, the fused
AdamW, as nabla train --precision bf16). --model gpt2: GPT-2 small's preset
(12 layers, 12 heads, width 768, context 1024, vocabulary 50304, batch 16).
Prints tokens/s and peak memory for eager and torch.compile:

  python3 bench/train_torch.py --layers 6 --heads 6 --dim 384 --context 256 \
      --batch 64 --vocab 96 --steps 200
  python3 bench/train_torch.py --model gpt2 --precision bf16 --steps 50
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
        std = 1.0 / math.sqrt(dim)
        res_std = std / math.sqrt(2 * layers)
        for lin, std in ((self.qkv, std), (self.proj, res_std), (self.fc, std), (self.out, res_std)):
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


def make_optimizer(model, lr, fused):
    decay = [p for n, p in model.named_parameters() if n.endswith(".weight") and p.ndim == 2]
    ids = {id(p) for p in decay}
    plain = [p for p in model.parameters() if id(p) not in ids]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": plain, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-8, fused=fused)


def time_training(a, compiled):
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = GPT(a.vocab, a.context, a.layers, a.heads, a.dim).to(dev)
    bf16 = a.precision == "bf16"
    opt = make_optimizer(model, a.lr, fused=bf16)
    step_model = torch.compile(model) if compiled else model
    # Rotating random batches, made up front: the timed loop is the step alone.
    batches = [torch.randint(0, a.vocab, (a.batch, a.context + 1), device=dev) for _ in range(8)]

    def step(i):
        seq = batches[i % len(batches)]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=bf16):
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
    return {"mode": "compile" if compiled else "eager", "precision": a.precision,
            "tokens_per_s": a.steps * a.batch * a.context / sec,
            "ms_per_step": 1e3 * sec / a.steps, "params": params, "last_loss": last,
            "peak_mem_mb": torch.cuda.max_memory_allocated() / 2**20}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = {"layers": 6, "heads": 6, "dim": 384, "context": 256, "batch": 64, "vocab": 96,
                "steps": 200, "warmup": 20}
    gpt2 = {"layers": 12, "heads": 12, "dim": 768, "context": 1024, "batch": 16, "vocab": 50304}
    for name in defaults:
        p.add_argument("--" + name, type=int, default=None)
    p.add_argument("--lr", type=float, default=None, help="default 1e-3 (gpt2: 6e-4)")
    p.add_argument("--precision", choices=("f32", "bf16"), default="f32")
    p.add_argument("--model", choices=("gpt2",), help="GPT-2 small's preset (options given override it)")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    for name, default in defaults.items():
        if getattr(a, name) is None:
            setattr(a, name, gpt2.get(name, default) if a.model == "gpt2" else default)
    if a.lr is None:
        a.lr = 6e-4 if a.model == "gpt2" else 1e-3
    if not torch.cuda.is_available():
        sys.exit("train_torch.py: needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    results = []
    for compiled in (False,) if a.no_compile else (False, True):
        torch.cuda.reset_peak_memory_stats()
        r = time_training(a, compiled)
        results.append(r)
        print(f"torch {r['mode']:8s} {r['tokens_per_s']:10.0f} tokens/s  {a.precision}  {r['ms_per_step']:8.2f} ms/step  "
              f"{r['params']} params  peak {r['peak_mem_mb']:.0f} MiB  loss {r['last_loss']:.3f}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
