#!/usr/bin/env python3
"""Multi-host chaos tests of `trainflow launch`: network namespaces as hosts (CTest; root; stdlib).

  python3 tests/integration/fault/netns_chaos_test.py --trainflow build/trainflow --source . [--only NAME ...]

Hosts are network namespaces on a bridge (tests/integration/fault/netns_cluster.py); mpirun reaches them through
scripts/netns_rsh.sh, and every Open MPI connection and heartbeat stays on the cluster's subnet.
  quarantine  2 hosts x 1 slot. The rank on host 2 is killed whenever it runs, until host 2 is
              quarantined (--quarantine-after 2); the job goes on as 1 rank with the same global
              batch (batch 16 x 2 accumulation steps), its losses within rounding of the 2-rank
              reference. Host 2's health check then passes: it is readmitted and the job grows back
              to 2 ranks at a checkpoint, and finishes.
  partition   3 hosts x 1 slot, 2 ranks. Host 2 is cut off the network: detected (silent), its rank
              and daemon ended through the remote shell, the host quarantined (--quarantine-after 1;
              its health check fails while it is cut off), and the job resumes on hosts 1 and 3 from the
              survivor's rescue, ending bit-identical to the uninterrupted run.
Exit status: 0 passed, 1 failed, 77 skipped (not root, no `ip`, or namespaces unavailable).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import chaos_test as ct  # noqa: E402  (shared helpers)
from netns_cluster import NetnsCluster, NetnsError  # noqa: E402

SKIP = 77


class NetCase(ct.Case):
    def __init__(self, args, name, cluster, steps, launch_extra=(), slots=1):
        super().__init__(args, name, steps)
        self.cluster = cluster
        hostfile = cluster.hostfile(os.path.join(self.dir, "hosts"), slots=slots)
        flags = cluster.mpirun_flags()
        # The supervisor adds --allow-run-as-root and --oversubscribe; the remote shell is its own option.
        i = flags.index("plm_rsh_agent")
        agent = flags[i + 1]
        rest = flags[:i - 1] + flags[i + 2:]
        rest = [f for f in rest if f not in ("--allow-run-as-root", "--oversubscribe")]
        train = self.cmd[self.cmd.index("--") + 1:]
        self.cmd = [args.trainflow, "launch", "--hostfile", hostfile, "--state-dir", self.state,
                    "--heartbeat-interval", "0.5", "--heartbeat-addr", cluster.supervisor_addr,
                    "--rsh-agent", agent, "--mpirun-args", " ".join(rest), "--metrics-addr", "off",
                    *launch_extra, "--", *train]

    def host_of(self, rank):
        for r in self.job().get("ranks", []):
            if r.get("rank") == rank:
                return r.get("host")
        return None

    def kill_on_host(self, rank):
        """SIGKILL of `rank` inside its namespace (its PID is the root namespace's view: same PID space)."""
        pid, info = self.rank_pid(rank)
        os.kill(pid, signal.SIGKILL)
        return pid, info


def losses(path):
    out = {}
    with open(path) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j:
                out[j["step"]] = j["loss"]
    return out


def case_quarantine(args):
    steps = 1200
    with NetnsCluster(2, tag=args.tag, reclaim=True) as cl:
        marker = os.path.join(args.work, "bad-hosts")
        os.makedirs(marker, exist_ok=True)
        bad = cl.hosts[1]
        open(os.path.join(marker, bad), "w").close()
        c = NetCase(args, "quarantine", cl, steps,
                    launch_extra=["--quarantine-after", "2", "--health-interval", "1",
                                  "--health-check", f"test ! -e {marker}/$TRAINFLOW_HOST"])
        try:
            p = c.start()
            kills = 0
            gen_seen = 0
            end = time.time() + 120
            while kills < 2 and time.time() < end:
                job = c.job()
                ranks = job.get("ranks", [])
                gen = job.get("generation", 0)
                if gen > gen_seen and len(ranks) == 2 and all(r.get("pid") for r in ranks) and \
                        min(r.get("step", 0) for r in ranks) > 50:
                    victim = [r for r in ranks if r.get("host") == bad]
                    assert victim, f"quarantine: no rank on {bad}: {ranks}"
                    os.kill(victim[0]["pid"], signal.SIGKILL)
                    ct.log(f"quarantine: SIGKILL rank {victim[0]['rank']} on {bad} (generation {gen})")
                    kills += 1
                    gen_seen = gen
                time.sleep(0.05)
            assert kills == 2, f"quarantine: only {kills} kills:\n{c.output()[-3000:]}"
            # Now one rank with the same global batch.
            end = time.time() + 60
            while time.time() < end and not (c.job().get("world") == 1 and c.job().get("ranks", [{}])[0].get("step", 0) > 0):
                time.sleep(0.05)
            job = c.job()
            assert job.get("world") == 1 and job.get("grad_accum_steps") == 2 and job.get("batch_size") == 16, \
                f"quarantine: expected 1 rank x 16 x 2, got {job}"
            st = ct.read_json(os.path.join(c.state, "state.json"), {})
            states = {h["name"]: h["state"] for h in st.get("host_states", [])}
            assert states.get(bad) == "quarantined", f"quarantine: {bad} is {states.get(bad)}"
            c.wait_step(job.get("start_step", 0) + 150 if job.get("start_step", -1) >= 0 else 300)
            os.remove(os.path.join(marker, bad))  # the host is healthy again
            ct.log(f"quarantine: {bad} healthy again")
            rc = c.wait(p, 180)
            out = c.output()
            assert rc == 0, f"quarantine: exit {rc}:\n{out[-4000:]}"
            inc = ct.incidents(c.state)
            kinds = [e["kind"] for e in inc]
            assert "readmitted" in kinds and "grow" in kinds, f"quarantine: no readmission and grow: {kinds}"
            assert f"host {bad} quarantined" in out, "quarantine: the quarantine was not logged"
            st = ct.read_json(os.path.join(c.state, "state.json"), {})
            # The losses follow the 2-rank reference within rounding (1 rank x 2 accumulation reads the
            # same rows; only the summation order differs).
            ref = ct.reference_losses(args, steps)
            got = losses(os.path.join(c.dir, "out", "metrics.jsonl"))
            common = sorted(set(ref) & set(got))
            assert len(common) > steps // 2, f"quarantine: only {len(common)} steps to compare"
            worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in common)
            assert worst < 0.02, f"quarantine: losses differ from the reference by up to {worst:.4f} (relative)"
            ct.log(f"quarantine: quarantined after 2 failures, 1 rank x 16 x 2, readmitted, grew back; "
                   f"losses within {worst:.2e} of the reference")
        finally:
            c.stop_all()


def case_partition(args):
    steps = 1200
    with NetnsCluster(3, tag=args.tag, reclaim=True) as cl:
        cut = os.path.join(args.work, "partitioned")
        os.makedirs(cut, exist_ok=True)
        c = NetCase(args, "partition", cl, steps,
                    launch_extra=["--max-ranks", "2", "--quarantine-after", "1", "--health-interval", "2",
                                  "--health-check", f"test ! -e {cut}/$TRAINFLOW_HOST"])
        try:
            p = c.start()
            c.wait_step(300, timeout=90)
            victim = c.host_of(1)
            pid, info = c.rank_pid(1)
            t0 = time.time()
            open(os.path.join(cut, victim), "w").close()  # its health check fails while it is cut off
            cl.partition(victim)
            ct.log(f"partition: host {victim} (rank 1, pid {pid}) cut off at step {info.get('step')}")
            end = time.time() + 30
            while time.time() < end and not ct.incidents(c.state):
                time.sleep(0.05)
            inc = ct.incidents(c.state)
            assert inc, f"partition: nothing detected:\n{c.output()[-3000:]}"
            e = inc[0]
            assert e["rank"] == 1 and e["host"] == victim and e["kind"] in ("unresponsive", "lost_host"), \
                f"partition: incident {e}"
            assert e.get("rescue", {}).get("ok"), f"partition: no rescue: {e}"
            ct.log(f"partition: detected in {time.time() - t0:.1f} s: {e['kind']} ({e['detail']})")
            rc = c.wait(p, 180)
            out = c.output()
            assert rc == 0, f"partition: exit {rc}:\n{out[-4000:]}"
            assert not ct.alive(pid), "partition: the cut-off rank was left running"
            job_hosts = [l for l in out.splitlines() if "generation 2:" in l]
            assert job_hosts and victim not in job_hosts[0], f"partition: generation 2 used {victim}: {job_hosts}"
            ct.same_weights(args, c, steps)
            ct.log("partition: isolated, resumed on the other hosts from the rescue, bit-identical")
        finally:
            c.stop_all()


CASES = {"quarantine": case_quarantine, "partition": case_partition}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    ap.add_argument("--tag", default=str(300 + os.getpid() % 1000))
    args = ap.parse_args()
    args.trainflow = os.path.abspath(args.trainflow)
    args.source = os.path.abspath(args.source)
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("mpirun") is None:
        print("needs root, ip and mpirun: skipped")
        return SKIP
    args.work = tempfile.mkdtemp(prefix="tf-netns-chaos-")
    args.cache = {}
    failed = []
    try:
        for name in args.only or list(CASES):
            t0 = time.time()
            try:
                CASES[name](args)
                ct.log(f"{name}: passed in {time.time() - t0:.1f} s")
            except NetnsError as e:
                print(f"network namespaces unavailable ({e}): skipped")
                return SKIP
            except AssertionError as e:
                failed.append(name)
                ct.log(f"{name}: FAILED: {e}")
    finally:
        if failed:
            ct.log(f"work directory kept: {args.work}")
        else:
            shutil.rmtree(args.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
