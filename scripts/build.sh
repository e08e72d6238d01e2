#!/usr/bin/env bash
# Configures and builds TrainFlow in build/ (Release). Extra arguments go to cmake's configure step,
# e.g. scripts/build.sh -DTRAINFLOW_MARCH=x86-64-v3
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$ROOT/build" -j "$(nproc)"
