#!/usr/bin/env bash
# The GPU machine's check, run from the repository root:
#   configure + build with CUDA, the CPU ctest suite, the CUDA-vs-CPU suite
#   (build-gpu/tests/test_cuda), compute-sanitizer memcheck and racecheck on
#   it (NABLA_TEST_QUICK=1 sizes), `nabla bench`, and bench/compare_torch.py
#   when present. Logs go to $OUT (default ./out); a summary table is
#   printed last. Exit status: non-zero when any required step failed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PATH="/usr/local/cuda/bin:$PATH"
BUILD=${BUILD:-build-gpu}
ARCHS=${CUDA_ARCHS:-"90a-real;80-real"}
JOBS=${JOBS:-16}

# STEPS selects parts (default all but gemm): cpu (the CPU ctest suite), cuda
# (test_cuda), sanitize (memcheck + racecheck; or memcheck, racecheck alone), train (the main job, `make
# run`, on the GPU, and a kernel profile of 10 steps of train-compare's model), bench (nabla bench + torch,
# each case after BENCH_WARMUP seconds of warm-up, default 1), gemm (scripts/gemm-compare.sh: the own
# GEMM's schedules GEMM_SCHEDULES, default heuristic,data-parallel,cluster2, against cuBLASLt), steady
# (bench/steady_compare.py: nabla and torch alternately at the same load, about 7 s a case a round).
STEPS=${STEPS:-cpu,cuda,sanitize,train,bench}
want() { case ",$STEPS," in *",$1,"*) return 0 ;; esac; return 1; }

declare -a names results secs
failed=0

# step NAME REQUIRED CMD...: runs CMD with its output teed to $OUT/NAME.log.
step() {
  local name=$1 required=$2; shift 2
  local t0=$SECONDS rc
  echo "==== $name: $*"
  "$@" 2>&1 | tee "$OUT/$name.log"
  rc=${PIPESTATUS[0]}
  names+=("$name"); secs+=($((SECONDS - t0)))
  if [ "$rc" -eq 0 ]; then results+=("ok")
  elif [ "$required" = 1 ]; then results+=("FAIL ($rc)"); failed=1
  else results+=("failed ($rc, optional)"); fi
  return "$rc"
}

skip() { names+=("$1"); results+=("skipped: $2"); secs+=(0); }

# racecheck_nabla CMD...: runs a racecheck command; passes when every
# reported hazard lies inside cuBLASLt's nvjet kernels (see the step) and the
# test program itself finished with 0 failures. Exit 99 (hazards found)
# hides the program's own status, so its summary line is checked too: a
# program that died (e.g. killed for memory) prints none.
racecheck_nabla() {
  local log rc ours done
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  ours=$(grep 'Race reported' "$log" | grep -vc 'nvjet')
  done=$(grep -cE '^[0-9]+ passed, 0 failed$' "$log")
  echo "racecheck: $(grep -c 'Race reported' "$log") hazard reports, $ours outside cuBLASLt's nvjet kernels;" \
    "test summary line with 0 failures: $done"
  rm -f "$log"
  if [ "$done" -eq 0 ]; then return 1; fi
  if [ "$rc" -eq 99 ] && [ "$ours" -eq 0 ]; then return 0; fi
  return "$rc"
}

nvidia-smi 2>&1 | tee "$OUT/nvidia-smi.log" || true

step configure 1 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release \
  "-DCMAKE_CUDA_ARCHITECTURES=$ARCHS" -DCMAKE_CUDA_COMPILER="$(command -v nvcc)"
configured=$?
if [ "$configured" -eq 0 ]; then
  step build 1 cmake --build "$BUILD" -j "$JOBS"
  built=$?
else
  built=1
fi

if [ "$built" -eq 0 ]; then
  if want cpu; then step ctest-cpu 1 ctest --test-dir "$BUILD" --output-on-failure -j "$JOBS"; fi
  if [ -x "$BUILD/tests/test_cuda" ]; then
    if want cuda; then step test-cuda 1 "$BUILD/tests/test_cuda"; fi
    # every op's accuracy on the device against float64, with its table
    if want cuda && [ -x "$BUILD/tests/test_cuda_accuracy" ]; then
      step cuda-accuracy 1 "$BUILD/tests/test_cuda_accuracy"
    fi
    # every op-table entry on the GPU against the CPU
    if want cuda && [ -x "$BUILD/tests/test_op_table" ]; then
      step op-table 1 "$BUILD/tests/test_op_table"
    fi
    # the same bits as another build (SAME_BITS_BEFORE: its nabla) after
    # 50 training steps, on the CPU and the GPU
    if want cuda && [ -n "${SAME_BITS_BEFORE:-}" ]; then
      step same-bits 1 sh -c "scripts/same-bits.sh '$SAME_BITS_BEFORE' '$BUILD/nabla' cpu '$OUT/same-bits' &&
        scripts/same-bits.sh '$SAME_BITS_BEFORE' '$BUILD/nabla' cuda '$OUT/same-bits'"
    fi
    if ! want sanitize && ! want memcheck && ! want racecheck; then :
    elif command -v compute-sanitizer >/dev/null 2>&1; then
      # API errors are off: the suite provokes some on purpose (a 1 PB
      # allocation) and checks each through nabla's own status instead.
      # Tuning samples are single launches: racecheck keeps host memory per
      # launch, and 1 ms samples (dozens of launches each) grew the "gemm
      # tune" section past 128 GB until the OOM killer ended it.
      if want sanitize || want memcheck; then
        step memcheck 1 env NABLA_TEST_QUICK=1 NABLA_AUTOTUNE_SAMPLE_US=0 compute-sanitizer --tool memcheck \
          --report-api-errors no --error-exitcode 99 "$BUILD/tests/test_cuda"
      fi
      if { want sanitize || want memcheck; } && [ -x "$BUILD/tests/test_cuda_accuracy" ]; then
        step memcheck-acc 1 env NABLA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
          --report-api-errors no --error-exitcode 99 "$BUILD/tests/test_cuda_accuracy"
      fi
      # every attention program: the SIMT, mma and sm_90a kernels, masks,
      # dropout, grouped heads, the packed projection, the sm_90a backward
      for t in attention attention_qkv attention_mask attention_sm90 attention_sm90_bwd; do
        [ -x "$BUILD/tests/test_$t" ] || continue
        if want sanitize || want memcheck; then
          step "memcheck-$t" 1 env NABLA_TEST_QUICK=1 compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 99 "$BUILD/tests/test_$t"
        fi
        # The clustered sm_90a forward (two CTAs sharing K/V tiles by TMA
        # multicast) stops racecheck with "Internal Sanitizer Error: The
        # Sanitizer failed to handle a hardware exception" even when no kernel
        # is instrumented (--kernel-name matching none; H100, CUDA 13,
        # 2026-11-25), while memcheck and synccheck pass on it; so racecheck
        # runs the attention programs with the unclustered forward.
        if want sanitize || want racecheck; then
          step "racecheck-$t" 1 env NABLA_TEST_QUICK=1 NABLA_ATTENTION_SM90_CLUSTER=0 compute-sanitizer \
            --tool racecheck --error-exitcode 99 "$BUILD/tests/test_$t"
        fi
      done
      if want sanitize || want racecheck; then
        # racecheck does not follow the mbarrier/TMA synchronisation of
        # cuBLASLt's own sm_90 kernels (nvjet_*) and reports hazards inside
        # them (seen on the H100, CUDA 13); those are vendor code, so the
        # step fails only on hazards in any other kernel.
        step racecheck 1 racecheck_nabla env NABLA_TEST_QUICK=1 NABLA_AUTOTUNE_SAMPLE_US=0 compute-sanitizer --tool racecheck \
          --error-exitcode 99 "$BUILD/tests/test_cuda"
      fi
    else
      skip memcheck "compute-sanitizer not found"
      skip racecheck "compute-sanitizer not found"
    fi
  else
    skip test-cuda "$BUILD/tests/test_cuda not built"
  fi
  if want train; then
    step train 1 timeout 600 "$BUILD/nabla" train --device cuda --log-every 100 --svg "$OUT/loss.svg"
    # where a step's time goes: every kernel of 20 steps, by name and phase
    # the profile is of train-compare's model (a character model of this
    # repository's C sources), without held-out evaluation in the steps
    cat src/*/*.c src/*/*/*.c tools/*.c >"$OUT/profile-text.txt"
    step train-profile 0 timeout 300 "$BUILD/nabla" train --device cuda --data "$OUT/profile-text.txt" \
      --steps 11 --eval-every 0 --profile --no-svg --quiet
    if python3 -c "import torch" 2>/dev/null; then
      step train-compare 0 timeout 600 scripts/train-compare.sh "$BUILD"
      # the same in bf16 on both sides, and GPT-2 small in bf16 (issue 17's targets)
      step train-compare-bf16 0 timeout 600 env PRECISION=bf16 scripts/train-compare.sh "$BUILD"
      step train-compare-gpt2 0 timeout 600 env PRESET=gpt2 PRECISION=bf16 scripts/train-compare.sh "$BUILD" 30
    fi
    # issue 17's convergence condition: held-out loss of 2,000 steps of the
    # character model in bf16 and f16 within 2% of f32, three curves in one SVG
    # on up to 32 MB of Python's standard library (10.7 MB on the H100
    # machine: three passes in 2,000 steps of 64 x 256 characters, the
    # held-out loss still falling at the end): this repository's 1.5 MB of C
    # is seen 20 times and its held-out loss climbs from step ~400 on
    # (overfitting), which measures regularisation, not precision
    find "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')" -name '*.py' |
      sort | xargs cat 2>/dev/null | head -c 33554432 >"$OUT/pytext.txt"
    step precision-curves 0 timeout 900 python3 bench/precision_curves.py --nabla "$BUILD/nabla" \
      --data "$OUT/pytext.txt" --steps 2000 --eval-every 100 --parallel --svg "$OUT/precision.svg"
    # GPT-2 small's shape (f32): 5 steps, to show it fits and its peak memory
    step gpt2-shape 0 timeout 300 "$BUILD/nabla" train --device cuda --data "$OUT/profile-text.txt" \
      --layers 12 --heads 12 --dim 768 --context 1024 --batch 16 --steps 5 --eval-every 0 \
      --no-svg --log-every 1
  fi
  # every case (nabla's, then torch's: compare_torch.py reads the same
  # warm-up from the JSON) timed after BENCH_WARMUP seconds of its own load,
  # at the GPU's power-limited steady clock (bench/README.md)
  if want bench; then
    step bench 0 "$BUILD/nabla" bench --device cuda --warmup "${BENCH_WARMUP:-1}" --json "$OUT/bench.json"
  fi
  if want gemm; then
    step gemm-compare 0 env WARMUP="${BENCH_WARMUP:-1}" scripts/gemm-compare.sh "$BUILD" \
      "${GEMM_SCHEDULES:-heuristic,data-parallel,cluster2}"
  fi
  if ! want bench; then :
  elif [ -f bench/compare_torch.py ] && [ -f "$OUT/bench.json" ]; then
    if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      step compare-torch 0 python3 bench/compare_torch.py "$OUT/bench.json" --md "$OUT/compare_torch.md"
    else
      skip compare-torch "torch with CUDA not importable"
    fi
  else
    skip compare-torch "no bench/compare_torch.py or bench.json"
  fi
  # nabla and torch alternately on the open issues' heavy cases, both at the
  # same load (bench/steady_compare.py; STEADY_IDS overrides the cases)
  if want steady; then
    ids=${STEADY_IDS:-"attention_fwd:4x16x4096x128:bf16 attention_fwd_causal:4x16x4096x128:bf16
      attention_fwdbwd_causal_nd:4x16x4096x128:bf16 attention_fwdbwd_causal_nd:16x12x1024x64:bf16
      matmul_nn:8192x8192x8192:bf16 matmul_nn:4096x4096x4096:bf16 scaled_mm_nt:8192x8192x8192:bf16
      matmul_nt:16384x2304x768:bf16 matmul_nn:16384x768x2304:bf16 matmul_tn:2304x768x16384:bf16
      matmul_nt:16384x3072x768:bf16 matmul_nn:16384x768x3072:bf16 matmul_tn:3072x768x16384:bf16
      matmul_nt:16384x768x3072:bf16 matmul_nn:16384x3072x768:bf16 matmul_tn:768x3072x16384:bf16
      matmul_nt:16384x50304x768:bf16 matmul_nn:16384x768x50304:bf16 matmul_tn:50304x768x16384:bf16"}
    # shellcheck disable=SC2086
    step steady 0 timeout 900 python3 bench/steady_compare.py "$BUILD/nabla" --md "$OUT/steady.md" $ids
  fi
fi

# Summary: pass counts from the test programs' last lines.
echo
echo "==== summary (logs in $OUT)"
printf '%-14s %-28s %6s  %s\n' step result secs detail
for i in "${!names[@]}"; do
  n=${names[$i]} detail=""
  if [ -f "$OUT/$n.log" ]; then
    case "$n" in
      test-cuda|cuda-accuracy|op-table|memcheck|racecheck|memcheck-*|racecheck-*) detail=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$OUT/$n.log" | tail -1) ;;
      ctest-cpu) detail=$(grep -E 'tests passed' "$OUT/$n.log" | tail -1) ;;
      same-bits) detail=$(grep -E '^same-bits' "$OUT/$n.log" | sed -E 's/, checkpoints/:/' | tr '\n' ' ') ;;
      train-compare*) detail=$(grep -E '^train \(' "$OUT/$n.log" | sed -E 's/^train \(([a-z0-9]+, [a-z0-9]+)[^)]*\): /\1: /') ;;
      train) detail=$(grep -E '^throughput|^held-out accuracy' "$OUT/$n.log" | tr '\n' ' ') ;;
      train-profile) detail=$(grep -E '^profile: ' "$OUT/$n.log") ;;
      precision-curves) detail=$(grep -E "^precision curves" "$OUT/$n.log") ;;
      gpt2-shape) detail=$(grep -iE '^throughput|peak|out of memory' "$OUT/$n.log" | tr '\n' ' ') ;;
      steady) detail="torch/nabla: $(grep -E 'torch/nabla' "$OUT/$n.log" | awk '{print $NF}' | tr '\n' ' ')" ;;
    esac
    case "$n" in
      memcheck|memcheck-*|racecheck-*) detail="$detail $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/$n.log" | tail -1)" ;;
      racecheck) detail="$detail $(grep -E '^racecheck: ' "$OUT/$n.log" | tail -1)" ;;
    esac
  fi
  printf '%-14s %-28s %6s  %s\n' "$n" "${results[$i]}" "${secs[$i]}" "$detail"
done
exit "$failed"
