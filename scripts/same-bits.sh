#!/usr/bin/env bash
# Same results before and after a change: trains the default model for
# STEPS (default 50) steps with two builds of `nabla` on one device and
# compares the checkpoints byte for byte (parameters, optimizer state, step).
#   scripts/same-bits.sh BEFORE_NABLA AFTER_NABLA [cpu|cuda] [OUT_DIR]
# SAME_BITS_ARGS: more options for both runs (e.g. --precision f32, for
# builds whose GPU default is bf16 against older ones). Exit status 0 when
# the checkpoints are identical, 1 when they differ, 2 on bad use or a
# failed run.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 BEFORE_NABLA AFTER_NABLA [cpu|cuda] [OUT_DIR]" >&2
  exit 2
fi
before=$1 after=$2 dev=${3:-cpu} out=${4:-$(mktemp -d)}
steps=${STEPS:-50}
mkdir -p "$out"
for side in before after; do
  bin=$before
  [ "$side" = after ] && bin=$after
  # shellcheck disable=SC2086 # SAME_BITS_ARGS is a list of options
  if ! "$bin" train --device "$dev" --steps "$steps" --save "$out/$side-$dev.safetensors" \
      --no-svg -q ${SAME_BITS_ARGS:-} >"$out/$side-$dev.log" 2>&1; then
    echo "same-bits: $side ($bin) failed on $dev; see $out/$side-$dev.log" >&2
    exit 2
  fi
done
a=$(sha256sum <"$out/before-$dev.safetensors" | cut -c1-16)
b=$(sha256sum <"$out/after-$dev.safetensors" | cut -c1-16)
if cmp -s "$out/before-$dev.safetensors" "$out/after-$dev.safetensors"; then
  echo "same-bits $dev: $steps steps, checkpoints identical ($(stat -c %s "$out/after-$dev.safetensors") bytes, sha256 $a)"
  exit 0
fi
echo "same-bits $dev: $steps steps, checkpoints DIFFER (before sha256 $a, after $b)"
exit 1
