#!/usr/bin/env bash
# The own sm_90a GEMM's check on a Hopper machine, from the repository root:
# build (90a only), SASS counts of the kernel (HGMMA, stmatrix, TMA stores,
# local memory), the matmul benchmarks with the own kernel and cuBLASLt in
# the same run, the PyTorch comparison of the fused bias+GELU case, the GEMM
# test section, and compute-sanitizer (memcheck, racecheck) on it.
#   STEPS=build,sass,bench,torch,test,sanitize (default: all but torch, sanitize)  BUDGET=seconds for the whole run
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
B=${BUILD:-build-gpu}
STEPS=${STEPS:-build,sass,bench,test}
T0=$(date +%s)
left() { echo $(( ${BUDGET:-400} - ($(date +%s) - T0) )); }
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }

if want build; then
  cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$OUT/build.log" 2>&1 &&
    cmake --build "$B" -j16 --target nabla_obj test_cuda nabla >>"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
  echo "build ok ($(( $(date +%s) - T0 )) s)"
fi
if want sass; then
  obj=$(find "$B" -name gemm_sm90.cu.o | head -1)
  cuobjdump -sass "$obj" >"$OUT/sass.txt" 2>&1
  echo "SASS gemm_sm90: HGMMA $(grep -c HGMMA "$OUT/sass.txt") STSM $(grep -c STSM "$OUT/sass.txt")" \
       "UTMASTG $(grep -c UTMASTG "$OUT/sass.txt") UTMALDG $(grep -c UTMALDG "$OUT/sass.txt")" \
       "LDL/STL $(grep -cE '\b(LDL|STL)\b' "$OUT/sass.txt")"
fi
if want bench; then
  for g in own cublaslt; do
    NABLA_GEMM=$g timeout "${BENCH_S:-100}" "$B/nabla" bench --device cuda --only "${ONLY:-matmul}" \
      --seconds "${SECONDS_PER:-0.3}" --json "$OUT/bench_$g.json" >"$OUT/bench_$g.txt" 2>&1
    echo "bench $g rc=$? ($(( $(date +%s) - T0 )) s)"
  done
  python3 - "$OUT/bench_own.json" "$OUT/bench_cublaslt.json" <<'PY' | tee "$OUT/table.md"
import json, sys
def load(p):
    try:
        return {c["id"]: c for c in json.load(open(p))["cases"]}
    except Exception as e:
        print("cannot read", p, e); return {}
own, lt = load(sys.argv[1]), load(sys.argv[2])
print("| case | own ms | own TFLOP/s | cuBLASLt ms | cuBLASLt TFLOP/s | own/cuBLASLt |")
print("|---|---|---|---|---|---|")
for k, o in own.items():
    l = lt.get(k, {})
    om, lm = o.get("ms_median"), l.get("ms_median")
    r = "%.3f" % (lm / om) if om and lm else "-"
    f = lambda v: "-" if v is None else "%.4f" % v
    g = lambda v: "-" if v is None else "%.0f" % v
    print("| %s | %s | %s | %s | %s | %s |" % (k, f(om), g(o.get("tflop_per_s")), f(lm), g(l.get("tflop_per_s")), r))
PY
fi
if want torch; then
  timeout "${TORCH_S:-120}" python3 bench/compare_torch.py "$OUT/bench_own.json" --only matmul_bias_gelu \
    >"$OUT/torch.txt" 2>&1
  echo "torch rc=$?"; tail -8 "$OUT/torch.txt"
fi
if want test; then
  NABLA_TEST_ONLY=gemm NABLA_TEST_VERBOSE=1 timeout "${TEST_S:-$(left)}" "$B/tests/test_cuda" >"$OUT/test.log" 2>&1
  echo "test rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -E "FAIL|error|passed" "$OUT/test.log" | tail -15
fi
if want sanitize; then
  for tool in memcheck racecheck; do
    NABLA_TEST_QUICK=1 NABLA_TEST_ONLY=gemm timeout "${SAN_S:-$(( $(left) / 2 ))}" compute-sanitizer --tool $tool \
      --error-exitcode 9 "$B/tests/test_cuda" >"$OUT/san_$tool.log" 2>&1
    echo "sanitizer $tool rc=$? ($(( $(date +%s) - T0 )) s): $(grep -E 'ERROR SUMMARY|passed' "$OUT/san_$tool.log" | tr '\n' ' ')"
  done
fi
