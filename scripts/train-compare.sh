#!/usr/bin/env bash
# The main job's training step, nabla against PyTorch (eager and torch.compile)
# on the same GPU, same model, same batch: `nabla train --data` on a text made
# of this repository's C sources, then bench/train_torch.py with the same
# configuration and vocabulary size. Prints tokens/s for each and the ratios.
#   scripts/train-compare.sh [BUILD_DIR] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-gpu}
STEPS=${2:-200}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
text=$(mktemp)
trap 'rm -f "$text"' EXIT
cat src/*/*.c src/*/*/*.c tools/*.c >"$text"
# f32 on both sides (bench/train_torch.py trains in f32); the GPU's default
# is bf16 autocast
"$BUILD/nabla" train --device cuda --precision f32 --data "$text" --steps "$STEPS" --eval-every 0 --no-svg \
  --log-every "$STEPS" | tee "$OUT/train-nabla.log"
model=$(grep '^model:' "$OUT/train-nabla.log")
num() { sed -E "s/.*[ ,]$1 ([0-9]+).*/\\1/" <<<"$model"; }
layers=$(sed -E 's/^model: ([0-9]+) layers.*/\1/' <<<"$model")
heads=$(sed -E "s/.* ([0-9]+) heads.*/\1/" <<<"$model"); dim=$(num dim); ctx=$(num context); vocab=$(num vocab)
batch=$(sed -E 's/.* of ([0-9]+) x ([0-9]+) tokens.*/\1/' <<<"$(grep '^training:' "$OUT/train-nabla.log")")
python3 bench/train_torch.py --layers "$layers" --heads "$heads" --dim "$dim" --context "$ctx" \
  --batch "$batch" --vocab "$vocab" --steps "$STEPS" --json "$OUT/train-torch.json" | tee "$OUT/train-torch.log"
nb=$(sed -nE 's/^throughput: ([0-9]+) tokens.*/\1/p' "$OUT/train-nabla.log")
line="train (f32, $layers layers, dim $dim, context $ctx, batch $batch, vocab $vocab): nabla $nb tokens/s"
while read -r _ mode tps _; do
  line+="; torch $mode $tps (nabla/$mode $(python3 -c "print(f'{$nb/$tps:.2f}')"))"
done < <(grep -E '^torch (eager|compile) ' "$OUT/train-torch.log")
echo "$line"
