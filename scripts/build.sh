#!/usr/bin/env bash
# Configures and builds TrainFlow in build/ (Release). Arguments starting with "-" go to cmake's
# configure step (e.g. -DTRAINFLOW_MARCH=x86-64-v3); the others name the targets to build (e.g.
# trainflow); with none, every target is built (docs/build.md). In a git checkout whose hooks are
# not configured yet, it also points git at the repository's hooks (scripts/git-hooks: the
# commit-msg check of CONTRIBUTING.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Only where git would otherwise run no hook at all: core.hooksPath unset and no hook of one's own
# in the hooks directory (core.hooksPath would hide it).
install_git_hooks() {
  command -v git >/dev/null || return 0
  [[ "$(git -C "$ROOT" rev-parse --show-toplevel 2>/dev/null)" == "$(cd "$ROOT" && pwd -P)" ]] || return 0
  git -C "$ROOT" config --get core.hooksPath >/dev/null && return 0
  local hook
  for hook in "$(git -C "$ROOT" rev-parse --path-format=absolute --git-path hooks)"/*; do
    if [[ -f "$hook" && "$hook" != *.sample ]]; then
      echo "build: $hook is a hook of your own; for the commit-msg check too, see CONTRIBUTING.md"
      return 0
    fi
  done
  git -C "$ROOT" config core.hooksPath scripts/git-hooks
  echo "build: git now runs scripts/git-hooks (commit-msg: CONTRIBUTING.md)"
}
install_git_hooks

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
