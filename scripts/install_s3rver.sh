#!/usr/bin/env bash
# Installs s3rver (a local S3-compatible server on Node.js, npm package s3rver@3.7.1) for the S3
# checkpoint-store tests (tests/integration/checkpoint/s3_store_test.cpp; docs/s3.md).
#
# Usage: scripts/install_s3rver.sh [dest_dir]
#   dest_dir defaults to third_party/s3rver under the repository root (git-ignored); the server is
#   then dest_dir/node_modules/s3rver/bin/s3rver.js, run with `node`.
#
# Idempotent: does nothing (and needs no network) when dest_dir already holds s3rver 3.7.1.
# Otherwise it runs `npm install` into a temporary directory next to dest_dir (npm's cache is used
# first, so a warm cache needs no network) and renames it into place, so an interrupted run never
# leaves a half installation. Exits non-zero with a message naming the failing step.
set -euo pipefail

readonly VERSION="3.7.1"
readonly PACKAGE="s3rver@${VERSION}"
readonly REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-${REPO_ROOT}/third_party/s3rver}"
DEST="${DEST%/}"

die() { echo "install_s3rver: error: $*" >&2; exit 1; }

installed_version() {  # prints the version installed in $1, or nothing
  local pkg="$1/node_modules/s3rver/package.json"
  [[ -s "${pkg}" && -s "$1/node_modules/s3rver/bin/s3rver.js" ]] || return 0
  sed -n 's/^ *"version": *"\([^"]*\)".*/\1/p' "${pkg}" | head -n1
}

if [[ "$(installed_version "${DEST}")" == "${VERSION}" ]]; then
  echo "install_s3rver: ${DEST} already has s3rver ${VERSION}; nothing to do"
  exit 0
fi

command -v node >/dev/null 2>&1 || die "node not found on PATH (install nodejs, e.g. scripts/install_deps.sh)"
command -v npm >/dev/null 2>&1 || die "npm not found on PATH (install npm, e.g. scripts/install_deps.sh)"

mkdir -p "$(dirname "${DEST}")" || die "cannot create $(dirname "${DEST}")"
TMP="$(mktemp -d "${DEST}.tmp.XXXXXX")" || die "mktemp next to ${DEST} failed"
trap 'rm -rf "${TMP}"' EXIT

echo "install_s3rver: npm install ${PACKAGE} (in ${TMP})"
# A package.json of our own keeps npm from walking up into the repository looking for one.
echo '{"name": "trainflow-s3rver", "private": true}' > "${TMP}/package.json"
( cd "${TMP}" && npm install --prefer-offline --no-audit --no-fund --omit=dev --loglevel=error \
    --save-exact "${PACKAGE}" >/dev/null ) \
  || die "npm install ${PACKAGE} failed (is the npm registry, or a warm npm cache, reachable?)"

[[ "$(installed_version "${TMP}")" == "${VERSION}" ]] || die "npm installed no s3rver ${VERSION} in ${TMP}"
node "${TMP}/node_modules/s3rver/bin/s3rver.js" --version >/dev/null 2>&1 \
  || die "node cannot run ${TMP}/node_modules/s3rver/bin/s3rver.js"

rm -rf "${DEST}" || die "cannot remove the old ${DEST}"
mv "${TMP}" "${DEST}" || die "cannot rename ${TMP} to ${DEST}"
trap - EXIT
echo "install_s3rver: installed s3rver ${VERSION} in ${DEST} (run: node ${DEST}/node_modules/s3rver/bin/s3rver.js)"
