#!/usr/bin/env bash
# The CUDA tests on the CPU emulator (tests/emulator) under AddressSanitizer + UndefinedBehaviorSanitizer:
# "device" buffers are exactly-sized host allocations, so a kernel reading or writing past a buffer,
# and any undefined behaviour in kernel or host code, stops the run with a report. Not part of CI
# (the sanitizer build takes ~18 minutes on 2 cores); run it after changing kernels.
#   bash scripts/emu_sanitize.sh [gtest filter]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${BUILD:-$ROOT/build-asan}"
FILTER="${1:--Cudnn*:*Cudnn*:Nccl*:*Nccl*:GPT2CudaMemory*}"
SAN="-fsanitize=address,undefined -fno-omit-frame-pointer"
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRAINFLOW_BUILD_BENCH=OFF \
  -DCMAKE_CXX_FLAGS="$SAN" -DCMAKE_EXE_LINKER_FLAGS="$SAN" -DCMAKE_SHARED_LINKER_FLAGS="$SAN" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target all_cuda_tests_emu data_parallel_cuda_mpi_test_emu cuemu_nccl
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd "$BUILD"
"$BUILD/tests/emulator/all_cuda_tests_emu" --gtest_filter="$FILTER"
for np in 2 3; do
  mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np "$np" -x ASAN_OPTIONS -x UBSAN_OPTIONS -x CUEMU_DEVICES="$np" \
    -x TRAINFLOW_NCCL_LIBRARY="$BUILD/tests/emulator/libcuemu_nccl.so" \
    "$BUILD/tests/emulator/data_parallel_cuda_mpi_test_emu"
done
echo "emu_sanitize: no sanitizer reports"
