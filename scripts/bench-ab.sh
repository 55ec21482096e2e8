#!/usr/bin/env bash
# Two builds' benchmarks in one run: `nabla bench` of build A, then of
# build B, alternating ROUNDS times (default 3), each in its own process, so
# both see the same machine, clocks and temperature. Prints, per case, each
# build's median of the rounds' medians with the rounds' spread (min-max),
# and B/A (> 1: B is slower) — "within run-to-run noise" means B/A inside
# the spreads.
#   scripts/bench-ab.sh NABLA_A NABLA_B [DEVICE] [ONLY] [ROUNDS]
#   e.g. scripts/bench-ab.sh /tmp/old/nabla build-gpu/nabla cuda gelu,softmax,layer_norm 3
# Files: $OUT/ab-{a,b}-ROUND.json and .log.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 NABLA_A NABLA_B [DEVICE] [ONLY] [ROUNDS]" >&2
  exit 2
fi
A=$1 B=$2 DEVICE=${3:-cuda} ONLY=${4:-} ROUNDS=${5:-3}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
for r in $(seq 1 "$ROUNDS"); do
  for side in a b; do
    bin=$A
    [ "$side" = b ] && bin=$B
    "$bin" bench --device "$DEVICE" ${ONLY:+--only "$ONLY"} ${QUICK:+--quick} \
      --json "$OUT/ab-$side-$r.json" >"$OUT/ab-$side-$r.log" 2>&1 ||
      { echo "bench-ab: $side ($bin) round $r failed:" >&2; tail -5 "$OUT/ab-$side-$r.log" >&2; exit 1; }
  done
done
python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import json, statistics, sys
out, rounds, a_bin, b_bin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def load(side):
    runs = [json.load(open(f"{out}/ab-{side}-{r}.json")) for r in range(1, rounds + 1)]
    cases = {}
    for d in runs:
        for c in d["cases"]:
            if c.get("ms_median"):
                cases.setdefault(c["id"], []).append(c["ms_median"])
    return runs[0], cases
meta, a = load("a")
_, b = load("b")
print(f"# A/B on {meta['device_name']} ({meta['date']}), {rounds} alternating rounds; median ms (min-max)")
print(f"A: {a_bin}\nB: {b_bin}\n")
print("| case | A ms | A spread | B ms | B spread | B/A |")
print("|---|--:|--:|--:|--:|--:|")
for cid in a:
    if cid not in b:
        continue
    am, bm = statistics.median(a[cid]), statistics.median(b[cid])
    print(f"| {cid} | {am:.4f} | {min(a[cid]):.4f}-{max(a[cid]):.4f} | {bm:.4f} | "
          f"{min(b[cid]):.4f}-{max(b[cid]):.4f} | {bm / am:.3f} |")
PY
