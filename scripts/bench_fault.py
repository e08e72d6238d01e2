#!/usr/bin/env python3
"""Fault-tolerance figures of `trainflow launch` on CPU ranks (a benchmark, not a CI test).

  python3 scripts/bench_fault.py [--kills 6] [--stops 4] [--soak-minutes 10] [--no-reference]

Run on a quiet machine (nothing else timed at once). The job is the default one (byte-small on the
fortunes corpus, configs/train/fortunes.json) as 2 ranks on this machine, 1 thread each.
1. Latency: one supervised run; every ~15 s a random rank gets SIGKILL (then, in a second run,
   SIGSTOP). Per failure: detection latency (the signal to the supervisor's detection), time from
   the signal to the first completed step of the restarted job, and the work lost (the rescued step
   against the step in progress).
2. Soak: the job for at least --soak-minutes with a random rank killed about once a minute
   (uniform 45..75 s); the effective training time ratio (productive step time / wall time) from
   the supervisor's accounting, and whether the final weights equal those of the same job run
   without failures (which it also runs, unless --no-reference).
Prints a Markdown section for bench/RESULTS.md.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fault"))
from chaos_test import incidents, read_json, tensors  # noqa: E402  (the chaos tests' helpers)
JOB = ["--model", "configs/model/byte-small.json", "--train", "configs/train/fortunes.json", "--metrics_addr", "off",
       "--checkpoint_interval", "100"]


class Run:
    def __init__(self, trainflow, work, name, steps, extra=()):
        self.dir = os.path.join(work, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.state = os.path.join(self.dir, "launch")
        self.cmd = [trainflow, "launch", "--np", "2", "--state-dir", self.state, "--metrics-addr", "off",
                    "--quarantine-after", "1000", *extra, "--", "train", *JOB, "--max_steps", str(steps),
                    "--checkpoint_dir", os.path.join(self.dir, "ckpt"), "--out_dir", os.path.join(self.dir, "out")]
        env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
        self.log = open(os.path.join(self.dir, "supervisor.log"), "w")
        self.p = subprocess.Popen(self.cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def job(self):
        return (read_json(os.path.join(self.state, "state.json"), {}) or {}).get("job") or {}

    def ready(self, min_step):
        job = self.job()
        ranks = job.get("ranks", [])
        return len(ranks) == 2 and all(r.get("pid") for r in ranks) and min(r.get("step", 0) for r in ranks) >= min_step

    def victim(self, rng):
        ranks = self.job()["ranks"]
        return ranks[rng.randrange(len(ranks))]

    def running(self):
        return self.p.poll() is None

    def stop(self):
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        job = self.job()
        if job.get("mpirun_pid"):
            try:
                os.killpg(job["mpirun_pid"], signal.SIGKILL)
            except OSError:
                pass


def wait_for(cond, timeout):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.02)
    return False


def latency(args, sig, count, name):
    """One run, `count` failures by `sig`; per failure (detect_s, to_step_s, lost_steps, kind)."""
    # Failures every few seconds: without --backoff-reset 1 the restart delay would back off (1, 2, 4 s ...),
    # as for a crash loop; this measures the recovery itself.
    run = Run(args.trainflow, args.work, name, 100000, extra=["--backoff-reset", "1"])
    rng = random.Random(args.seed)
    out = []
    try:
        for i in range(count):
            assert wait_for(lambda: run.ready(20), 120), f"{name}: the job did not get going"
            time.sleep(rng.uniform(2, 6))
            v = run.victim(rng)
            before = len(incidents(run.state))
            t_sig = time.time()
            os.kill(v["pid"], sig)
            assert wait_for(lambda: any(e.get("kind") == "recovered" for e in incidents(run.state)[before:]), 120), \
                f"{name}: no recovery after failure {i + 1}"
            inc = incidents(run.state)[before:]
            fail = next(e for e in inc if e.get("kind") not in ("recovered",))
            rec = next(e for e in inc if e.get("kind") == "recovered")
            rescue = fail.get("rescue", {})
            out.append({"detect_s": fail["detected_at"] - t_sig, "to_step_s": rec["first_step_time"] - t_sig,
                        "kind": fail["kind"], "rescued": bool(rescue.get("ok")), "rescue_step": rescue.get("step"),
                        "resumed_step": rec["step"] - 1, "rescue_s": rescue.get("seconds", 0)})
            print(f"  {name} {i + 1}: {fail['kind']} detected {out[-1]['detect_s']:.2f} s after the signal, "
                  f"training again {out[-1]['to_step_s']:.2f} s after it; rescued step {rescue.get('step')}",
                  flush=True)
    finally:
        run.stop()
    return out


def soak(args):
    steps = args.soak_steps
    run = Run(args.trainflow, args.work, "soak", steps)
    rng = random.Random(args.seed + 1)
    kills = 0
    t0 = time.time()
    try:
        next_kill = time.time() + rng.uniform(45, 75)
        while run.running():
            if time.time() >= next_kill and run.ready(1):
                v = run.victim(rng)
                try:
                    os.kill(v["pid"], signal.SIGKILL)
                    kills += 1
                    print(f"  soak: kill {kills} (rank {v['rank']}) at {time.time() - t0:.0f} s", flush=True)
                except OSError:
                    pass
                next_kill = time.time() + rng.uniform(45, 75)
            time.sleep(0.1)
        wall = time.time() - t0
        rc = run.p.wait()
    finally:
        run.stop()
    st = read_json(os.path.join(run.state, "state.json"), {})
    return {"rc": rc, "wall": wall, "kills": kills, "state": st, "dir": run.dir, "incidents": incidents(run.state)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", default=os.path.join(ROOT, "build", "trainflow"))
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--stops", type=int, default=4)
    ap.add_argument("--soak-minutes", type=float, default=10)
    ap.add_argument("--soak-steps", type=int, default=0, help="default: enough for --soak-minutes")
    ap.add_argument("--no-reference", action="store_true")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    args.work = tempfile.mkdtemp(prefix="tf-bench-fault-")
    print(f"work directory {args.work}", flush=True)
    dead = latency(args, signal.SIGKILL, args.kills, "kill9") if args.kills else []
    stopped = latency(args, signal.SIGSTOP, args.stops, "sigstop") if args.stops else []
    soaked = None
    if args.soak_minutes > 0:
        if not args.soak_steps:
            # The step time of the latency run, for a soak of the asked length (plus the failures' cost).
            st = read_json(os.path.join(args.work, "kill9", "launch", "state.json"), {}) or {}
            per_step = 0.2
            if st.get("productive_s") and st.get("final_step", -1) > 0:
                per_step = st["productive_s"] / st["final_step"]
            args.soak_steps = int(args.soak_minutes * 60 / per_step)
        print(f"soak: {args.soak_steps} steps, a kill every 45..75 s", flush=True)
        soaked = soak(args)
    ref_equal = None
    if soaked and not args.no_reference and soaked["rc"] == 0:
        print("reference: the same job without failures", flush=True)
        ref = Run(args.trainflow, args.work, "reference", args.soak_steps)
        ref.p.wait()
        ref.stop()
        ref_equal = tensors(os.path.join(ref.dir, "out", "model.safetensors")) == \
            tensors(os.path.join(soaked["dir"], "out", "model.safetensors"))

    def med(xs):
        return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})" if xs else "-"

    print("\n## Fault tolerance: `python3 scripts/bench_fault.py` (byte-small default job, 2 CPU ranks x 1 thread)\n")
    print("| failure | n | detection after the signal | signal to the first new step | rescued (step in progress kept) |")
    print("|---|---|---|---|---|")
    for name, rows in (("SIGKILL of a random rank", dead), ("SIGSTOP of a random rank", stopped)):
        if rows:
            print(f"| {name} | {len(rows)} | {med([r['detect_s'] for r in rows])} | "
                  f"{med([r['to_step_s'] for r in rows])} | {sum(r['rescued'] for r in rows)} of {len(rows)} |")
    if soaked:
        st = soaked["state"]
        print(f"\nSoak: {args.soak_steps} steps in {soaked['wall'] / 60:.1f} min, {soaked['kills']} SIGKILLs "
              f"(one every 45..75 s), exit {soaked['rc']}: {st.get('restarts')} restarts, "
              f"{st.get('downtime_s', 0):.1f} s down, effective training time ratio "
              f"**{100 * st.get('effective_ratio', 0):.1f}%** (productive step time {st.get('productive_s', 0):.0f} s "
              f"/ wall {st.get('wall_s', 0):.0f} s); final weights "
              f"{'bit-identical to' if ref_equal else 'NOT equal to' if ref_equal is False else 'not compared with'} "
              f"the run without failures.")
        rec = [e for e in soaked["incidents"] if e.get("kind") == "recovered"]
        if rec:
            print(f"Failure detection to the next step in the soak: median "
                  f"{statistics.median(e['failure_to_step_s'] for e in rec):.2f} s, max "
                  f"{max(e['failure_to_step_s'] for e in rec):.2f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
