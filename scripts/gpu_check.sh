#!/usr/bin/env bash
# The GPU check, run on a one-GPU machine (e.g. the device tool's H200) from the repository root,
# with gpu_bundle/ made on the build machine by scripts/gpu_bundle.sh (the GPU machine has the CUDA
# toolkit but none of Debian's -dev packages, so binaries are built elsewhere and carried).
#
#   1. the CUDA-vs-CPU kernel tests (all_cuda_tests; every tests/**/*_cuda_test.cpp),
#   2. an end-to-end `trainflow bench` of GPT-2 124M at B=16, T=1024 on the GPU (tokens/s, MFU):
#      bf16 with the defaults (and a per-piece GPU time profile), bf16 with each epilogue fusion
#      switched, bf16 with cuDNN's fused attention (deterministic and atomic backward), fp32,
#   3. `trainflow train --device cuda` on the default corpus, without and with int8 gradient
#      compression (the device reducer with the CUDA codecs and NCCL at world size 1), with the
#      monitor's NVML metrics scraped mid-run (real GPU: found by its PCI bus id),
#   4. GPT-2 1558M at T=1024, B=24 with recompute 2: does it fit, and the device memory in use,
#   5. the CUDA kernel benchmarks (every bench/*_cuda_bench.cpp: GB/s, TFLOP/s against peaks),
#   6. Hugging Face interop (CPU; here because this machine has transformers): exported weights load
#      with the same loss,
#   7. compute-sanitizer (memcheck, racecheck) on the flash attention kernels' small-shape tests,
# in order of what the issue needs most (the model's MFU first), ending with a short table. Every
# step runs under `timeout`, and the timeouts are cut to what is
# left of a global budget (GPU_CHECK_BUDGET seconds, default 470: the whole script stays within
# 8 minutes; a step with no time left is skipped and says so). The full log goes to
# $OUT/gpu_check.log (or ./gpu_check.log without $OUT).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUTDIR="${OUT:-$ROOT}"
LOG="$OUTDIR/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
B="$ROOT/gpu_bundle"
declare -a SUMMARY=()
BUDGET="${GPU_CHECK_BUDGET:-470}"
START=$SECONDS
# bounded N [R]: N seconds, or what is left of the budget less R seconds kept for later steps (and 10
# for the summary) if that is less; at least 1 (`timeout 0` would mean no limit). Callers skip a step
# when the answer is too short to be useful.
bounded() {
  local left=$((BUDGET - (SECONDS - START) - 10 - ${2:-0}))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader || true
if [[ -f "$ROOT/gpu_carry/gpu_bundle.tgz" ]]; then
  tar -C "$ROOT" -xzf "$ROOT/gpu_carry/gpu_bundle.tgz"
fi
if [[ ! -x "$B/bin/all_cuda_tests" ]]; then
  echo "gpu_check: error: $B/bin missing: run scripts/gpu_bundle.sh on the build machine and carry gpu_bundle"
  exit 1
fi

# CUDA libraries of this machine: the toolkit's lib64 and the driver's libcuda.
CUDA_LIBS="${CUDA_HOME:-/usr/local/cuda}/lib64"
libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}')
[[ -z "$libcuda" ]] && libcuda=$(ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null | head -1)
[[ -n "$libcuda" ]] && CUDA_LIBS="$CUDA_LIBS:$(dirname "$libcuda")"
# NCCL and cuDNN: where PyTorch's wheels put them (nvidia-nccl-cu13, nvidia-cudnn-cu13) when the
# system has none; both are dlopen()ed by trainflow, so only the search path matters (after the
# toolkit's lib64, so the toolkit's cuBLAS wins). cuDNN's fused attention compiles its kernels with
# NVRTC at run time (nvidia-cuda-nvrtc).
PY_NVIDIA_LIBS=$(python3 - 2>/dev/null <<'PY'
import importlib, os
dirs = []
for name in ("nvidia.nccl", "nvidia.cudnn", "nvidia.cuda_nvrtc", "nvidia.cu13"):
    try:
        m = importlib.import_module(name)
        for p in getattr(m, "__path__", []):
            if os.path.isdir(os.path.join(p, "lib")):
                dirs.append(os.path.join(p, "lib"))
    except Exception:
        pass
print(":".join(dirs))
PY
)
[[ -n "$PY_NVIDIA_LIBS" ]] && CUDA_LIBS="$CUDA_LIBS:$PY_NVIDIA_LIBS"
echo "CUDA libraries from: $CUDA_LIBS"

# Run a bundled binary: directly with the bundled libraries first; if it cannot start (other
# glibc), through the bundled glibc loader.
MODE=direct
if ! LD_LIBRARY_PATH="$B/lib:$CUDA_LIBS" "$B/bin/trainflow" --version >/dev/null 2>&1; then
  MODE=loader
fi
echo "binaries run: $MODE"
run() {
  local bin="$1"; shift
  if [[ $MODE == direct ]]; then
    LD_LIBRARY_PATH="$B/lib:$CUDA_LIBS" "$B/bin/$bin" "$@"
  else
    "$B/lib/ld-linux-x86-64.so.2" --library-path "$B/lib:$CUDA_LIBS" "$B/bin/$bin" "$@"
  fi
}

echo; echo "== environment (trainflow env)"
run trainflow env 2>&1 | tee "$OUTDIR/env.txt"
while read -r line; do SUMMARY+=("$line"); done < <(grep -E '^(GPUs|  cuda:0|NCCL|cuDNN):' "$OUTDIR/env.txt")

echo; echo "== 1. CUDA kernel tests"
# (Output to a file first: a `| head` in the pipeline would kill the tests with SIGPIPE. cuDNN's
# error log goes with it: a cuDNN plan that fails to build prints the library's whole error stack.)
CUDNN_LOGERR_DBG=1 CUDNN_LOGDEST_DBG=stderr timeout "$(bounded 200 200)" \
  bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run all_cuda_tests" >"$OUTDIR/cuda_tests.txt" 2>&1
tests_rc=$?
grep -E "^\[  (FAILED|PASSED) |: Failure$" "$OUTDIR/cuda_tests.txt" | head -40  # (not cuDNN's log lines)
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$OUTDIR/cuda_tests.txt")
failed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$OUTDIR/cuda_tests.txt")
skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$OUTDIR/cuda_tests.txt")
SUMMARY+=("CUDA tests: rc=$tests_rc passed=$passed failed=$failed skipped=$skipped")
# A crash (or a sticky CUDA error, which fails every later test in the process) hides which suites
# are really broken: then run each suite in a process of its own, for a per-suite verdict, within
# 90 s in all. Not after a timeout (124: the suites would time out again) nor after plain failures
# (the run's own report names them).
crashed=0
if ((tests_rc >= 128)) || { ((tests_rc != 0 && tests_rc != 124)) && ! grep -qE '^\[  (PASSED|FAILED)  \] [0-9]+ test' "$OUTDIR/cuda_tests.txt"; }; then
  crashed=1
fi
if ((crashed)); then
  rerun_end=$((SECONDS + 90))
  suites=$(run all_cuda_tests --gtest_list_tests 2>/dev/null | grep -E '^[A-Za-z0-9_/]+\.' | sed 's/\..*//')
  for suite in $suites; do
    t=$(bounded 30 200)
    ((t > rerun_end - SECONDS)) && t=$((rerun_end - SECONDS))
    if ((t < 5)); then SUMMARY+=("  suites from $suite on: not rerun (time)"); break; fi
    timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run all_cuda_tests \
      --gtest_filter='$suite.*'" >"$OUTDIR/suite_${suite//\//_}.txt" 2>&1
    rc=$?
    verdict=$(grep -E '^\[  (PASSED|FAILED) ' "$OUTDIR/suite_${suite//\//_}.txt" | tr '\n' ' ')
    [[ $rc -ne 0 ]] && SUMMARY+=("  suite $suite alone: rc=$rc $verdict")
  done
fi

echo; echo "== 2. end-to-end trainflow bench on the GPU"
# bf16 with the defaults (flash attention, residual adds folded into the GEMMs, GELU separate),
# each epilogue fusion switched (GELU forward, GELU forward+backward, residual unfused: which ones
# pay), fp32 (the CPU-checkable mode).
bench_e2e() {  # label, seconds to keep for later steps, then trainflow bench arguments
  local label="$1" keep="$2"; shift 2
  local t; t=$(bounded 60 "$keep")
  if ((t < 15)); then SUMMARY+=("$label: skipped (time budget)"); return; fi
  local line
  line=$(timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run trainflow bench \
    --device cuda $*" 2>&1 | tee -a "$OUTDIR/e2e.txt" | grep BENCH_RESULT)
  SUMMARY+=("$label: ${line:-failed (see e2e.txt)}")
}
: >"$OUTDIR/e2e.txt"
if run trainflow bench --help 2>/dev/null | grep -q -- "--gelu-fusion"; then
  E2E="--model configs/model/gpt2-124m.json --batch-size 16 --seq-len 1024 --steps 20 --warmup 5"
  bench_e2e "GPT-2 124M B=16 T=1024 bf16" 160 --dtype bf16 --profile-steps 3 $E2E  # keeps 160 s for training, 1558M, kernel benches
  # Where the bf16 step's GPU time goes (the 8 largest pieces; the whole table is in e2e.txt).
  while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^PROFILE ' "$OUTDIR/e2e.txt" | head -8)
  # The same step with every piece at its roofline (model/step_work.h): the MFU this structure allows.
  while read -r line; do SUMMARY+=("  ${line#bench: }"); done < <(grep -E '^bench: roofline step' "$OUTDIR/e2e.txt" | head -1)
  bench_e2e "GPT-2 124M B=16 T=1024 bf16 gelu fusion 1" 160 --dtype bf16 --gelu-fusion 1 $E2E
  bench_e2e "GPT-2 124M B=16 T=1024 bf16 gelu fusion 2" 160 --dtype bf16 --gelu-fusion 2 $E2E
  bench_e2e "GPT-2 124M B=16 T=1024 bf16 residual unfused" 160 --dtype bf16 --no-fuse-residual $E2E
  n0=$(wc -l <"$OUTDIR/e2e.txt")
  bench_e2e "GPT-2 124M B=16 T=1024 bf16 cuDNN attention" 160 --dtype bf16 --attention cudnn --profile-steps 1 $E2E
  # Attention's GPU time per step with cuDNN (this run's PROFILE lines only).
  while read -r line; do SUMMARY+=("  cuDNN $line"); done < <(tail -n +$((n0 + 1)) "$OUTDIR/e2e.txt" \
    | grep -E '^PROFILE attention')
  bench_e2e "GPT-2 124M B=16 T=1024 bf16 cuDNN attention, atomic dQ" 160 --dtype bf16 --attention cudnn \
    --nondeterministic-attention $E2E
  bench_e2e "GPT-2 124M B=16 T=1024 fp32" 160 --dtype fp32 $E2E
else
  SUMMARY+=("end-to-end: this build's trainflow bench has no --gelu-fusion option (old bundle?)")
fi

echo; echo "== 3. GPU training on the default corpus (byte-small, 300 steps, bf16; CPU reference: val 2.5865)"
if [[ -f "$B/data/train.bin" ]]; then
  : >"$OUTDIR/train.txt"
  # The monitor on the real GPU: NVML found by the rank's PCI bus id, its gauges scraped mid-run
  # (a poller reads the endpoint the log names; gpu_metrics.txt).
  python3 - "$OUTDIR/train.txt" "$OUTDIR/gpu_metrics.txt" <<'PY' &
import re, sys, time, urllib.request
for _ in range(90):
    time.sleep(1)
    try:
        m = re.search(r"monitor: rank 0 at (http://[0-9.]+:\d+)/", open(sys.argv[1]).read())
        if m:
            text = urllib.request.urlopen(m.group(1) + "/metrics", timeout=5).read().decode()
            gpu = [l for l in text.splitlines() if l.startswith("trainflow_gpu_")]
            if gpu:
                open(sys.argv[2], "w").write("\n".join(gpu) + "\n")
                break
    except OSError:
        pass
PY
  POLLER=$!
  for c in none int8; do
    t=$(bounded 35 110)  # keeps 110 s for the 1558M step and the kernel benchmarks
    if ((t < 10)); then SUMMARY+=("GPU train compression $c: skipped (time budget)"); continue; fi
    line=$(timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run trainflow train \
      --device cuda --dtype bf16 --model configs/model/byte-small.json --train configs/train/fortunes.json \
      --train_data $B/data/train.bin --val_data $B/data/val.bin --max_steps 300 --eval_interval 0 \
      --sample_tokens 0 --log_interval 100 --out_dir $OUTDIR/train_$c --compression $c \
      --metrics_addr 127.0.0.1:0" 2>&1 \
      | tee -a "$OUTDIR/train.txt" | grep -E "eval  step|error" | tail -1)
    ms=$(grep -E "^step +300/300" "$OUTDIR/train.txt" | tail -1 | sed -n 's/.*| *\([0-9.]*\) ms.*/\1/p')
    SUMMARY+=("GPU train compression $c: ${line:-failed (see train.txt)} (last step ${ms:-?} ms)")
  done
  kill "$POLLER" 2>/dev/null; wait "$POLLER" 2>/dev/null
  nvml=$(grep -m1 -oE "monitor: (NVML|no NVML).*" "$OUTDIR/train.txt")
  gpu_lines=$(wc -l <"$OUTDIR/gpu_metrics.txt" 2>/dev/null || echo 0)
  SUMMARY+=("GPU monitor: ${nvml:-no NVML line in train.txt}; ${gpu_lines} trainflow_gpu_ series scraped mid-run")
else
  SUMMARY+=("GPU train: no data in the bundle")
fi

echo; echo "== 3b. Checkpoint stall on the GPU (GPT-2 124M shape, byte vocabulary, B=8 T=512, every 10 steps)"
# The loop's stall per checkpoint (checkpoint_stall_ms in metrics.jsonl: pinned copy queued on the
# copy stream) against the synchronous save of the same bytes (checkpoint_async false), and the
# step time next to a checkpoint against the others (the copy overlaps forward/backward).
if [[ -f "$B/data/train.bin" ]]; then
  : >"$OUTDIR/ckpt_stall.txt"
  for mode in true false; do
    t=$(bounded 45 100)
    if ((t < 15)); then SUMMARY+=("GPU checkpoint stall (async $mode): skipped (time budget)"); continue; fi
    rm -rf "$OUTDIR/ckpt_$mode"
    timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run trainflow train \
      --device cuda --dtype bf16 --model configs/model/gpt2-124m.json --vocab_size 256 --padded_vocab_size 256 \
      --train_data $B/data/train.bin --max_steps 40 --batch_size 8 --seq_len 512 --eval_batches 0 --sample_tokens 0 \
      --log_interval 10 --out_dir $OUTDIR/ckpt_run_$mode --checkpoint_dir $OUTDIR/ckpt_$mode --checkpoint_interval 10 \
      --checkpoint_async $mode --checkpoint_when_busy wait" >>"$OUTDIR/ckpt_stall.txt" 2>&1
    line=$(python3 - "$OUTDIR/ckpt_run_$mode/metrics.jsonl" <<'PY'
import json, statistics, sys
try:
    recs = [r for r in map(json.loads, open(sys.argv[1])) if "event" not in r]
except OSError:
    print("no metrics"); sys.exit()
stall = [r["checkpoint_stall_ms"] for r in recs if "checkpoint_stall_ms" in r]
plain = [r["ms"] for r in recs[3:] if "checkpoint_stall_ms" not in r]
after = [r["ms"] for r in recs if r["step"] % 10 == 1 and r["step"] > 10]
print(f"stall median {statistics.median(stall):.1f} ms over {len(stall)} checkpoints; step median "
      f"{statistics.median(plain):.1f} ms, step after a checkpoint median {statistics.median(after):.1f} ms"
      if stall and plain and after else "incomplete")
PY
)
    SUMMARY+=("GPU checkpoint (async $mode): $line")
  done
else
  SUMMARY+=("GPU checkpoint stall: no data in the bundle")
fi

echo; echo "== 4. GPT-2 1558M, T=1024, B=24, bf16, recompute 2 (fits 80 GB? device memory in use vs the plan)"
: >"$OUTDIR/e2e_1558m.txt"
if run trainflow bench --help 2>/dev/null | grep -q -- "--recompute"; then
  t=$(bounded 90 60)  # keeps 60 s for the kernel benchmarks
  if ((t < 30)); then
    SUMMARY+=("GPT-2 1558M B=24 T=1024 bf16 recompute 2: skipped (time budget)")
  else
    line=$(timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run trainflow bench \
      --device cuda --dtype bf16 --recompute 2 --model configs/model/gpt2-1558m.json --batch-size 24 --seq-len 1024 \
      --steps 3 --warmup 1" 2>&1 | tee "$OUTDIR/e2e_1558m.txt" | grep BENCH_RESULT)
    SUMMARY+=("GPT-2 1558M B=24 T=1024 bf16 recompute 2: ${line:-failed (see e2e_1558m.txt)}")
    grep -E "^bench: bf16 on CUDA" "$OUTDIR/e2e_1558m.txt"
    mem=$(grep -E "^bench: bf16 on CUDA" "$OUTDIR/e2e_1558m.txt" | sed -n 's/.*device memory \(.*\)$/\1/p')
    [[ -n "$mem" ]] && SUMMARY+=("  1558M device memory: $mem")
  fi
fi

echo; echo "== 5. CUDA kernel benchmarks"
for bench in "$B"/bin/*_cuda_bench; do
  [[ -x "$bench" ]] || continue
  name=$(basename "$bench")
  t=$(bounded 60 50)  # keeps 50 s for the HF interop check and the sanitizers
  if ((t < 10)); then SUMMARY+=("$name: skipped (time budget)"); continue; fi
  timeout "$t" bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run $name --benchmark_min_time=0.1" \
    >"$OUTDIR/$name.txt" 2>&1
  grep -E "^BM_|ceiling|peak" "$OUTDIR/$name.txt" | head -60
  SUMMARY+=("$name: $(grep -c '^BM_' "$OUTDIR/$name.txt") benchmarks (full table in $name.txt)")
done
# Flash attention vs the GEMM baseline at GPT-2 124M training shapes (bf16), for the summary.
if [[ -f "$OUTDIR/attention_cuda_bench.txt" ]]; then
  while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^BM_(Flash|Gemm)/(fwd|bwd)/shape:0/dt:1/(simt:0/)?manual_time' \
    "$OUTDIR/attention_cuda_bench.txt" | awk '{printf "%-40s %s %s", $1, $2, $3; for (i = 4; i <= NF; ++i) if ($i ~ /TFLOP|of_peak/) printf " %s", $i; print ""}')
fi
# The 16-byte accesses against the same kernels' one-element path (scalar:1, misaligned pointers), bf16.
if [[ -f "$OUTDIR/kernels_cuda_bench.txt" ]]; then
  while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^BM_Cuda(Elementwise/op:[0-9]/bf16:1|LayerNormForward/bf16:1|CrossEntropy/bf16:1/grad:1)/scalar' \
    "$OUTDIR/kernels_cuda_bench.txt" | awk '{printf "%-56s %s %s", $1, $2, $3; for (i = 4; i <= NF; ++i) if ($i ~ /bytes_per_second|of_copy_bw/) printf " %s", $i; print ""}')
fi
# Each epilogue fusion against the kernels it replaces (bf16), for the summary.
if [[ -f "$OUTDIR/matmul_attention_cuda_bench.txt" ]]; then
  while read -r line; do SUMMARY+=("  $line"); done < <(grep -E '^BM_Epilogue/.*/1/manual_time' \
    "$OUTDIR/matmul_attention_cuda_bench.txt" | awk '{printf "%-44s %s %s", $1, $2, $3; for (i = 4; i <= NF; ++i) if ($i ~ /TFLOP/) printf " %s", $i; print ""}')
fi

echo; echo "== 6. Hugging Face interop (CPU): exported weights load in transformers with the same loss"
HF=$(mktemp -d)
if timeout 60 bash -c "$(declare -f run); B='$B' CUDA_LIBS='$CUDA_LIBS' MODE='$MODE' run trainflow prepare \
     --input README.md docs --out-dir $HF/data --val-fraction 0" >/dev/null &&
   run trainflow export --init --seed 3 --model configs/model/byte-tiny.json --out "$HF/model" >/dev/null; then
  tf_loss=$(run trainflow eval --weights "$HF/model/model.safetensors" --data "$HF/data/train.bin" --batch-size 2 \
    --seq-len 64 --batches 3 | sed -n 's/.*: loss \([0-9.]*\).*/\1/p')
  hf_line=$(timeout "$(bounded 60)" python3 scripts/hf_interop_check.py "$HF/model" "$HF/data/train.bin" 2 64 3 \
    "$tf_loss" 2>&1 | tail -1)
  SUMMARY+=("${hf_line:-HF_INTEROP FAIL: no output}")
else
  SUMMARY+=("HF_INTEROP FAIL: could not prepare/export")
fi

echo; echo "== 7. compute-sanitizer on the flash attention kernels (small shapes)"
SANITIZER="${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer"
if [[ $MODE == direct && -x "$SANITIZER" ]]; then
  for tool in memcheck racecheck; do
    t=$(bounded 45)
    if ((t < 10)); then SUMMARY+=("sanitizer $tool: skipped (time budget)"); continue; fi
    LD_LIBRARY_PATH="$B/lib:$CUDA_LIBS" timeout "$t" "$SANITIZER" --tool "$tool" \
      "$B/bin/all_cuda_tests" --gtest_filter='*FlashAttentionCuda.SmallShapesMatchCpu/*:FlashAttentionCudaArgs.*' \
      >"$OUTDIR/sanitizer_$tool.txt" 2>&1
    rc=$?
    SUMMARY+=("sanitizer $tool: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUTDIR/sanitizer_$tool.txt" | tail -1)")
  done
else
  SUMMARY+=("sanitizer: not run (mode $MODE, $SANITIZER)")
fi

echo; echo "== summary ($((SECONDS - START)) s of a ${BUDGET} s budget)"
for s in "${SUMMARY[@]}"; do echo "  $s"; done
