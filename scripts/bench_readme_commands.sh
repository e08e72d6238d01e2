#!/usr/bin/env bash
# Times the README's two commands on a fresh clone of this checkout (bench/RESULTS.md): the first
# (scripts/quickstart.sh) until its first training step, the second (scripts/test.sh) to the end.
# Packages are assumed installed (install_deps.sh then only checks them); run on a quiet machine.
#   bash scripts/bench_readme_commands.sh [first|second|both] [REV]   (default: both, HEAD)
set -euo pipefail
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
which="${1:-both}"
rev="${2:-HEAD}"

clone() {
  local d
  d="$(mktemp -d /tmp/tf-readme.XXXXXX)"
  git clone -q "$ROOT" "$d"
  git -C "$d" checkout -q --detach "$rev"
  echo "$d"
}

if [[ "$which" == first || "$which" == both ]]; then
  d="$(clone)"
  t0=$(date +%s.%N)
  first=""
  # Five steps are enough to see the first one; the job's own length does not matter here.
  while IFS= read -r line; do
    if [[ -z "$first" && "$line" =~ ^step\ +1/ ]]; then
      first=$(since "$t0")
    fi
  done < <(cd "$d" && bash scripts/quickstart.sh --max_steps 5 2>&1 | stdbuf -oL tr -cd '\11\12\15\40-\176')
  total=$(since "$t0")
  echo "first command ($rev): first training step after ${first:-never} s (whole command ${total} s)"
  rm -rf "$d"
fi

if [[ "$which" == second || "$which" == both ]]; then
  d="$(clone)"
  t0=$(date +%s.%N)
  rc=0
  (cd "$d" && bash scripts/test.sh > "$d.test.log" 2>&1) || rc=$?
  total=$(since "$t0")
  echo "second command ($rev): exit $rc after ${total} s; $(grep -E 'tests passed|Total Test time' "$d.test.log" | tr '\n' ' ')"
  rm -rf "$d" "$d.test.log"
fi
