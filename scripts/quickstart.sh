#!/usr/bin/env bash
# The README's first command: installs dependencies from Debian's packages, builds the trainflow
# binary (only it: the tests, the CUDA tests and their emulator are built by scripts/test.sh),
# tokenizes the default corpus (Debian's fortunes) and trains a small byte-level GPT on the CPU,
# printing progress, validation loss and text samples. The training itself takes minutes on 2 cores;
# installing and building on a fresh machine take most of the time (README.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install_deps.sh
# GPT-2's BPE files, for training on your own text (docs/tokenizers.md); the default job is byte-level.
bash scripts/fetch_gpt2_tokenizer.sh || echo "quickstart: could not fetch the GPT-2 tokenizer files;" \
  "byte-level training works, --tokenizer gpt2 needs scripts/fetch_gpt2_tokenizer.sh" >&2
bash scripts/build.sh trainflow
./build/trainflow prepare --input /usr/share/games/fortunes --delimiter % --val-fraction 0.05 \
  --out-dir data/fortunes
# Run again: a stopped training (Ctrl-C) resumes where it stopped (train does that by itself); a
# finished one is not trained again unless asked (--fresh starts over).
if [[ $# -eq 0 && -f out/fortunes/model.safetensors && ! -f out/fortunes/train_state.safetensors ]]; then
  echo "quickstart: out/fortunes holds a finished run; pass --fresh to train again from scratch"
else
  ./build/trainflow train --model configs/model/byte-small.json --train configs/train/fortunes.json "$@"
fi
echo
echo "Weights: out/fortunes/model.safetensors. Try:"
echo "  ./build/trainflow sample --weights out/fortunes/model.safetensors --prompt 'The ' --tokens 300"
echo "  ./build/trainflow eval --weights out/fortunes/model.safetensors   # the validation loss above"
