#!/usr/bin/env bash
# The GEMM schedules side by side: `nabla bench --only $ONLY` once per
# schedule, each in its own process (NABLA_AUTOTUNE_FORCE=NAME; "heuristic"
# forces nothing), then once with cuBLASLt (NABLA_GEMM=cublaslt; CUDA only,
# and only when ONLY selects matmul cases). Separate processes with device
# events and rotated inputs, so no run inherits another's clocks or caches.
# Prints one row per case: each schedule's median ms and, for matmul cases,
# cuBLASLt's time divided by it (>1: faster); for FP8 cases (scaled_mm: the
# own kernel's FP8 instantiations have the same schedules, forced by the
# same names) the first schedule's time divided by it (torch._scaled_mm is
# timed by bench/compare_torch.py).
#   scripts/gemm-compare.sh [BUILD_DIR] [SCHEDULES] [DEVICE]
#   e.g. scripts/gemm-compare.sh build-gpu heuristic,data-parallel,cluster2
#        ONLY=scaled_mm scripts/gemm-compare.sh build-gpu heuristic,stream-k,cluster2,cta-per-tile
# ONLY: the bench's --only list (default matmul; e.g. matmul,scaled_mm).
# QUICK=1 passes --quick to the bench, WARMUP=S --warmup S (1 or more: every
# case timed at the GPU's power-limited steady clock, bench/README.md).
# Files: $OUT/gemm-<schedule>.json/.log
# ('/' in a name becomes '_').
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
SCHEDULES=${2:-heuristic,data-parallel,cluster2}
DEVICE=${3:-cuda}
OUT=${OUT:-$PWD/out}
ONLY=${ONLY:-matmul}
mkdir -p "$OUT"
bench() { # bench NAME ENV...: one run into $OUT/gemm-NAME.json
  local name=$1 file=${1//\//_}; shift
  env "$@" "$BUILD/nabla" bench --device "$DEVICE" --only "$ONLY" ${QUICK:+--quick} ${WARMUP:+--warmup "$WARMUP"} \
    --json "$OUT/gemm-$file.json" >"$OUT/gemm-$file.log" 2>&1 ||
    { echo "gemm-compare: $name failed:" >&2; tail -5 "$OUT/gemm-$file.log" >&2; exit 1; }
}
IFS=, read -r -a names <<<"$SCHEDULES"
for n in "${names[@]}"; do
  if [ "$n" = heuristic ]; then bench "$n" -u NABLA_AUTOTUNE_FORCE
  else bench "$n" NABLA_AUTOTUNE_FORCE="$n"; fi
done
ref=""
if [ "$DEVICE" != cpu ] && [[ ",$ONLY," == *,matmul* ]]; then
  bench cublaslt -u NABLA_AUTOTUNE_FORCE NABLA_GEMM=cublaslt; ref=cublaslt
fi
python3 - "$OUT" "$ref" "${names[@]}" <<'PY'
import json, sys
out, ref, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(n):
    d = json.load(open(f"{out}/gemm-{n.replace('/', '_')}.json"))
    return d, {c["id"]: c.get("ms_median") for c in d["cases"] if c["id"].startswith(("matmul", "scaled_mm"))}
meta, _ = load(names[0])
runs = {n: load(n)[1] for n in names + ([ref] if ref else [])}
print(f"# GEMM schedules on {meta['device_name']} ({meta['date']}, commit {str(meta['git_commit'])[:7]}); median ms"
      + (f", and {ref}/schedule (matmul)" if ref else "") + f"; scaled_mm: {names[0]}/schedule")
head = "| case | " + " | ".join(names + ([ref] if ref else [])) + " |"
print(head)
print("|" + "---|" * (head.count("|") - 1))
for case in runs[names[0]]:
    cells = []
    fp8 = case.startswith("scaled_mm")  # no cuBLASLt run: relative to the first schedule
    for n in names:
        ms = runs[n].get(case)
        r = runs[names[0]].get(case) if fp8 else runs[ref].get(case) if ref else None
        cells.append("-" if ms is None else f"{ms:.4f}" + (f" ({r / ms:.3f})" if r and ms else ""))
    if ref:
        r = runs[ref].get(case)
        cells.append("-" if r is None else f"{r:.4f}")
    print(f"| {case} | " + " | ".join(cells) + " |")
PY
