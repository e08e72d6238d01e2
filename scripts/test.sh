#!/usr/bin/env bash
# The README's test command: installs dependencies (if missing), fetches the GPT-2 tokenizer files
# used by the BPE tests, builds every target (scripts/build.sh with no target), and runs the whole
# suite with CTest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/install_deps.sh"
bash "$ROOT/scripts/fetch_gpt2_tokenizer.sh"
# The S3 checkpoint tests run a local S3-compatible server: s3rver from npm into third_party/s3rver.
bash "$ROOT/scripts/install_s3rver.sh"
bash "$ROOT/scripts/build.sh"
cd "$ROOT/build"
# Long quality soaks (CTest label "soak") are benchmarks: scripts/bench_soak.sh runs them.
ctest --output-on-failure -j "$(nproc)" --timeout 900 --label-exclude soak
