#!/usr/bin/env python3
"""ZeRO stages on CPU ranks: memory per rank and step time (bench/RESULTS.md, "ZeRO").

memory  For each model, rank count and stage: `trainflow bench` under mpirun; the per-rank state
        bytes the engine plans (its "state per rank" line) and each rank's measured peak resident
        memory. A configuration the memory check refuses is recorded as refused, with its message.
speed   GPT-2 124M, 2 ranks, B=4, T=64: stages 0-3 alternated ROUNDS times in one run (a quiet
        machine: nothing else may run), medians of the per-run medians.
large   GPT-2 774M on 2 ranks: stage 0 (expected: refused up front) and stage 3 for 3 steps.

Usage: scripts/bench_zero.py memory|speed|large [--build build] [--rounds 3]
MPI traffic stays on loopback.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpirun(np):
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo",
            "-np", str(np), "-x", "OMP_NUM_THREADS=1", "-x", "OMP_WAIT_POLICY=PASSIVE"]


def bench(build, model, np, stage, steps, warmup, extra=()):
    cmd = mpirun(np) + [os.path.join(build, "trainflow"), "bench", "--model", f"configs/model/{model}.json",
                        "--batch-size", "4", "--seq-len", "64", "--device", "cpu", "--steps", str(steps),
                        "--warmup", str(warmup), "--zero-stage", str(stage), *extra]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    out = p.stdout + p.stderr
    r = {"cmd": " ".join(cmd), "rc": p.returncode, "out": out}
    m = re.search(r"BENCH_RESULT ms_per_step=([\d.]+).*peak_rss_bytes=(\d+)", out)
    if m:
        r["ms"] = float(m.group(1))
        r["peak"] = int(m.group(2))
    m = re.search(r"state per rank[^\n]*", out)
    if m:
        r["plan"] = m.group(0)
    m = re.search(r"peak resident memory by rank: ([^\n]*)", out)
    if m:
        r["peaks"] = m.group(1)
    return r


def memory(a):
    print("| model | ranks | stage | engine's state per rank | peak RSS by rank | result |")
    print("|---|---|---|---|---|---|")
    for model in ("gpt2-124m", "gpt2-350m"):
        for np in (2, 4):
            for stage in (0, 1, 2, 3):
                r = bench(a.build, model, np, stage, 1, 1)
                if r["rc"] != 0:
                    why = next((l for l in r["out"].splitlines() if "zero_stage" in l or "error" in l.lower()), "")
                    print(f"| {model} | {np} | {stage} | - | - | refused/failed (rc {r['rc']}): {why.strip()[:160]} |")
                else:
                    print(f"| {model} | {np} | {stage} | {r.get('plan', '?')} | {r.get('peaks', '?')} | ok |")
                sys.stdout.flush()


def speed(a):
    times = {s: [] for s in (0, 1, 2, 3)}
    for _ in range(a.rounds):
        for stage in (0, 1, 2, 3):
            r = bench(a.build, "gpt2-124m", 2, stage, 8, 2)
            if "ms" not in r:
                sys.exit(f"stage {stage} failed:\n{r['out'][-2000:]}")
            times[stage].append(r["ms"])
            print(f"stage {stage}: {r['ms']:.1f} ms/step", flush=True)
    print(f"command: {' '.join(mpirun(2))} build/trainflow bench --model "
          "configs/model/gpt2-124m.json --batch-size 4 --seq-len 64 --device cpu --steps 8 --warmup 2 --zero-stage N")
    base = statistics.median(times[0])
    for stage, t in times.items():
        med = statistics.median(t)
        print(f"| {stage} | {med:.1f} | {min(t):.1f} | {max(t):.1f} | {100.0 * (med / base - 1):+.1f}% |")


def large(a):
    for stage in (0, 3):
        r = bench(a.build, "gpt2-774m", 2, stage, 3, 0)
        print(f"== zero_stage {stage}: rc {r['rc']}")
        print("\n".join(l for l in r["out"].splitlines() if "bench" in l or "zero_stage" in l or "state" in l))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["memory", "speed", "large"])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    {"memory": memory, "speed": speed, "large": large}[a.what](a)


if __name__ == "__main__":
    main()
