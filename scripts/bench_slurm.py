#!/usr/bin/env python3
"""Slurm figures of TrainFlow (a benchmark, not a CI test): the Slurm test's cluster and cases, repeated.

  python3 scripts/bench_slurm.py [--trainflow build/trainflow] [--reps 3]

Runs tests/integration/slurm/slurm_test.py --report (root, slurm-wlm and munge needed) --reps times, one after
the other, on a quiet machine, and prints a Markdown section for bench/RESULTS.md with the median of
each figure over the repetitions:
  preempt_stop_s                 the urgent job's submission to the preempted run's end (its ranks
                                 have committed their checkpoint by then); the grace time is 30 s
  *_requeue_gap_s, requeue_gap_s a run's end to the requeued job's next run start (Slurm's requeue,
                                 scheduling and the supervisor's start)
  timelimit_stop_before_limit_s  how long before the 1-minute limit the warned run had stopped
  badnode_resubmit_gap_s         the failed job's end to its resubmitted successor's start
  *_wall_s, total_s              each case's wall time (the cases run at once) and the whole test's
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def flat(v):
    return v if isinstance(v, list) else [v]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", default=os.path.join(ROOT, "build", "trainflow"))
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    if args.reps < 1:
        sys.exit("--reps must be at least 1")
    if not os.access(args.trainflow, os.X_OK):
        sys.exit(f"{args.trainflow}: no trainflow binary (build first: bash scripts/build.sh)")
    reports = []
    for i in range(args.reps):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "integration", "slurm", "slurm_test.py"), "--trainflow",
                            args.trainflow, "--source", ROOT, "--report", path], capture_output=True, text=True)
        if p.returncode != 0:
            sys.stdout.write(p.stdout[-4000:] + p.stderr[-2000:])
            sys.exit(f"repetition {i + 1}: the Slurm test exited {p.returncode}")
        with open(path) as f:
            reports.append(json.load(f))
        os.unlink(path)
        print(f"repetition {i + 1}/{args.reps}: {reports[-1]}", file=sys.stderr, flush=True)
    names = sorted({k for r in reports for k, v in r.items() if isinstance(v, (int, float, list)) and k != "failed"})
    print(f"### `python3 scripts/bench_slurm.py --reps {args.reps}` (medians over the repetitions)\n")
    print("| figure | median (s) | all values (s) |")
    print("|---|---:|---|")
    for n in names:
        values = [x for r in reports if n in r for x in flat(r[n])]
        if values:
            print(f"| {n} | {statistics.median(values):.1f} | {', '.join(f'{x:g}' for x in values)} |")


if __name__ == "__main__":
    main()
