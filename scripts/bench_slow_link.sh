#!/usr/bin/env bash
# Step time of GPT-2 124M data-parallel training on 2 CPU ranks joined by a slow link, for each
# gradient codec and for `auto` (bench/RESULTS.md, "Data parallelism: gradient codecs").
#
# The link: two network namespaces (tfslow-a 10.231.0.1, tfslow-b 10.231.0.2) joined by a veth
# pair whose two ends are each shaped to LINK_GBIT Gbit/s (tbf), so every direction gets the
# bandwidth a cluster link gives it. mpirun runs in tfslow-a and starts the second "host" through
# scripts/netns_rsh.sh; all MPI traffic (launcher and TCP BTL) stays on 10.231.0.0/24, nothing
# leaves this machine. Needs root (ip netns, tc); removes the namespaces on exit. The measured
# collective bandwidth is printed first so the emulated link can be checked.
#
# Usage: scripts/bench_slow_link.sh [steps]     env: LINK_GBIT (default 1; 0 = unshaped shared
#        memory on one host, the fast-link reference), CODECS, MODEL, B, T
# CODECS may also name ZeRO stages: `zero1`, `zero2`, `zero3` run compression none with that
# zero_stage (the bytes per step: docs/distributed.md, "ZeRO").
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
# The fortunes, tokenized for the model's vocabulary (GPT-2's for the gpt2-* models, bytes otherwise).
if grep -q '"vocab_size": *50257' "$MODEL"; then TOK=gpt2; else TOK=byte; fi
DATA="data/fortunes-$TOK"
[[ -f "$DATA/train.bin" ]] || ./"$BUILD"/trainflow prepare --input /usr/share/games/fortunes --delimiter % \
  --val-fraction 0.05 --tokenizer "$TOK" --tokenizer-dir third_party/gpt2-tokenizer --out-dir "$DATA" >/dev/null

NS_A=tfslow-a NS_B=tfslow-b NET=10.231.0
cleanup() { ip netns del "$NS_A" 2>/dev/null || true; ip netns del "$NS_B" 2>/dev/null || true; }
trap cleanup EXIT
cleanup
if [[ "$LINK_GBIT" == "0" ]]; then
  # The fast-link reference: MPI's default transport (shared memory between the two ranks).
  MPI=(mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -np 2
       -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE)
  echo "== link: unshaped, MPI's default transport (shared memory)"
else
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  ip link add tfslow-va type veth peer name tfslow-vb
  ip link set tfslow-va netns "$NS_A"
  ip link set tfslow-vb netns "$NS_B"
  ip -n "$NS_A" addr add "$NET.1/24" dev tfslow-va
  ip -n "$NS_B" addr add "$NET.2/24" dev tfslow-vb
  for pair in "$NS_A tfslow-va" "$NS_B tfslow-vb"; do
    read -r ns dev <<<"$pair"
    ip -n "$ns" link set lo up
    ip -n "$ns" link set "$dev" up
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "${LINK_GBIT}gbit" burst 1mb latency 100ms
  done
  HOSTS="$(mktemp)"
  printf "%s.1 slots=1\n%s.2 slots=1\n" "$NET" "$NET" >"$HOSTS"
  MPI=(ip netns exec "$NS_A" mpirun --allow-run-as-root --hostfile "$HOSTS" --mca plm_rsh_agent "$ROOT/scripts/netns_rsh.sh"
       --mca oob_tcp_if_include "$NET.0/24" --mca btl tcp,self --mca btl_tcp_if_include "$NET.0/24" -np 2
       -x OMP_NUM_THREADS=1 -x OMP_WAIT_POLICY=PASSIVE)
  echo "== link: two namespaces joined by a veth pair, each direction shaped to ${LINK_GBIT} Gbit/s"
fi
"${MPI[@]}" "$BUILD/bench/collectives_mpi_bench" --benchmark_filter='AllReduce/16777216' 2>&1 | grep -E "AllReduce" || true

OUT=$(mktemp -d)
printf "\n%-10s %12s %12s %14s %12s %10s\n" codec "step_ms" "exposed_ms" "MB_sent/step" "final_loss" "vs_none"
declare -A MS LOSS
for c in $CODECS; do
  d="$OUT/${c//:/_}"
  "${MPI[@]}" "$BUILD/trainflow" train --model "$MODEL" --train configs/train/fortunes.json --max_steps "$STEPS" \
    --train_data "$DATA/train.bin" --val_data "$DATA/val.bin" --tokenizer "$TOK" \
    --batch_size "$B" --seq_len "$T" --warmup_steps 2 --lr 6e-4 --min_lr 6e-5 --eval_interval 0 --sample_tokens 0 \
    --shuffle false --log_interval 1 $(if [[ $c == zero* ]]; then echo "--compression none --zero_stage ${c#zero}"; \
      else echo "--compression $c"; fi) --out_dir "$d" >"$d.log" 2>&1 || { echo "$c failed:"; tail -5 "$d.log"; continue; }
  chosen=$(grep -o "compression [a-z0-9:.-]* (auto.*" "$d.log" | head -1 || true)
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
