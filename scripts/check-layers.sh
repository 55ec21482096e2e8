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
# - tools/: the public header and tools' own headers only; nabla bench
#   (tools/bench*) also backend/bench_api.h, and its op-table cases
#   (tools/bench_ops.c) graph/op.h: the exceptions listed below.
# tests/, examples/ and bench/ are outside the layering (tests check
# internals directly).
#
# Exceptions: "files|included header|reason", one per line (files: a shell
# pattern). Keep each one's reason; an include that points up and is not
# listed here fails, and so does an exception that no file uses any more.
set -euo pipefail
cd "$(dirname "$0")/.."

exceptions='
tools/bench*|backend/bench_api.h|nabla bench runs the autotuner and, on CUDA, the GEMM paths one by one with the device clocks (one named internal header)
tools/bench_ops.c|graph/op.h|nabla bench --ops walks the op table and runs the benchmark call of each entry through nb_op_run_outs
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
  local pat hdr reason
  while IFS='|' read -r pat hdr reason; do
    [ -n "$pat" ] || continue
    # shellcheck disable=SC2053 # pat is a pattern
    [[ "$1" == $pat && "$2" == "$hdr" ]] && return 0
  done <<<"$exceptions"
  return 1
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

# an exception that no file uses any more is stale
while IFS='|' read -r pat hdr reason; do
  [ -n "$pat" ] || continue
  used=0
  for file in $pat; do
    [ -f "$file" ] && includes "$file" | cut -d: -f3 | grep -qxF -- "$hdr" && used=1
  done
  [ "$used" = 1 ] ||
    bad "stale exception: no file of $pat includes \"$hdr\" (remove it from scripts/check-layers.sh)"
done <<<"$exceptions"

if [ "$fail" = 0 ]; then
  n_exc=$(printf '%s\n' "$exceptions" | grep -c '|' || true)
  echo "layers: ${n_src} files under src/ and ${#tool_files[@]} under tools/ include only downward ($n_exc documented exception(s): nabla bench)"
fi
exit "$fail"
