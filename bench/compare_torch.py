#!/usr/bin/env python3
"""Runs nabla's benchmark cases through PyTorch eager and torch.compile.

Reads the JSON that `nabla bench --json FILE` wrote (run just before, on the
same GPU), rebuilds every case at the same shapes, dtypes and layouts in
PyTorch, times it the same way (CUDA events around each run, warm-up, the
median of many runs, inputs rotated over the same number of sets so the L2
cache does not serve them) and prints

    case | nabla | eager | compile | nabla/eager | nabla/compile

where the three timings are medians in ms and the ratios are throughput
ratios (torch time / nabla time): above 1 means nabla is faster. On CUDA
the note says the SM clock and mean power of nabla's timed runs (from its
JSON) and of eager torch's (NVML, read here): a GPU at its power limit
runs heavy kernels below its boost clock, and two timings compare only
when both ran in the same state.

The adamw case compares with torch.optim.AdamW: 'eager' is the default
multi-tensor (foreach) implementation, 'compile' is the fused CUDA kernel
(fused=True), the reference for 'PyTorch fused AdamW'.

Needs only torch (and triton, which torch.compile uses on CUDA).

    python3 bench/compare_torch.py bench/results/nabla.json --md out.md
"""
import argparse
import gc
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"f64": torch.float64, "f32": torch.float32, "f16": torch.float16,
          "bf16": torch.bfloat16}
MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB


# ---- timing -------------------------------------------------------------
class Timer:
    """Device events on CUDA, the host clock on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def ms(self, a, b):
        if self.cuda:
            return a.elapsed_time(b)
        return 1e3 * (b - a)


class GpuState:
    """The GPU's SM clock and mean power while a case's timed runs execute,
    through NVML (the driver's libnvidia-ml, by ctypes: no package needed);
    every method returns None where NVML is missing. A heavy case on a GPU
    at its power limit runs at a lower clock than its boost: a torch time
    at the boost clock next to nabla's at the steady one is no comparison,
    and the table says which it was."""

    def __init__(self, device):
        self.nv = self.h = None
        if device.type != "cuda":
            return
        try:
            import ctypes
            nv = ctypes.CDLL("libnvidia-ml.so.1")
            h = ctypes.c_void_p()
            idx = device.index if device.index is not None else torch.cuda.current_device()
            if nv.nvmlInit_v2() != 0:
                return
            # the device by its PCI bus id, as nabla finds it (NVML numbers GPUs in PCI
            # order, CUDA by CUDA_DEVICE_ORDER and CUDA_VISIBLE_DEVICES); by index only
            # where both see one GPU
            p = torch.cuda.get_device_properties(idx)
            found = False
            if hasattr(p, "pci_bus_id") and hasattr(p, "pci_device_id"):
                bus = "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id, p.pci_device_id)
                found = nv.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(h)) == 0
            n = ctypes.c_uint()
            if not found and torch.cuda.device_count() == 1 and \
                    nv.nvmlDeviceGetCount_v2(ctypes.byref(n)) == 0 and n.value == 1:
                found = nv.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)) == 0
            if found:
                self.nv, self.h, self.ct = nv, h, ctypes
        except (OSError, AttributeError, RuntimeError):  # no NVML, or no such device
            pass

    def energy_mj(self):
        if not self.nv:
            return None
        e = self.ct.c_ulonglong()
        return e.value if self.nv.nvmlDeviceGetTotalEnergyConsumption(self.h, self.ct.byref(e)) == 0 else None

    def sm_mhz(self):
        if not self.nv:
            return None
        c = self.ct.c_uint()
        return c.value if self.nv.nvmlDeviceGetClockInfo(self.h, 1, self.ct.byref(c)) == 0 else None


def do_bench(run, sets, timer, opts):
    """Median ms of run(set) over rotated sets, the runs, and the GPU's
    state over them (GpuState: SM MHz, mean W, seconds; None without NVML):
    warm-up (at least two runs unless one is slow, then until warm_ms of
    device time), then as many timed runs as fill target_ms, clamped to
    [min_reps, max_reps], each between its own events, read only after all
    are queued.

    The warm-up runs back to back in batches (doubling while a batch takes
    under 50 ms), synchronising only between batches, so that the GPU works
    without gaps, as in nabla's bench (whose host overhead between runs is
    microseconds). A long kernel holds an H100 at its power limit, and its
    clock there depends on the load before the timed runs: with a
    synchronisation after every warm-up run (Python, events and the wait
    between runs) torch SDPA's forward at B4 H16 N4096 D128 timed 0.82 ms
    at 1980 MHz, and 0.95 ms at 1515-1560 MHz over three seconds of
    back-to-back runs (bench/results/h100-2026-11-25-session22.md)."""
    i, spent, est, runs, batch = 0, 0.0, 0.0, 0, 1
    while True:
        a = timer.mark()
        for _ in range(batch):
            run(sets[i % len(sets)])
            i += 1
        b = timer.mark()
        timer.sync()
        t = timer.ms(a, b)
        est = t / batch
        spent += t
        runs += batch
        if not (runs < 100000 and (spent < opts.warm_ms or (runs < 2 and est < 1000.0))):
            break
        if t < 50.0:
            batch *= 2
    reps = int(math.ceil(opts.target_ms / max(est, 1e-4)))
    reps = max(opts.min_reps, min(opts.max_reps, reps))
    marks, gpu = [], opts.gpu
    e0, t0 = gpu.energy_mj(), time.perf_counter()
    for _ in range(reps):
        a = timer.mark()
        run(sets[i % len(sets)])
        marks.append((a, timer.mark()))
        i += 1
    mhz = gpu.sm_mhz()  # while the queued runs execute
    timer.sync()
    e1, t = gpu.energy_mj(), time.perf_counter() - t0
    state = None if None in (mhz, e0, e1) else (mhz, (e1 - e0) / 1e3 / t, t)
    return statistics.median(timer.ms(a, b) for a, b in marks), reps, state


# ---- the cases ----------------------------------------------------------
def randn(shape, dtype, device, std=1.0, grad=False):
    t = torch.randn(shape, dtype=torch.float32, device=device).mul_(std).to(dtype)
    return t.requires_grad_(grad)


def gpt_param_shapes(vocab, layers, d, ctx):
    """The GPT-2 parameter list nabla's adamw case builds (same order)."""
    shapes = [(vocab, d), (ctx, d)]
    for _ in range(layers):
        shapes += [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,),
                   (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    return shapes + [(d,), (d,)]


class Case:
    """One benchmark case rebuilt in PyTorch: its input sets, and the eager
    and compiled bodies of one run (each takes a set)."""

    def __init__(self, spec, device, compile_mode):
        self.spec = spec
        self.device = device
        self.dt = DTYPES[spec["dtype"]]
        self.dims = spec["dims"]
        self.family = spec["family"]
        self.compile_mode = compile_mode
        self.deterministic = self.family == "embedding_fwdbwd"
        self.eager_label = self.compile_label = None

    def compiled(self, fn):
        return torch.compile(fn, dynamic=False, mode=self.compile_mode)

    def make_set(self):
        d, dt, dev = self.dims, self.dt, self.device
        f = self.family
        if f == "copy":
            return (randn(d, dt, dev), torch.empty(d, dtype=dt, device=dev))
        if f == "add":
            return (randn(d, dt, dev), randn(d, dt, dev))
        if f in ("gelu_tanh", "softmax_fwd"):
            return (randn(d, dt, dev, 2.0),)
        if f.startswith("layer_norm"):
            g = f.endswith("fwdbwd")
            w = torch.empty(d[1], device=dev).uniform_(0.5, 1.5).to(dt).requires_grad_(g)
            sets = (randn(d, dt, dev, grad=g), w, randn(d[1], dt, dev, 0.1, grad=g))
            return sets + ((randn(d, dt, dev),) if g else ())
        if f == "cross_entropy_fwdbwd":
            return (randn(d, dt, dev, 2.0, grad=True),
                    torch.randint(0, d[1], (d[0],), device=dev))
        if f == "embedding_fwdbwd":
            v, c, t = d
            return (randn((v, c), dt, dev, 0.02, grad=True),
                    torch.randint(0, v, (t,), device=dev), randn((t, c), dt, dev))
        if f == "adamw":
            return self.make_adamw_set()
        if f == "matmul":
            return self.make_matmul_set()
        if f.startswith("matmul_bias_gelu"):
            return self.make_matmul_set() + (randn(self.dims[1], self.dt, self.device),)
        if f == "scaled_mm":  # e4m3 a (M, K), b = w^T for w (N, K), f32 scales, as nabla's
            m, n, k = d
            a = randn((m, k), dt, dev).to(torch.float8_e4m3fn)
            w = randn((n, k), dt, dev).to(torch.float8_e4m3fn)
            return (a, w.t(), torch.tensor(0.5, device=dev), torch.tensor(0.25, device=dev))
        if f.startswith("attention"):  # q, k, v (B, H, N, D); fwdbwd: and dout
            g = f == "attention_fwdbwd"
            return tuple(randn(d, dt, dev, grad=g) for _ in range(3)) + \
                ((randn(d, dt, dev),) if g else ())
        raise ValueError("unknown case family " + f)

    def make_matmul_set(self):
        m, n, k = self.dims
        lay = self.spec["layout"] or "NN"
        a = randn((k, m) if lay[0] == "T" else (m, k), self.dt, self.device)
        b = randn((n, k) if lay[1] == "T" else (k, n), self.dt, self.device)
        return (a.t() if lay[0] == "T" else a, b.t() if lay[1] == "T" else b)

    def make_adamw_set(self):
        params = []
        for shape in gpt_param_shapes(*self.dims):
            p = randn(shape, self.dt, self.device, 0.02, grad=True)
            p.grad = randn(shape, self.dt, self.device, 1e-3)
            params.append(p)
        hp = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        foreach = torch.optim.AdamW(params, foreach=True, **hp)
        fused = torch.optim.AdamW(params, fused=True, **hp) if self.device.type == "cuda" \
            else None
        return (params, foreach, fused)

    def bodies(self):
        """(eager, compiled) callables of one set; compiled may be None."""
        f = self.family
        if f == "adamw":
            self.eager_label, self.compile_label = "AdamW foreach", "AdamW fused"
            fused = (lambda s: s[2].step()) if self.device.type == "cuda" else None
            return (lambda s: s[1].step()), fused
        # nabla's "causal_nd" rows (its nondeterministic backward) map to the causal call
        causal = (self.spec.get("layout") or "").startswith("causal")
        fwd = {
            "copy": lambda src, dst: dst.copy_(src),
            "add": lambda a, b: a + b,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
            "softmax_fwd": lambda x: torch.softmax(x, -1),
            "layer_norm_fwd": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
            "layer_norm_fwdbwd": lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
            "cross_entropy_fwdbwd": lambda z, t: F.cross_entropy(z, t),
            "embedding_fwdbwd": lambda w, i: F.embedding(i, w),
            "matmul": lambda a, b: a @ b,
            # per-tensor scales, bf16 out; use_fast_accum=True: the wgmma accumulates over
            # the whole K, as nabla's kernel does (torch's default promotes partial sums)
            "scaled_mm": lambda a, b, sa, sb: torch._scaled_mm(
                a, b, scale_a=sa, scale_b=sb, out_dtype=self.dt, use_fast_accum=True),
            # x @ W.T + b, then GELU: both nabla cases (fused and unfused) compare with it
            "matmul_bias_gelu": lambda x, wt, b: F.gelu(x @ wt + b, approximate="tanh"),
            "matmul_bias_gelu_unfused":
                lambda x, wt, b: F.gelu(x @ wt + b, approximate="tanh"),
            # torch picks its flash or cuDNN backend; is_causal aligns top-left, as nabla does
            "attention_fwd": lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal),
            "attention_fwdbwd": lambda q, k, v: F.scaled_dot_product_attention(
                q, k, v, is_causal=causal),
        }[f]
        return self.wrap(fwd), self.wrap(self.compiled(fwd))

    def wrap(self, fwd):
        """One run: the forward, and for fwd+bwd cases the gradients of the
        leaves with the case's given output gradient."""
        f = self.family
        if f == "layer_norm_fwdbwd":
            return lambda s: torch.autograd.grad(fwd(s[0], s[1], s[2]), s[:3], s[3])
        if f == "cross_entropy_fwdbwd":
            return lambda s: torch.autograd.grad(fwd(s[0], s[1]), (s[0],))
        if f == "embedding_fwdbwd":
            return lambda s: torch.autograd.grad(fwd(s[0], s[1]), (s[0],), s[2])
        if f == "attention_fwdbwd":
            return lambda s: torch.autograd.grad(fwd(s[0], s[1], s[2]), s[:3], s[3])
        return lambda s: fwd(*s)


def n_sets_for(spec, rotate_bytes):
    """nabla's rule, for JSON that lacks 'sets'."""
    if spec.get("sets"):
        return int(spec["sets"])
    sb = float(spec.get("set_bytes") or 1.0)
    if sb >= GIB:
        return 1
    return int(max(2, min(64, math.ceil(rotate_bytes / sb))))


def run_case(spec, device, opts, rotate_bytes):
    """Returns (eager_ms, compile_ms, eager_label, compile_label, error,
    the GPU's state over eager's timed runs: do_bench's)."""
    case = Case(spec, device, opts.compile_mode)
    torch._dynamo.reset()  # a fresh cache: no recompile limits across cases
    if case.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    timer = Timer(device)
    res = [None, None, None, None, None, None]
    try:
        sets = [case.make_set() for _ in range(n_sets_for(spec, rotate_bytes))]
        eager, comp = case.bodies()
        res[2], res[3] = case.eager_label, case.compile_label
        res[0], _, res[5] = do_bench(eager, sets, timer, opts)
        if comp is not None and not opts.no_compile:
            res[1], _, _ = do_bench(comp, sets, timer, opts)
    except Exception as e:  # out of memory, a compile failure: report it, go on

        lines = str(e).strip().splitlines()
        res[4] = "%s: %s" % (type(e).__name__, lines[0][:200] if lines else "")
    finally:
        if case.deterministic:
            torch.use_deterministic_algorithms(False)
        sets = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return res


# ---- report -------------------------------------------------------------
def fmt_ms(v):
    return "-" if v is None else "%.4f" % v


def fmt_ratio(torch_ms, nabla_ms):
    if torch_ms is None or nabla_ms is None or nabla_ms <= 0:
        return "-"
    return "%.2f" % (torch_ms / nabla_ms)


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nabla_json", help="the file `nabla bench --json` wrote")
    ap.add_argument("--md", help="also write the table as markdown to this file")
    ap.add_argument("--json-out", help="write torch's timings as JSON to this file")
    ap.add_argument("--only", help="comma-separated case families (prefix) or ids")
    ap.add_argument("--quick", action="store_true", help="fewer runs per case")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode (default: the default mode, no CUDA graphs)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 in f32 matmuls")
    opts = ap.parse_args()
    with open(opts.nabla_json) as fh:
        nab = json.load(fh)
    # warm-up and timed runs as long as nabla's (its --warmup and --seconds):
    # a GPU's clock falls to its power-limited steady value within about a
    # second of full load, so both sides must be timed in the same state
    def nab_ms(key, default):
        v = nab.get(key)
        return float(default if v is None else v)
    opts.warm_ms = 20.0 if opts.quick else nab_ms("warm_ms", 100.0)
    opts.target_ms = 100.0 if opts.quick else nab_ms("target_ms", 500.0)
    opts.min_reps = 3 if opts.quick else 10
    opts.max_reps = 50 if opts.quick else 500
    device = torch.device(nab.get("device") or "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("compare_torch: nabla ran on %s but torch sees no CUDA device" % device,
              file=sys.stderr)
        return 2
    opts.gpu = GpuState(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        name = torch.cuda.get_device_name(device)
        if nab.get("device_name") not in (None, "", name, str(device), nab.get("device")):
            print("compare_torch: warning: nabla ran on '%s', torch runs on '%s'"
                  % (nab["device_name"], name), file=sys.stderr)
    else:
        name = nab.get("device_name") or "cpu"
    torch.backends.cuda.matmul.allow_tf32 = opts.tf32
    torch.backends.cudnn.allow_tf32 = opts.tf32
    torch.manual_seed(1234)
    rotate_bytes = float(nab.get("rotate_bytes") or 256 * MIB)

    only = [t for t in (opts.only or "").split(",") if t]
    cases = [c for c in nab["cases"]
             if not only or any(c["family"].startswith(t) or c["id"] == t or c["name"] == t
                                for t in only)]
    header = ["case", "shape", "dtype", "nabla ms", "eager ms", "compile ms", "nabla/eager",
              "nabla/compile", "note"]
    widths = [22, 18, 5, 10, 10, 10, 11, 13, 0]
    print("torch %s on %s (%s); nabla JSON from %s, commit %s" % (
        torch.__version__, device, name, nab.get("date"), nab.get("git_commit")))
    print("ratios are torch time / nabla time: > 1 means nabla is faster\n")
    print(" ".join(h.ljust(w) for h, w in zip(header, widths)))
    rows, out = [], []
    for spec in cases:
        nabla_ms = spec.get("ms_median") if spec.get("status") == "ok" else None
        e_ms, c_ms, e_lab, c_lab, err, state = run_case(spec, device, opts, rotate_bytes)
        note = spec.get("note") or ""
        if spec.get("sm_mhz"):  # nabla's state, from its JSON
            note += " [nabla at %d MHz%s]" % (spec["sm_mhz"], ", %.0f W" % spec["watts"]
                                              if spec.get("watts") is not None else "")
        if state:
            mhz, watts, secs = state
            note += " [eager at %d MHz, %.0f W" % (mhz, watts)
            if watts < 50.0 and secs >= 0.1:  # as nabla's rows say it (bench_report.c)
                note += ": NVML saw no power, the GPU did not throttle; not comparable with a " \
                        "timing at the power limit"
            note += "]"
        if e_lab:
            note += " (eager: %s, compile: %s)" % (e_lab, c_lab)
        if err:
            note += " [torch failed: %s]" % err
        if spec.get("status") != "ok":
            note += " [nabla: %s]" % (spec.get("error") or spec.get("status"))
        row = [spec["name"], spec["shape"], spec["dtype"], fmt_ms(nabla_ms), fmt_ms(e_ms),
               fmt_ms(c_ms), fmt_ratio(e_ms, nabla_ms), fmt_ratio(c_ms, nabla_ms), note]
        rows.append(row)
        out.append(dict(id=spec["id"], nabla_ms=nabla_ms, eager_ms=e_ms, compile_ms=c_ms,
                        eager=e_lab or "eager", compile=c_lab or "torch.compile", error=err,
                        eager_sm_mhz=state and state[0], eager_watts=state and state[1]))
        print(" ".join(str(v).ljust(w) for v, w in zip(row, widths)), flush=True)

    ge = geomean([r["eager_ms"] / r["nabla_ms"] for r in out if r["eager_ms"] and r["nabla_ms"]])
    gc_ = geomean([r["compile_ms"] / r["nabla_ms"] for r in out
                   if r["compile_ms"] and r["nabla_ms"]])
    summary = "geometric mean of throughput ratios: nabla/eager %s, nabla/compile %s" % (
        "-" if ge is None else "%.2f" % ge, "-" if gc_ is None else "%.2f" % gc_)
    print("\n" + summary)

    if opts.md:
        with open(opts.md, "w") as fh:
            fh.write("# nabla vs PyTorch on %s\n\n" % name)
            fh.write("nabla commit %s (bench run %s); torch %s; torch.compile mode %s; TF32 %s. "
                     "Medians of CUDA-event timings, inputs rotated past the L2 cache; "
                     "nabla's times include its per-op host overhead, as do eager torch's. "
                     "Ratios are torch time / nabla time: > 1 means nabla is faster.\n\n"
                     % (nab.get("git_commit"), nab.get("date"), torch.__version__,
                        opts.compile_mode or "default", "on" if opts.tf32 else "off"))
            fh.write("| " + " | ".join(header) + " |\n")
            fh.write("|---|---|---|--:|--:|--:|--:|--:|---|\n")
            for r in rows:
                fh.write("| " + " | ".join(str(v).replace("|", "/") for v in r) + " |\n")
            fh.write("\n" + summary + "\n")
    if opts.json_out:
        with open(opts.json_out, "w") as fh:
            json.dump(dict(device=str(device), device_name=name, torch=torch.__version__,
                           compile_mode=opts.compile_mode, tf32=opts.tf32, cases=out,
                           geomean_vs_eager=ge, geomean_vs_compile=gc_), fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
