#!/usr/bin/env python3
"""scripts/gpu_results_md.py on a made-up gpu_check.sh log: the summary table, the per-piece
profile with its roofline columns, the defaults-vs-switch decisions, and a clean error for a log
whose check did not finish. (Run by CTest as gpu_results_md_test.)"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "gpu_results_md.py")
BASE = "GPT-2 124M B=16 T=1024 bf16"


def bench(ms):
    return (f"BENCH_RESULT ms_per_step={ms:.3f} tokens_per_s={16384 / ms * 1000:.1f} gflops=1.0 "
            "gemm_peak_gflops=0.00 mfu=0.4100 mfu_with_attention=0.4400 device_used_gb=9.10")


LOG = "\n".join([
    "== gpu_check 2026-12-03T10:00:00Z on host",
    "NVIDIA H200, 580.1, 143771 MiB, 1980 MHz",
    "(the steps' own output)",
    "== summary (400 s of a 470 s budget)",
    "  CUDA tests: rc=0 passed=140 failed= skipped=3",
    f"  {BASE}: {bench(30.0)}",
    "  PROFILE attention bwd        3.123 ms  12.0%    12.0 calls  roofline    0.812 ms, at  26.0%",
    "  PROFILE tokens to device     0.010 ms   0.1%     1.0 calls  roofline -",
    f"  {BASE} gelu fusion 1: {bench(29.8)}",
    f"  {BASE} gelu fusion 2: {bench(28.0)}",
    f"  {BASE} cuDNN attention: {bench(31.0)}",
    f"  {BASE} residual unfused: failed (see e2e.txt)",
    f"  GPT-2 124M B=16 T=1024 fp32: {bench(300.0)}",
]) + "\n"


def run(text):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
    finally:
        os.unlink(f.name)


def main():
    r = run(LOG)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    expected = [
        "Machine: NVIDIA H200, 580.1, 143771 MiB, 1980 MHz.",
        f"| {BASE} | 30.00 ms/step, 546,133 tok/s, MFU 41.0% (6·params)",
        "| gelu fusion 1 | 29.80 | within noise |",
        "| gelu fusion 2 | 28.00 | 6.7% faster |",
        "| cuDNN attention | 31.00 | 3.3% slower |",
        f"Fastest: {BASE} gelu fusion 2 (28.00 ms/step; defaults 30.00).",
        "| attention bwd | 3.123 | 12.0% | 12.0 | 0.812 | 26.0% |",
        "| tokens to device | 0.010 | 0.1% | 1.0 | - | - |",
        f"| {BASE} residual unfused | failed (see e2e.txt) |",
    ]
    for line in expected:
        assert line in out, f"missing: {line!r}\n--- output ---\n{out}"
    assert "| fp32 |" not in out, "fp32 is not a bf16 variant"

    r = run("== gpu_check 2026-12-03T10:00:00Z on host\nno summary\n")
    assert r.returncode != 0 and "did not finish" in (r.stderr + r.stdout), r
    print("gpu_results_md_test: ok")


if __name__ == "__main__":
    main()
