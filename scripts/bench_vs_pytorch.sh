#!/usr/bin/env bash
# Side-by-side CPU training-step benchmark: `trainflow bench` and the same step in PyTorch
# (scripts/pytorch_bench.py, Debian's python3-torch on OpenBLAS-openmp), one after the other in one
# run, same model, batch, sequence length and thread count. Prints both and the speed-up.
#
# Usage: scripts/bench_vs_pytorch.sh MODEL_JSON B T [THREADS] [STEPS]
# Needs: a build (scripts/build.sh) and scripts/setup_pytorch.sh (installs python3-torch and
# points the BLAS alternatives at OpenBLAS-openmp). Run on a quiet machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODEL="${1:?model config}"; B="${2:?batch}"; T="${3:?seq}"; THREADS="${4:-$(nproc)}"; STEPS="${5:-10}"
export OMP_NUM_THREADS="$THREADS"
read -r L H C V BS < <(/usr/bin/python3 -c "import json,sys; m=json.load(open('$MODEL')); print(m['n_layer'], m['n_head'], m['n_embd'], m['vocab_size'], m['block_size'])")

echo "== trainflow ($MODEL, B=$B T=$T threads=$THREADS)"
TF_OUT=$("$ROOT/build/trainflow" bench --model "$MODEL" --batch-size "$B" --seq-len "$T" --steps "$STEPS" \
  --warmup 3 --threads "$THREADS" --gemm-peak)
echo "$TF_OUT"
echo "== PyTorch"
PT_OUT=$(/usr/bin/python3 "$ROOT/scripts/pytorch_bench.py" --n_layer "$L" --n_head "$H" --n_embd "$C" \
  --vocab_size "$V" --block_size "$BS" --batch "$B" --seq "$T" --steps "$STEPS" --warmup 3 --threads "$THREADS")
echo "$PT_OUT"
tf_ms=$(echo "$TF_OUT" | sed -n 's/.*BENCH_RESULT ms_per_step=\([0-9.]*\).*/\1/p')
pt_ms=$(echo "$PT_OUT" | sed -n 's/.*PYTORCH_RESULT ms_per_step=\([0-9.]*\).*/\1/p')
echo "== summary: trainflow ${tf_ms} ms/step, PyTorch ${pt_ms} ms/step, speed-up $(/usr/bin/python3 -c "print(f'{$pt_ms/$tf_ms:.2f}')")x"
