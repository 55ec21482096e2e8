#!/bin/sh
# Builds the safetensors fuzz target (libFuzzer + ASan + UBSan) from the
# library sources and runs it for SECONDS (default 60) on a seed corpus of
# valid files that it generates with the library's own writer.
#   fuzz/run-fuzz.sh [SECONDS] [extra libFuzzer flags...]
# Work files go to $NB_FUZZ_DIR (default build-fuzz/); crashes are written
# there as crash-* and make the script exit nonzero.
set -eu
secs=${1:-60}
[ $# -gt 0 ] && shift
root=$(cd "$(dirname "$0")/.." && pwd)
out=${NB_FUZZ_DIR:-$root/build-fuzz}
cc=${CC_FUZZ:-clang}
mkdir -p "$out/corpus" "$out/seeds"

srcs=$(find "$root/src" -name '*.c' | sort)
common="-std=c11 -g -O1 -fopenmp -I$root/include -I$root/src -fno-omit-frame-pointer"
# Rebuild only when a source is newer than the binaries, so the time limit
# goes to fuzzing.
stale=1
if [ -x "$out/fuzz_safetensors" ] && [ -x "$out/seedgen" ] && [ -z "$(find "$root/src" "$root/include" \
    "$root/fuzz" -newer "$out/fuzz_safetensors" -type f | head -n 1)" ]; then
  stale=0
fi
if [ "$stale" = 1 ]; then
  echo "building fuzz target with $cc ..."
  # shellcheck disable=SC2086
  $cc $common -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    $srcs "$root/fuzz/fuzz_safetensors.c" -o "$out/fuzz_safetensors.new" -lm
  # shellcheck disable=SC2086
  $cc $common -DNB_FUZZ_SEEDGEN -fsanitize=address,undefined \
    $srcs "$root/fuzz/fuzz_safetensors.c" -o "$out/seedgen" -lm
  mv "$out/fuzz_safetensors.new" "$out/fuzz_safetensors"
fi
rm -rf "$out/seeds" && mkdir -p "$out/seeds"
"$out/seedgen" "$out/seeds"
echo "seeds: $(ls "$out/seeds" | wc -l) files"

# Tokens of the header grammar help the mutator reach deep checks.
cat > "$out/safetensors.dict" <<'DICT'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F64\""
"\"F32\""
"\"F16\""
"\"BF16\""
"\"I64\""
"\"I32\""
"\"U8\""
"\"BOOL\""
"\"F8_E4M3\""
"\\u0000"
"\\ud800\\udc00"
"18446744073709551615"
"9223372036854775807"
"-0"
"1e3"
"null"
"true"
"[]"
"{}"
DICT

cd "$out"
export OMP_NUM_THREADS=1
# Tensors here are tiny, so an allocation over 64 MB is itself a bug.
"$out/fuzz_safetensors" "$out/corpus" "$out/seeds" -dict="$out/safetensors.dict" \
  -max_total_time="$secs" -max_len=65536 -rss_limit_mb=2048 -malloc_limit_mb=64 \
  -print_final_stats=1 "$@"
