#!/usr/bin/env bash
# Run on the build machine (CUDA toolkit installed, no GPU needed): builds TrainFlow with the CUDA
# backend and packs what the GPU check needs into gpu_bundle/ — the trainflow binary, the combined
# CUDA test binary, the CUDA benchmarks, and every shared library they load that a bare CUDA
# machine may lack (including this machine's glibc loader, used only if the binaries do not start
# with the GPU machine's own). cuBLAS/cuBLASLt/cudart's driver come from the GPU machine's toolkit.
#
# Usage: scripts/gpu_bundle.sh            then: device run with carry ["gpu_carry"] and the command
#        bash scripts/gpu_check.sh        (it unpacks gpu_carry/gpu_bundle.tgz)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD="${BUILD:-build}"
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTRAINFLOW_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target trainflow all_cuda_tests
for src in bench/*_cuda_bench.cpp; do
  [[ -e "$src" ]] || continue
  cmake --build "$BUILD" -j "$(nproc)" --target "$(basename "$src" .cpp)"
done

OUT="$ROOT/gpu_bundle"
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib"
cp "$BUILD/trainflow" "$BUILD/tests/all_cuda_tests" "$OUT/bin/"
for b in "$BUILD"/bench/*_cuda_bench; do [[ -x "$b" ]] && cp "$b" "$OUT/bin/"; done
# Shared libraries, except the CUDA driver/toolkit ones the GPU machine provides.
for bin in "$OUT"/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libcuda.so*|libcublas*|libcudart*|libnvidia*|libcudnn*|libnccl*) ;;
      *) cp -Ln "$lib" "$OUT/lib/" 2>/dev/null || true ;;
    esac
  done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$OUT/lib/"
# The default corpus as token files, for gpu_check's training runs (the GPU machine has no fortunes).
if [[ ! -f data/fortunes/train.bin ]]; then
  "$BUILD/trainflow" prepare --input /usr/share/games/fortunes --delimiter % --val-fraction 0.05 \
    --out-dir data/fortunes >/dev/null
fi
mkdir -p "$OUT/data"
cp data/fortunes/train.bin data/fortunes/val.bin "$OUT/data/"
strip --strip-unneeded "$OUT"/bin/* 2>/dev/null || true
# Carried as one compressed file (the device tool's working-tree limit is 64 MiB; OpenBLAS alone
# is 36 MB unpacked); gpu_check.sh unpacks it.
mkdir -p "$ROOT/gpu_carry"
tar -C "$ROOT" -czf "$ROOT/gpu_carry/gpu_bundle.tgz" gpu_bundle
du -sh "$OUT" "$ROOT/gpu_carry/gpu_bundle.tgz"
echo "gpu_bundle: $(ls "$OUT/bin" | tr '\n' ' '); carry gpu_carry (device run carry: [\"gpu_carry\"])"
