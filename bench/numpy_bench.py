#!/usr/bin/env python3
"""numpy baseline for bench/bench_cpu.c: the same cases, timed the same way.

    /usr/bin/python3 bench/numpy_bench.py [--json FILE] [--quick]

Cases: f32 matmul at 512, 1024, 2048 (2*n^3 flops); batched f32 matmul
64 x (64x64 @ 64x16 -> 64x64) as in attention; a + b over 2^25 f32 (3*4*n
bytes), once allocating the result (a + b) and once into a preallocated
array (np.add(a, b, out=c)). Each is the median of several runs after
warm-up. Prints which BLAS library numpy called (from /proc/self/maps, and
threadpoolctl when it is installed).
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def blas_in_use():
    """Names the BLAS shared objects mapped into this process."""
    libs = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                base = os.path.basename(path)
                if "blas" in base.lower() or "mkl" in base.lower():
                    real = os.path.realpath(path)
                    libs.add(path if real == path else f"{path} -> {real}")
    except OSError:
        pass
    info = {"mapped": sorted(libs)}
    try:
        from threadpoolctl import threadpool_info
        info["threadpoolctl"] = [
            {k: d.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
            for d in threadpool_info() if d.get("user_api") == "blas"]
    except ImportError:
        info["threadpoolctl"] = "not installed"
    return info


def median_time(fn, warm, runs, budget=None):
    """Median seconds of fn() over runs calls after warm calls; stops early
    (at least 3 runs) once budget seconds are spent, for slow BLAS."""
    for _ in range(warm):
        fn()
    times = []
    start = time.perf_counter()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if budget and len(times) >= 3 and time.perf_counter() - start > budget:
            break
    return statistics.median(times), len(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    results = []

    def report(name, secs, n, work, unit):
        rate = work / secs * 1e-9
        results.append({"name": name, "seconds": secs, "rate": rate, "unit": unit, "runs": n})
        print(f"{name:<26} {secs * 1e3:10.3f} ms {rate:9.1f} {unit}  ({n} runs)")

    # One warm matmul first so that the BLAS library is loaded and mapped.
    x = rng.standard_normal((64, 64), dtype=np.float32)
    x @ x
    blas = blas_in_use()
    print(f"numpy {np.__version__}, python {sys.version.split()[0]}")
    print(f"BLAS: {json.dumps(blas)}")
    print(f"env: OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')} cpus={os.cpu_count()}")

    for n, runs in ((512, 15), (1024, 9), (2048, 5)):
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        secs, k = median_time(lambda: a @ b, 2, 3 if args.quick else runs, budget=20)
        report(f"matmul {n}", secs, k, 2.0 * n ** 3, "GFLOP/s")

    a = rng.standard_normal((64, 64, 16), dtype=np.float32)
    b = rng.standard_normal((64, 16, 64), dtype=np.float32)
    secs, k = median_time(lambda: a @ b, 2, 5 if args.quick else 31)
    report("matmul 64x(64x64x16)", secs, k, 2.0 * 64 * 64 * 64 * 16, "GFLOP/s")

    n = 1 << 25
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    c = np.empty_like(a)
    runs = 3 if args.quick else 9
    secs, k = median_time(lambda: a + b, 2, runs)
    report(f"add f32 n={n} (alloc)", secs, k, 12.0 * n, "GB/s")
    secs, k = median_time(lambda: np.add(a, b, out=c), 2, runs)
    report(f"add f32 n={n} (out=)", secs, k, 12.0 * n, "GB/s")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"library": "numpy", "version": np.__version__, "blas": blas,
                       "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
