#!/usr/bin/env bash
# The main job's training step, nabla against PyTorch (eager and torch.compile)
# on the same GPU, same model, same batch, same precision, and the peak GPU
# memory of each. Two presets:
#   char (default): `nabla train --data` on a text made of this repository's
#     C sources (a character model), then bench/train_torch.py with the same
#     configuration and vocabulary size;
#   gpt2: GPT-2 small (`nabla train --model gpt2`) on a token file of random
#     GPT-2 token ids in llm.c's format, then train_torch.py --model gpt2.
# PRECISION f32 (default) or bf16 applies to both sides (autocast, f32
# weights). Prints tokens/s for each and the ratios.
#   scripts/train-compare.sh [BUILD_DIR] [STEPS]
#   PRESET=gpt2 PRECISION=bf16 scripts/train-compare.sh build 50
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
STEPS=${2:-200}
PRESET=${PRESET:-char}
PRECISION=${PRECISION:-f32}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
data=$(mktemp)
trap 'rm -f "$data"' EXIT
if [ "$PRESET" = gpt2 ]; then
  # 4M random token ids below 50257 after llm.c's 256-int32 header
  python3 - "$data" <<'PY'
import random, struct, sys
n = 1 << 22
rng = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
PY
  src=(--model gpt2 --tokens "$data")
  torch_preset=(--model gpt2)
else
  cat src/*/*.c src/*/*/*.c tools/*.c >"$data"
  src=(--data "$data")
  torch_preset=()
fi
"$BUILD/nabla" train --device cuda --precision "$PRECISION" "${src[@]}" --steps "$STEPS" \
  --eval-every 0 --no-svg --log-every "$STEPS" | tee "$OUT/train-nabla.log"
model=$(grep '^model:' "$OUT/train-nabla.log")
num() { sed -E "s/.*[ ,]$1 ([0-9]+).*/\\1/" <<<"$model"; }
layers=$(sed -E 's/^model: (GPT-2 small preset, )?([0-9]+) layers.*/\2/' <<<"$model")
heads=$(sed -E "s/.* ([0-9]+) heads.*/\1/" <<<"$model"); dim=$(num dim); ctx=$(num context)
vocab=$(sed -E 's/.*vocab ([0-9]+)( \(padded to ([0-9]+)\))?.*/\1 \3/' <<<"$model" | awk '{print $2 ? $2 : $1}')
batch=$(sed -E 's/.* of ([0-9]+) x ([0-9]+) tokens.*/\1/' <<<"$(grep '^training:' "$OUT/train-nabla.log")")
python3 bench/train_torch.py "${torch_preset[@]}" --layers "$layers" --heads "$heads" --dim "$dim" \
  --context "$ctx" --batch "$batch" --vocab "$vocab" --steps "$STEPS" --precision "$PRECISION" \
  --json "$OUT/train-torch.json" | tee "$OUT/train-torch.log"
nb=$(sed -nE 's/^throughput: ([0-9]+) tokens.*/\1/p' "$OUT/train-nabla.log")
peak=$(sed -nE 's/^peak device memory: ([0-9.]+) MiB.*/\1/p' "$OUT/train-nabla.log")
line="train ($PRESET, $PRECISION, $layers layers, dim $dim, context $ctx, batch $batch, vocab $vocab): nabla $nb tokens/s, peak ${peak:-?} MiB"
while read -r _ mode tps _; do
  line+="; torch $mode $tps (nabla/$mode $(python3 -c "print(f'{$nb/$tps:.2f}')"))"
done < <(grep -E '^torch (eager|compile) ' "$OUT/train-torch.log")
echo "$line"
