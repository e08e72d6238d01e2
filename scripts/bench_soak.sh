#!/usr/bin/env bash
# The quality soaks (CTest label "soak"), left out of the README's test command because each trains
# for minutes: the default fortunes job's validation loss after 500 steps against its measured
# threshold, and every gradient codec on 2 ranks against the uncompressed run's validation loss.
# Run on a quiet machine after scripts/build.sh; prints each test's figures (bench/RESULTS.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/build"
ctest --output-on-failure --verbose -j 1 --timeout 900 --label-regex soak "$@"
