#!/usr/bin/env bash
# Step time of GPT-2 124M data-parallel training on 2 CPU ranks whose link is slowed to a cluster-
# like bandwidth, for each gradient codec and for `auto` (issue #4's benchmark; bench/RESULTS.md).
#
# How the link is slowed: both ranks run on this machine and talk MPI over TCP (--mca btl tcp,self)
# to this host's first global IPv4 address; that traffic passes through the loopback device, where
# an HTB class limited to 2 x LINK_GBIT Gbit/s (shared by the two directions, so each direction of
# a symmetric collective gets LINK_GBIT) shapes it. PMIx/launcher traffic on 127.0.0.1 is not
# shaped. Needs root (tc); removes its qdisc on exit. The measured collective bandwidth is printed
# first so the emulated link can be checked.
#
# (The interface is named by name: Open MPI 4.1's TCP BTL stalled on large messages when given
# a /32 address here.)
#
# Usage: scripts/bench_slow_link.sh [steps]     env: LINK_GBIT (default 1; 0 = unshaped shared
#        memory, the fast-link reference), CODECS, MODEL, B, T
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
STEPS="${1:-8}"
LINK_GBIT="${LINK_GBIT:-1}"
CODECS="${CODECS:-none bf16 int8 sign topk:0.01 auto}"
MODEL="${MODEL:-configs/model/gpt2-124m.json}"
B="${B:-4}"
T="${T:-64}"
BUILD="${BUILD:-build}"
[[ -x "$BUILD/trainflow" && -x "$BUILD/bench/collectives_mpi_bench" ]] || {
  echo "bench_slow_link: build first (scripts/build.sh; needs $BUILD/trainflow and collectives_mpi_bench)" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || { echo "bench_slow_link: needs root for tc" >&2; exit 1; }
IFACE=$(ip -4 -o addr show scope global | awk '{print $2}' | head -1)
IP=$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)
[[ -n "$IP" ]] || { echo "bench_slow_link: no global IPv4 address to route MPI traffic through" >&2; exit 1; }
[[ -f data/fortunes/train.bin ]] || ./"$BUILD"/trainflow prepare --input /usr/share/games/fortunes --delimiter % \
  --val-fraction 0.05 --out-dir data/fortunes >/dev/null

cleanup() { tc qdisc del dev lo root 2>/dev/null || true; }
trap cleanup EXIT
cleanup
if [[ "$LINK_GBIT" == "0" ]]; then
  # The fast-link reference: MPI's default transport (shared memory between the two ranks).
  MPI=(mpirun --allow-run-as-root --oversubscribe -np 2 -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE)
  echo "== link: unshaped, MPI's default transport (shared memory)"
else
  RATE="$((2 * LINK_GBIT))gbit"
  tc qdisc add dev lo root handle 1: htb default 10 r2q 100000
  tc class add dev lo parent 1: classid 1:10 htb rate 100gbit burst 4m cburst 4m
  tc class add dev lo parent 1: classid 1:20 htb rate "$RATE" ceil "$RATE" burst 256k cburst 256k
  tc filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst "$IP/32" flowid 1:20
  MPI=(mpirun --allow-run-as-root --oversubscribe --mca btl tcp,self --mca btl_tcp_if_include "$IFACE" -np 2
       -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE)
  echo "== link: MPI over TCP to $IP, loopback shaped to $RATE shared (~${LINK_GBIT} Gbit/s per direction)"
fi
"${MPI[@]}" "$BUILD/bench/collectives_mpi_bench" --benchmark_filter='AllReduce/16777216' 2>&1 | grep -E "AllReduce" || true

OUT=$(mktemp -d)
printf "\n%-10s %12s %12s %14s %12s %10s\n" codec "step_ms" "exposed_ms" "MB_sent/step" "final_loss" "vs_none"
declare -A MS LOSS
for c in $CODECS; do
  d="$OUT/${c//:/_}"
  "${MPI[@]}" "$BUILD/trainflow" train --model "$MODEL" --train configs/train/fortunes.json --max_steps "$STEPS" \
    --batch_size "$B" --seq_len "$T" --warmup_steps 2 --lr 6e-4 --min_lr 6e-5 --eval_interval 0 --sample_tokens 0 \
    --shuffle false --log_interval 1 --compression "$c" --out_dir "$d" >"$d.log" 2>&1 || { echo "$c failed:"; tail -5 "$d.log"; continue; }
  chosen=$(grep -o "compression [a-z0-9:.-]* (auto[^)]*)" "$d.log" || true)
  read -r ms exposed sent loss < <(python3 - "$d/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
steady = rows[2:] if len(rows) > 3 else rows
print(statistics.median(r["ms"] for r in steady), statistics.median(r.get("comm_exposed_ms", 0) for r in steady),
      statistics.median(r.get("wire_bytes", 0) for r in steady) / 1e6, rows[-1]["loss"])
PY
)
  MS[$c]=$ms; LOSS[$c]=$loss
  speed=$(python3 -c "print(f'{${MS[none]:-$ms}/$ms:.2f}x')")
  printf "%-10s %12.0f %12.0f %14.1f %12.4f %10s\n" "$c" "$ms" "$exposed" "$sent" "$loss" "$speed"
  [[ -n "$chosen" ]] && echo "           $chosen"
done
echo "(step_ms and exposed_ms: medians over steps 3..$STEPS; final_loss: mean training loss of step $STEPS; logs in $OUT)"
