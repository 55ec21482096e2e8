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

Here each case runs alternately in nabla (`nabla bench --only ID`, its own
process) and in torch (this one, the case rebuilt by compare_torch.Case),
each side warmed up by back-to-back runs for --warmup seconds right after the
other side's timed runs, so both start from a GPU at full load. For each
side it prints the median ms of the timed runs (CUDA events around each,
inputs rotated as nabla does), the SM clock (torch: the median of NVML
samples every 10 ms over the timed runs; nabla: its bench's reading), the
mean power over the timed runs (NVML's energy counter) and the energy per
run, then each case's ratio torch / nabla over the medians of the rounds.

    python3 bench/steady_compare.py build/nabla attention_fwd:4x16x4096x128:bf16 ...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_torch import Case, GpuState, n_sets_for  # noqa: E402


class ClockSampler:
    """NVML's SM clock every 10 ms while running (empty without NVML)."""

    def __init__(self, gpu):
        self.gpu, self.on, self.got = gpu, False, []
        self.thread = None

    def start(self):
        self.on, self.got = True, []
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self):
        while self.on:
            m = self.gpu.sm_mhz()
            if m:
                self.got.append(m)
            time.sleep(0.01)

    def stop(self):
        self.on = False
        self.thread.join()
        return statistics.median(self.got) if self.got else None


def nabla_side(nabla, case_id, warmup, seconds):
    """nabla's bench on one case: its JSON entry (ms_median, sm_mhz, watts)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        subprocess.run([nabla, "bench", "--device", "cuda", "--only", case_id, "--warmup", str(warmup),
                        "--seconds", str(seconds), "--json", path], check=True, capture_output=True)
        with open(path) as f:
            doc = json.load(f)
    finally:
        os.unlink(path)
    spec = doc["cases"][0]
    if spec.get("status") != "ok":
        raise RuntimeError("nabla bench %s: %s" % (case_id, spec.get("error")))
    return spec, doc.get("rotate_bytes", 256 << 20)


def torch_side(spec, rotate_bytes, warmup, seconds, gpu):
    """The case in torch eager: back-to-back runs for warmup seconds (a
    synchronisation every 50 ms of them), then timed runs filling about
    seconds (at most 500, as nabla's bench), each between its own events, read at the end."""
    dev = torch.device("cuda")
    case = Case(spec, dev, None)
    sets = [case.make_set() for _ in range(n_sets_for(spec, rotate_bytes))]
    run, _ = case.bodies()
    i, batch, t0 = 0, 1, time.perf_counter()
    while time.perf_counter() - t0 < warmup:
        a = time.perf_counter()
        for _ in range(batch):
            run(sets[i % len(sets)])
            i += 1
        torch.cuda.synchronize()
        if time.perf_counter() - a < 0.05:
            batch *= 2
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(batch):
        run(sets[i % len(sets)])
        i += 1
    b.record()
    torch.cuda.synchronize()
    reps = max(10, min(500, int(seconds * 1e3 / max(a.elapsed_time(b) / batch, 1e-3))))
    sampler = ClockSampler(gpu)
    sampler.start()
    e0, w0 = gpu.energy_mj(), time.perf_counter()
    marks = []
    for _ in range(reps):
        x = torch.cuda.Event(enable_timing=True)
        x.record()
        run(sets[i % len(sets)])
        i += 1
        y = torch.cuda.Event(enable_timing=True)
        y.record()
        marks.append((x, y))
    torch.cuda.synchronize()
    e1, w1 = gpu.energy_mj(), time.perf_counter()
    mhz = sampler.stop()
    watts = (e1 - e0) / 1e3 / (w1 - w0) if None not in (e0, e1) else None
    return {"ms_median": statistics.median(x.elapsed_time(y) for x, y in marks), "sm_mhz": mhz, "watts": watts}


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
    gpu = GpuState(torch.device("cuda"))
    print("torch %s on %s; per run: median ms, SM clock, mean W, energy" % (
        torch.__version__, torch.cuda.get_device_name()))
    rows = []
    for cid in o.ids:
        nab, tor = [], []
        for r in range(o.rounds):
            spec, rotate = nabla_side(o.nabla, cid, o.warmup, o.seconds)
            nab.append(spec)
            tor.append(torch_side(spec, rotate, o.warmup, o.seconds, gpu))
            print("%-46s round %d  nabla %s | torch %s" % (cid, r + 1, fmt(nab[-1]), fmt(tor[-1])), flush=True)
        n = statistics.median(s["ms_median"] for s in nab)
        t = statistics.median(s["ms_median"] for s in tor)
        rows.append((cid, n, t, t / n))
        print("%-46s nabla %.4f  torch %.4f  torch/nabla %.3f" % (cid, n, t, t / n), flush=True)
    if o.md:
        with open(o.md, "w") as f:
            f.write("| case | nabla ms | torch eager ms | torch / nabla |\n|---|--:|--:|--:|\n")
            for cid, n, t, x in rows:
                f.write("| %s | %.4f | %.4f | %.3f |\n" % (cid, n, t, x))
    return 0


if __name__ == "__main__":
    sys.exit(main())
