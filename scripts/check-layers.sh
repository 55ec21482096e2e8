#!/usr/bin/env bash
# Layers only look down (docs/ARCHITECTURE.md, "Layers"): fails on a
# #include "..." that points up. From the bottom:
#
#   core < backend < graph < ops < autograd < compile < nn, optim, io < tools
#
# - src/<layer>/...: a quoted include names "nabla.h" (the public header,
#   open to every layer) or "<layer>/..." of its own layer or one below.
# - nn, optim, io call ops (or the documented fused entries of
#   ops/op_optim.h), never the backend table: no "backend/..." include.
# - tools/: the public header and tools' own headers only, except the
#   exceptions listed below.
# tests/, examples/ and bench/ are outside the layering (tests check
# internals directly).
#
# Exceptions: "file|included header|reason", one per line. Keep each one's
# reason; an include that is not listed here and points up fails.
set -euo pipefail
cd "$(dirname "$0")/.."

exceptions='
tools/bench.c|backend/autotune.h|nabla bench runs and reports the autotuner (internal by design)
tools/bench.c|core/core.h|nabla bench times kernels on tensors through their kernel views
tools/bench.c|backend/cuda/cuda_gemm.h|nabla bench calls the CUDA GEMM paths one by one
tools/bench.c|backend/cuda/cuda_timing.h|nabla bench reads the CUDA clocks
tools/bench_cases.c|backend/cuda/cuda_gemm.h|nabla bench calls the CUDA GEMM paths one by one
tools/bench_cases.c|core/core.h|nabla bench times kernels on tensors through their kernel views
tools/bench_report.c|backend/autotune.h|nabla bench runs and reports the autotuner (internal by design)
'

rank() {
  case "$1" in
  core) echo 0 ;;
  backend) echo 1 ;;
  graph) echo 2 ;;
  ops) echo 3 ;;
  autograd) echo 4 ;;
  compile) echo 5 ;;
  nn | optim | io) echo 6 ;;
  *) echo -1 ;;
  esac
}

excepted() { # file header
  grep -qxF -- "$1|$2" <(printf '%s\n' "$exceptions" | cut -d'|' -f1,2)
}

fail=0
bad() {
  echo "check-layers: $1" >&2
  fail=1
}

# every quoted include: "file:line:header"
includes() {
  grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"[^"]+"' "$@" |
    sed -E 's/^([^:]+):([0-9]+):.*#[[:space:]]*include[[:space:]]+"([^"]+)".*/\1:\2:\3/'
}

mapfile -t src_files < <(find src -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
n_src=${#src_files[@]}
for file in "${src_files[@]}"; do
  layer=${file#src/}
  layer=${layer%%/*}
  [ "$(rank "$layer")" -ge 0 ] ||
    bad "$file: src/$layer is in no layer (add it to scripts/check-layers.sh and ARCHITECTURE.md)"
done
while IFS=: read -r file line hdr; do
  [ -n "$file" ] || continue
  layer=${file#src/}
  layer=${layer%%/*}
  from=$(rank "$layer")
  [ "$from" -ge 0 ] || continue
  [ "$hdr" = nabla.h ] && continue
  if [ "$hdr" = "${hdr#*/}" ]; then
    bad "$file:$line: \"$hdr\": name headers from src/ (\"layer/file.h\")"
    continue
  fi
  to_layer=${hdr%%/*}
  to=$(rank "$to_layer")
  if [ "$to" -lt 0 ]; then
    bad "$file:$line: \"$hdr\" is in no layer"
  elif [ "$to" -gt "$from" ] && ! excepted "$file" "$hdr"; then
    bad "$file:$line: \"$hdr\" points up ($layer must not use $to_layer)"
  elif [ "$from" -eq 6 ] && [ "$to_layer" = backend ] && ! excepted "$file" "$hdr"; then
    bad "$file:$line: \"$hdr\": $layer calls ops or their fused entries, not the backend table"
  fi
done < <(includes "${src_files[@]}")

mapfile -t tool_files < <(find tools -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' \) | sort)
while IFS=: read -r file line hdr; do
  [ -n "$file" ] || continue
  [ "$hdr" = nabla.h ] && continue
  [ "$hdr" = "${hdr#*/}" ] && [ -f "tools/$hdr" ] && continue # tools' own header
  excepted "$file" "$hdr" && continue
  bad "$file:$line: \"$hdr\": tools use the public header (nabla.h) and their own headers only"
done < <(includes "${tool_files[@]}")

# an exception whose include is gone is stale: drop it
while IFS='|' read -r file hdr reason; do
  [ -n "$file" ] || continue
  if [ ! -f "$file" ] || ! includes "$file" | cut -d: -f3 | grep -qxF -- "$hdr"; then
    bad "stale exception: $file no longer includes \"$hdr\" (remove it from scripts/check-layers.sh)"
  fi
done <<<"$exceptions"

if [ "$fail" = 0 ]; then
  n_exc=$(printf '%s\n' "$exceptions" | grep -c '|' || true)
  echo "layers: ${n_src} files under src/ and ${#tool_files[@]} under tools/ include only downward ($n_exc documented exceptions, all in nabla bench)"
fi
exit "$fail"
