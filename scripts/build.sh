#!/usr/bin/env bash
# Configures and builds TrainFlow in build/ (Release). Arguments starting with "-" go to cmake's
# configure step (e.g. -DTRAINFLOW_MARCH=x86-64-v3); the others name the targets to build (e.g.
# trainflow); with none, every target is built (docs/build.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
configure=()
targets=()
for arg in "$@"; do
  if [[ "$arg" == -* ]]; then configure+=("$arg"); else targets+=("$arg"); fi
done
cmake -S "$ROOT" -B "$ROOT/build" -DCMAKE_BUILD_TYPE=Release "${configure[@]}" >/dev/null
if ((${#targets[@]})); then
  cmake --build "$ROOT/build" -j "$(nproc)" --target "${targets[@]}"
else
  cmake --build "$ROOT/build" -j "$(nproc)"
fi
