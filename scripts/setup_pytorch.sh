#!/usr/bin/env bash
# Install Debian's PyTorch (python3-torch, CPU) and the OpenMP build of
# OpenBLAS, then point the BLAS/LAPACK/OpenBLAS alternatives at the
# openblas-openmp variants.  Idempotent: safe to run repeatedly.
#
# Usage: sudo scripts/setup_pytorch.sh      (or as root)
# Afterwards use /usr/bin/python3 (Debian's python) to run the scripts in
# scripts/pytorch_*.py; a pyenv/venv python on PATH will not see python3-torch.
set -euo pipefail

PKGS=(python3-torch libopenblas0-openmp)
ARCHDIR=/usr/lib/x86_64-linux-gnu
OMPDIR=$ARCHDIR/openblas-openmp

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "setup_pytorch.sh: need root or sudo" >&2; exit 1; fi
fi

is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for p in "${PKGS[@]}"; do
    is_installed "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "== installing: ${missing[*]}"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "== packages already installed: ${PKGS[*]}"
fi

# Point an alternative at the openblas-openmp variant (found via --list).
set_alt() {
    local name=$1 target
    target=$(update-alternatives --list "$name" 2>/dev/null | grep -F "$OMPDIR/" | head -n1 || true)
    if [ -z "$target" ]; then
        echo "WARNING: no openblas-openmp candidate for $name" >&2
        update-alternatives --list "$name" >&2 || true
        return 1
    fi
    local current status
    current=$(update-alternatives --query "$name" | awk '/^Value:/{print $2}')
    status=$(update-alternatives --query "$name" | awk '/^Status:/{print $2}')
    if [ "$current" = "$target" ] && [ "$status" = "manual" ]; then
        echo "== $name already -> $target (manual)"
    else
        # --set also switches the group to manual mode, so a later install of
        # e.g. libopenblas0-pthread (higher priority) cannot silently take over.
        echo "== $name: ${current:-<none>} ($status) -> $target (manual)"
        $SUDO update-alternatives --set "$name" "$target"
    fi
}

rc=0
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu libopenblas.so.0-x86_64-linux-gnu; do
    set_alt "$alt" || rc=1
done

echo
echo "== resulting alternatives"
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu libopenblas.so.0-x86_64-linux-gnu; do
    printf '%-36s -> %s [%s]\n' "$alt" "$(update-alternatives --query "$alt" 2>/dev/null | awk '/^Value:/{print $2}')" \
        "$(update-alternatives --query "$alt" 2>/dev/null | awk '/^Status:/{print $2}')"
done
for l in libblas.so.3 liblapack.so.3 libopenblas.so.0; do
    printf '%-36s => %s\n' "$ARCHDIR/$l" "$(readlink -f "$ARCHDIR/$l" 2>/dev/null || echo missing)"
done

echo
/usr/bin/python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__, "threads", torch.get_num_threads())' || rc=1
exit $rc
