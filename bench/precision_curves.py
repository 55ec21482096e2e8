#!/usr/bin/env python3
"""Convergence of `nabla train` in f32, bf16 and f16 (loss scaling) on the same
model, data and seed: the held-out loss every --eval-every steps of each run,
drawn as three curves in one SVG, and the final held-out losses with their
distance from f32 (issue 17's condition: within 2% after 2,000 steps).

  python3 bench/precision_curves.py --nabla build/nabla --data text.txt \
      --steps 2000 --svg out/precision.svg [-- extra nabla train options]

The three runs go to the device one after another (or at once with
--parallel: they then share the GPU, which changes their speed, not their
losses). Standard library only.
"""
import argparse
import re
import subprocess
import sys
import time

EVAL = re.compile(r"eval step (\d+): held-out loss ([0-9.eE+-]+|nan|inf)")
FINAL = re.compile(r"^held-out loss: ([0-9.eE+-]+|nan|inf)", re.M)
TPS = re.compile(r"^throughput: (\d+) tokens/s", re.M)
COLORS = {"f32": "#1f77b4", "bf16": "#d62728", "f16": "#2ca02c"}


def command(a, prec):
    return [a.nabla, "train", "--device", a.device, "--precision", prec, "--data", a.data,
            "--steps", str(a.steps), "--eval-every", str(a.eval_every), "--no-svg",
            "--log-every", str(a.steps), "--seed", str(a.seed)] + a.extra


def parse(prec, out, err):
    points = [(int(s), float(v)) for s, v in EVAL.findall(err)]
    final = FINAL.search(out)
    tps = TPS.search(out)
    if final:
        points.append((-1, float(final.group(1))))
    return {"precision": prec, "points": points, "final": float(final.group(1)) if final else None,
            "tokens_per_s": int(tps.group(1)) if tps else None}


def run_all(a):
    procs, results = {}, {}
    for prec in a.precisions:
        cmd = command(a, prec)
        print("$ " + " ".join(cmd), flush=True)
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             errors="replace")
        if a.parallel:
            procs[prec] = p
        else:
            out, err = p.communicate()
            if p.returncode:
                sys.exit(f"{prec}: nabla train exited {p.returncode}\n{err[-2000:]}")
            results[prec] = parse(prec, out, err)
    for prec, p in procs.items():
        out, err = p.communicate()
        if p.returncode:
            sys.exit(f"{prec}: nabla train exited {p.returncode}\n{err[-2000:]}")
        results[prec] = parse(prec, out, err)
    return results


def svg(results, steps, title):
    W, H, L, R, T, B = 720, 420, 70, 130, 40, 50
    pts = [(s if s >= 0 else steps, v) for r in results.values() for s, v in r["points"]]
    ys = [v for _, v in pts if v == v and v not in (float("inf"),)]
    lo, hi = min(ys), max(ys)
    pad = 0.05 * (hi - lo or 1)
    lo, hi = lo - pad, hi + pad

    def px(x):
        return L + x / steps * (W - L - R)

    def py(v):
        return H - B - (v - lo) / (hi - lo) * (H - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
           f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
           f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">step</text>',
           f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
           f'text-anchor="middle">held-out loss</text>']
    for i in range(6):
        x = steps * i / 5
        v = lo + (hi - lo) * i / 5
        out.append(f'<text x="{px(x):.1f}" y="{H - B + 16}" text-anchor="middle">{x:.0f}</text>')
        out.append(f'<text x="{L - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3f}</text>')
        out.append(f'<line x1="{L}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" '
                   f'stroke="#ddd"/>')
    for k, (prec, r) in enumerate(results.items()):
        c = COLORS.get(prec, "black")
        line = " ".join(f"{px(s if s >= 0 else steps):.1f},{py(v):.1f}" for s, v in r["points"]
                        if v == v)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.8" points="{line}"/>')
        fin = f'{r["final"]:.4f}' if r["final"] is not None else "?"
        out.append(f'<line x1="{W - R + 10}" y1="{T + 20 * k}" x2="{W - R + 30}" '
                   f'y2="{T + 20 * k}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{W - R + 36}" y="{T + 20 * k + 4}">{prec} {fin}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nabla", default="build/nabla")
    p.add_argument("--data", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--precisions", default="f32,bf16,f16")
    p.add_argument("--parallel", action="store_true")
    p.add_argument("--svg", required=True)
    p.add_argument("extra", nargs="*", help="more nabla train options (after --)")
    a = p.parse_args()
    a.precisions = a.precisions.split(",")
    t0 = time.time()
    results = run_all(a)
    with open(a.svg, "w") as f:
        f.write(svg(results, a.steps, f"nabla train, {a.steps} steps: held-out loss by precision"))
    ref = results.get("f32", {}).get("final")
    worst = 0.0
    for prec, r in results.items():
        rel = (r["final"] / ref - 1) if ref and r["final"] is not None else float("nan")
        if prec != "f32":
            worst = max(worst, abs(rel)) if rel == rel else float("inf")
        print(f"precision {prec:5s} held-out {r['final']}  ({100 * rel:+.2f}% vs f32)  "
              f"{r['tokens_per_s']} tokens/s")
    print(f"precision curves: {a.svg}; largest distance from f32 {100 * worst:.2f}% "
          f"({'within' if worst <= 0.02 else 'NOT within'} 2%); {time.time() - t0:.0f} s")
    return 0 if worst <= 0.02 else 1


if __name__ == "__main__":
    sys.exit(main())
