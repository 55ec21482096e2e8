#!/usr/bin/env python3
"""nabla against PyTorch eager on heavy cases, both at the GPU's steady clock.

A long kernel (attention, a large GEMM) holds an H100 at its power limit, and
the clock it then runs at depends on how warm the chip is: a GPU that has
just idled for a few seconds (a process starting, inputs being made) draws
less power at a given clock and runs faster for a while. compare_torch.py
times torch after nabla's whole run, with pauses between cases, so its torch
timings of such cases can come from a cooler GPU than nabla's: on the H100,
torch SDPA's forward at B4 H16 N4096 D128 timed 0.82 ms at 1980 MHz there,
and 0.95 ms at 1515-1560 MHz when run as below.

Here each case runs alternately in nabla (`nabla bench --only ID
--no-ceilings`, its own process) and in torch (this one: the case rebuilt and timed by
compare_torch's Case and do_bench), for a number of rounds, each side warmed
up by back-to-back runs right after the other side's timed runs, so both
start from a GPU at full load. For each side and round it prints the median
ms of the timed runs (CUDA events around each, inputs rotated as nabla
does), the SM clock while they run, their mean power (NVML's energy counter)
and the energy per run; then each case's ratio torch / nabla over the
medians of the rounds.

    python3 bench/steady_compare.py build/nabla attention_fwd:4x16x4096x128:bf16 ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import Case, GpuState, Timer, do_bench, n_sets_for  # noqa: E402


def nabla_side(nabla, case_id, warmup, seconds):
    """nabla's bench on one case alone (--no-ceilings): its JSON entry
    (ms_median, sm_mhz, watts), picked by its id, and the bench's rotation
    bytes."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run([nabla, "bench", "--device", "cuda", "--only", case_id, "--no-ceilings", "--warmup",
                        str(warmup), "--seconds", str(seconds), "--json", path], check=True, capture_output=True)
        with open(path) as f:
            doc = json.load(f)
    finally:
        os.unlink(path)
    specs = [c for c in doc["cases"] if c.get("id") == case_id]
    if not specs:
        raise RuntimeError("nabla bench ran no case %s (nabla bench --list names them)" % case_id)
    if specs[0].get("status") != "ok":
        raise RuntimeError("nabla bench %s: %s" % (case_id, specs[0].get("error")))
    return specs[0], doc.get("rotate_bytes", 256 << 20)


def torch_side(spec, rotate_bytes, opts):
    """The case in torch eager, timed by compare_torch's do_bench."""
    case = Case(spec, torch.device("cuda"), None)
    sets = [case.make_set() for _ in range(n_sets_for(spec, rotate_bytes))]
    run, _ = case.bodies()
    ms, _, state = do_bench(run, sets, Timer(torch.device("cuda")), opts)
    mhz, watts = (state[0], state[1]) if state else (None, None)
    return {"ms_median": ms, "sm_mhz": mhz, "watts": watts}


def fmt(side):
    ms, mhz, w = side["ms_median"], side.get("sm_mhz"), side.get("watts")
    s = "%.4f ms" % ms
    s += " %4.0f MHz" % mhz if mhz else "    - MHz"
    s += " %3.0f W %.3f J" % (w, w * ms / 1e3) if w else "   - W     - J"
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nabla", help="the nabla executable")
    ap.add_argument("ids", nargs="+", help="nabla bench case ids (nabla bench --list)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of back-to-back runs first")
    ap.add_argument("--seconds", type=float, default=2.0, help="seconds of timed runs")
    ap.add_argument("--md", help="also write the table as markdown to this file")
    o = ap.parse_args()
    if not torch.cuda.is_available():
        print("steady_compare: needs a CUDA GPU")
        return 2
    opts = types.SimpleNamespace(warm_ms=1e3 * o.warmup, target_ms=1e3 * o.seconds, min_reps=10, max_reps=500,
                                 gpu=GpuState(torch.device("cuda")))
    print("torch %s on %s; per run: median ms, SM clock, mean W, energy" % (
        torch.__version__, torch.cuda.get_device_name()))
    rows, failed = [], 0
    for cid in o.ids:
        nab, tor = [], []
        try:
            for r in range(o.rounds):
                spec, rotate = nabla_side(o.nabla, cid, o.warmup, o.seconds)
                nab.append(spec)
                tor.append(torch_side(spec, rotate, opts))
                print("%-46s round %d  nabla %s | torch %s" % (cid, r + 1, fmt(nab[-1]), fmt(tor[-1])),
                      flush=True)
        except (RuntimeError, subprocess.CalledProcessError, torch.cuda.OutOfMemoryError) as e:
            print("%-46s failed: %s" % (cid, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__),
                  flush=True)
            failed = 1
            continue
        n = statistics.median(s["ms_median"] for s in nab)
        t = statistics.median(s["ms_median"] for s in tor)
        rows.append((cid, n, t, t / n))
        print("%-46s nabla %.4f  torch %.4f  torch/nabla %.3f" % (cid, n, t, t / n), flush=True)
    if o.md:
        with open(o.md, "w") as f:
            f.write("| case | nabla ms | torch eager ms | torch / nabla |\n|---|--:|--:|--:|\n")
            for cid, n, t, x in rows:
                f.write("| %s | %.4f | %.4f | %.3f |\n" % (cid, n, t, x))
    return failed


if __name__ == "__main__":
    sys.exit(main())
