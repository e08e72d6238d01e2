#!/usr/bin/env python3
"""TrainFlow on a real Slurm cluster started by this test (CTest; stdlib only). docs/slurm.md.

  python3 tests/integration/slurm/slurm_test.py --trainflow build/trainflow --source . [--only NAME ...] [--keep]
                                    [--report FILE]   (the measured figures as JSON: scripts/bench_slurm.py)

The cluster: munged, slurmctld and six slurmd (node1..node6) on this machine, all on loopback, with
their own slurm.conf in a temporary directory (several slurmd on one host work when each has its own
TmpFS: the PMIx plugin keeps per-step files there). Partitions: main (node1-2), low (node4, preempted
by urgent with a grace time), urgent (node4), flaky (node3, node5, node6; every task started on
node3 fails, as on a bad node: its TaskProlog sets TRAINFLOW_TEST_FAIL_AT_STEP).

Every case submits with `trainflow slurm submit` the same small CPU job (byte-tiny, 2 ranks) and
compares it with that job run by plain mpirun (the reference): the final weights bit-identical.
  submit    2 nodes x 1 rank under srun --mpi=pmix: runs to completion; its losses equal mpirun's.
            With --group tfteam: the group's member reads its logs, checkpoints, outputs and token
            (not its secret); another user reads nothing.
  requeue   `scontrol requeue` mid-run: the requeued run resumes from the checkpoint written on
            Slurm's SIGTERM; bit-identical.
  timelimit --time 1 with the warning signal: the supervisor checkpoints on SIGUSR1 and requeues
            itself before the limit (at least once), and the job finishes; bit-identical.
  preempt   a higher-priority job preempts it (PreemptMode=REQUEUE, GraceTime): the ranks checkpoint
            within the grace time, Slurm requeues it, it resumes and finishes; bit-identical.
  tenants   two jobs of two Unix users at once: neither can read the other's job directory,
            checkpoints, logs or token; the metrics endpoints want their own job's token; no port is
            shared; both finish bit-identical.
  badnode   a node where every rank fails: quarantined after two failures, the job resubmits itself
            excluding it (job comment, drained node), the new job finishes; bit-identical.
The cases run at once (the cluster has room). Every daemon and job process the test started is
stopped by PID at the end, whatever happens. Exit status: 0 passed, 1 failed, 77 skipped.
"""
import argparse
import json
import os
import grp
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fault"))
from chaos_test import read_json, tensors  # noqa: E402
from netns_chaos_test import losses  # noqa: E402

SKIP = 77
STEPS = 600
JOB = ["--model", "configs/model/byte-tiny.json", "--train", "configs/train/fortunes.json",
       "--batch_size", "8", "--seq_len", "32", "--eval_interval", "0", "--sample_interval", "0",
       "--log_interval", "100", "--checkpoint_interval", "100", "--max_steps", str(STEPS)]
TENANTS = ["tftenant1", "tftenant2"]
TEAM = "tfteam"  # tftenant2 is a member: the submit case's job is readable by that group (--group)
FORTUNES = "/usr/share/games/fortunes"  # Debian's fortunes (scripts/install_deps.sh)
LOCK = threading.Lock()


def log(msg):
    with LOCK:
        print(f"[slurm-test {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class Cluster:
    NODES = 6

    def __init__(self, work, keep):
        self.work = work
        self.keep = keep
        self.procs = []          # (name, Popen) of the daemons
        self.conf = os.path.join(work, "slurm.conf")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.stepds_before = set(self.pids_named("slurmstepd"))

    @staticmethod
    def pids_named(name):
        out = []
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/comm") as f:
                    if f.read().strip() == name:
                        out.append(int(p))
            except OSError:
                pass
        return out

    def run(self, *argv, check=True, timeout=30, user=None):
        cmd = list(argv)
        if user:
            cmd = ["runuser", "-u", user, "--"] + cmd
        p = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stdout}{p.stderr}")
        return p

    def start(self):
        w = self.work
        for d in ["munge", "run", "state", "log"]:
            os.makedirs(os.path.join(w, d))
        os.chmod(os.path.join(w, "munge"), 0o700)
        key = os.path.join(w, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(128))
        os.chmod(key, 0o400)
        sock = os.path.join(w, "run", "munge.sock")
        self.daemon("munged", ["munged", "-F", "-f", f"--key-file={key}", f"--socket={sock}",
                               f"--pid-file={w}/run/munged.pid", f"--log-file={w}/log/munged.log",
                               f"--seed-file={w}/munge/seed"])
        ports = free_ports(1 + self.NODES)
        host = socket.gethostname()
        prolog = os.path.join(w, "bad_node_prolog.sh")
        with open(prolog, "w") as f:
            f.write("#!/bin/sh\n# node3 is a bad node: every rank started here fails at step 60 (not the batch\n"
                    "# script: its environment would reach every rank).\n"
                    'case "${SLURM_STEP_ID:-batch}" in batch|4294967291|4294967292|4294967293|4294967294) ;;\n'
                    "*) echo export TRAINFLOW_TEST_FAIL_AT_STEP=60 ;; esac\n")
        os.chmod(prolog, 0o755)
        base = f"""ClusterName=tftest{os.getpid()}
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ports[0]}
AuthType=auth/munge
AuthInfo=socket={sock},cred_expire=5
CredType=cred/munge
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool/%n
SlurmctldPidFile={w}/run/slurmctld.pid
SlurmdPidFile={w}/run/slurmd-%n.pid
SlurmctldLogFile={w}/log/slurmctld.log
SlurmdLogFile={w}/log/slurmd-%n.log
SlurmdParameters=config_overrides
DebugFlags=NO_CONF_HASH
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
KillWait=10
MinJobAge=900
SlurmdTimeout=60
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
"""
        nodes = "".join(f"NodeName=node{i} NodeAddr=127.0.0.1 NodeHostname={host} CPUs=6 Port={ports[i]} "
                        f"State=UNKNOWN\n" for i in range(1, self.NODES + 1))
        parts = ("PartitionName=main Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP PriorityTier=1\n"
                 "PartitionName=low Nodes=node4 MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=30\n"
                 "PartitionName=urgent Nodes=node4 MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF\n"
                 "PartitionName=flaky Nodes=node[3,5-6] MaxTime=INFINITE State=UP PriorityTier=1\n")
        with open(self.conf, "w") as f:
            f.write(base + nodes + parts)
        self.daemon("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
        for i in range(1, self.NODES + 1):
            tmp = os.path.join(w, "tmp", f"node{i}")
            os.makedirs(tmp)
            os.chmod(tmp, 0o1777)
            os.makedirs(os.path.join(w, "spool", f"node{i}"))
            conf = os.path.join(w, f"slurm-node{i}.conf")
            extra = f"TmpFS={tmp}\n" + (f"TaskProlog={prolog}\n" if i == 3 else "")
            with open(conf, "w") as f:
                f.write(base + extra + nodes + parts)
            self.daemon(f"slurmd-node{i}", ["slurmd", "-D", "-N", f"node{i}", "-f", conf])
        end = time.time() + 60
        while time.time() < end:
            p = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False)
            states = [l.split()[1] for l in p.stdout.splitlines() if l.strip()]
            if len(states) >= self.NODES * 1 and all(s.startswith("idle") for s in states):
                log(f"cluster up: {self.NODES} nodes ({w})")
                return
            for name, proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}: see {w}/log")
            time.sleep(0.5)
        raise RuntimeError(f"the nodes did not come up: {p.stdout}{p.stderr}")

    def daemon(self, name, argv):
        logf = open(os.path.join(self.work, "log", f"{name}.stdout"), "w")
        p = subprocess.Popen(argv, env=self.env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, p))

    def job(self, job_id):
        """scontrol's view of a job as a dict ({} when unknown)."""
        p = self.run("scontrol", "show", "job", str(job_id), "-o", check=False)
        out = {}
        for word in p.stdout.split():
            if "=" in word:
                k, v = word.split("=", 1)
                out.setdefault(k, v)
        return out

    def wait_job(self, job_id, states=("COMPLETED",), timeout=240, done=("COMPLETED", "FAILED", "CANCELLED",
                                                                            "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")):
        end = time.time() + timeout
        j = {}
        while time.time() < end:
            j = self.job(job_id)
            if j.get("JobState") in done:
                break
            time.sleep(1)
        assert j.get("JobState") in states, f"job {job_id} ended {j.get('JobState')} (expected {states}): {j}"
        return j

    def stop(self):
        # Jobs first (their processes), then the daemons, then anything of ours left.
        p = self.run("squeue", "-h", "-o", "%i", check=False)
        ids = [l.strip() for l in p.stdout.splitlines() if l.strip()]
        if ids:
            self.run("scancel", *ids, check=False)
            end = time.time() + 30
            while time.time() < end and self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
                time.sleep(0.5)
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        mine = set(self.pids_named("slurmstepd")) - self.stepds_before
        for pid in list(mine) + self.job_processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def job_processes(self):
        """Processes whose environment names this cluster's slurm.conf (the jobs' shells, srun, ranks)."""
        out = []
        needle = ("SLURM_CONF=" + self.conf).encode()
        for p in os.listdir("/proc"):
            if not p.isdigit() or int(p) == os.getpid():
                continue
            try:
                with open(f"/proc/{p}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        out.append(int(p))
            except OSError:
                pass
        return out


class Ctx:
    def __init__(self, args, cluster):
        self.args = args
        self.cluster = cluster
        self.ref = None
        self.figures = {}  # what the cases measured, for --report

    def figure(self, name, value):
        with LOCK:
            self.figures[name] = value


def requeue_gaps(runs):
    """Seconds from each run's end to the next run's start: Slurm's requeue and the supervisor's start."""
    return [round(b["started"] - a["ended"], 2) for a, b in zip(runs, runs[1:])]


def submit(ctx, name, extra=(), train_extra=(), env=None, user=None, jobdir=None):
    """`trainflow slurm submit` of the test job; returns (job id, job directory)."""
    d = jobdir or os.path.join(ctx.args.work, name)
    cmd = [ctx.args.trainflow, "slurm", "submit", "--job-name", f"tf-{name}", "--dir", d, *extra, "--", "train", *JOB, "--out_dir", os.path.join(d, "out"), *train_extra]
    e = dict(ctx.cluster.env, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", **(env or {}))
    if user:
        cmd = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in e.items() if k.startswith(("SLURM_", "OMP_", "TRAINFLOW_"))]] + cmd
    p = subprocess.run(cmd, cwd=ctx.args.tree, env=e, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"submit {name} failed ({p.returncode}): {p.stdout}{p.stderr}"
    job_id = p.stdout.split()[2]
    log(f"{name}: submitted job {job_id}")
    return job_id, d


def job_log(d):
    text = ""
    for f in sorted(os.listdir(d)):
        if f.startswith("slurm-") and f.endswith(".out"):
            with open(os.path.join(d, f), errors="replace") as fh:
                text += fh.read()
    return text


def same_weights(ctx, d, what):
    got = tensors(os.path.join(d, "out", "model.safetensors"))
    ref = ctx.ref
    assert got.keys() == ref.keys(), f"{what}: tensor names differ"
    diff = [k for k in ref if got[k] != ref[k]]
    assert not diff, f"{what}: final weights differ from the mpirun reference in {len(diff)} tensors ({diff[:3]})"


def wait_for(pred, timeout, what, interval=0.2):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def rank0_step(d):
    st = read_json(os.path.join(d, "launch", "state.json"), {}) or {}
    ranks = (st.get("job") or {}).get("ranks") or []
    return max([r.get("step", 0) for r in ranks] + [0])


def usage_runs(d):
    return (read_json(os.path.join(d, "usage.json"), {}) or {}).get("runs", [])


# ---- the cases -------------------------------------------------------------------------------------

def case_submit(ctx):
    dry = subprocess.run([ctx.args.trainflow, "slurm", "submit", "--dry-run", "--nodes", "2", "--time", "10",
                          "--job-name", "tf-dry", "--", "train", *JOB], cwd=ctx.args.tree, capture_output=True,
                         text=True, env=ctx.cluster.env)
    assert dry.returncode == 0, dry.stderr
    for line in ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=10", "#SBATCH --requeue",
                 "#SBATCH --signal=B:USR1@120", "umask 077", "exec "]:
        assert line in dry.stdout, f"the dry-run script lacks {line!r}:\n{dry.stdout}"
    # Bad input is refused before anything is queued, naming the problem.
    for extra, train, needle in [(["--time", "1", "--warning", "120"], JOB, "--time 1"),
                                 (["--job-name", "-x"], JOB, "--job-name"),
                                 (["--time", "5:99"], JOB, "--time"),
                                 (["--group", "tf-no-such-group"], JOB, "tf-no-such-group"),
                                 ([], ["--model", "configs/model/nope.json"], "nope.json")]:
        p = subprocess.run([ctx.args.trainflow, "slurm", "submit", "--dir", os.path.join(ctx.args.work, "refused"),
                            *extra, "--", "train", *train], cwd=ctx.args.tree, capture_output=True, text=True,
                           env=ctx.cluster.env)
        assert p.returncode == 2 and needle in p.stderr, f"{extra} {train[:2]}: rc {p.returncode}: {p.stderr}"
    assert not os.path.exists(os.path.join(ctx.args.work, "refused")), "a refused submit wrote its directory"
    env = {k: v for k, v in ctx.cluster.env.items() if not k.startswith("SLURM_JOB")}
    p = subprocess.run([ctx.args.trainflow, "slurm", "run", "--dir", os.path.join(ctx.args.work, "refused"), "--",
                        "train", *JOB], cwd=ctx.args.tree, capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "inside a Slurm allocation" in p.stderr, p.stderr
    job, d = submit(ctx, "submit", ["--nodes", "2", "--group", TEAM])
    ctx.cluster.wait_job(job, timeout=180)
    check_group_readable(ctx, d)
    text = job_log(d)
    assert "2 ranks on node1 x1, node2 x1" in text, f"not one rank on each of the 2 nodes:\n{text[-3000:]}"
    assert "srun pid" in text and "launched by srun" in text, "the ranks were not launched by srun"
    got, ref = losses(os.path.join(d, "out", "metrics.jsonl")), ctx.ref_losses
    assert len(got) >= STEPS // 100 and all(got[s] == ref[s] for s in got), \
        f"losses differ from mpirun's: {[(s, got[s], ref.get(s)) for s in sorted(got) if got[s] != ref.get(s)][:5]}"
    same_weights(ctx, d, "submit")
    usage = read_json(os.path.join(d, "usage.json"))
    # Every step's tokens once (more when a restart on a loaded machine redid some steps).
    exact = STEPS * 2 * 8 * 32
    assert usage["tokens"] == exact or (usage["restarts"] > 0 and usage["tokens"] > exact), \
        f"tokens trained {usage['tokens']} != {exact} ({usage['restarts']} restarts)"
    assert usage["checkpoint_bytes"] > 0 and usage["node_hours"] > 0, usage
    log(f"submit: {len(got)} logged losses equal mpirun's; usage {usage['tokens']} tokens, "
        f"{usage['checkpoint_bytes']} checkpoint bytes")


def check_group_readable(ctx, d):
    """--group TEAM: everything the job wrote belongs to TEAM and is readable by it, but by nobody
    else; the heartbeat secret and the lock stay owner-only."""
    gid = grp.getgrnam(TEAM).gr_gid
    owner_only = {os.path.join(d, "launch", "secret"), os.path.join(d, "launch", "lock")}
    for dirpath, dirnames, filenames in os.walk(d):
        for path in [dirpath] + [os.path.join(dirpath, n) for n in filenames]:
            st = os.lstat(path)
            mode = st.st_mode & 0o7777
            assert mode & 0o007 == 0, f"{path} can be read by others (mode {mode:o})"
            if path in owner_only:
                assert mode & 0o077 == 0, f"{path} is not owner-only (mode {mode:o})"
                continue
            assert st.st_gid == gid, f"{path} does not belong to group {TEAM}"
            want = 0o050 if os.path.isdir(path) else 0o040
            assert mode & want == want, f"{path} is not readable by group {TEAM} (mode {mode:o})"
    member, outsider = TENANTS[1], TENANTS[0]
    logs = [f for f in os.listdir(d) if f.startswith("slurm-") and f.endswith(".out")]
    readable = [os.path.join(d, logs[0]), os.path.join(d, "out", "metrics.jsonl"), os.path.join(d, "metrics.token"),
                os.path.join(d, "usage.json"), os.path.join(d, "launch", "gen-0001.log"), os.path.join(d, "checkpoints")]
    for path in readable:
        p = ctx.cluster.run("cat" if os.path.isfile(path) else "ls", path, check=False, user=member)
        assert p.returncode == 0, f"{member} (in {TEAM}) cannot read {path}: {p.stderr}"
    for path, who in [(os.path.join(d, "launch", "secret"), member), (d, outsider)]:
        p = ctx.cluster.run("cat" if os.path.isfile(path) else "ls", path, check=False, user=who)
        assert p.returncode != 0 and "Permission denied" in p.stderr, f"{who} could read {path}"


def case_requeue(ctx):
    job, d = submit(ctx, "requeue", ["--nodes", "2"], env={"TRAINFLOW_TEST_STEP_DELAY_MS": "25"})
    wait_for(lambda: rank0_step(d) >= 150, 120, "step 150")
    ctx.cluster.run("scontrol", "requeue", job)
    log(f"requeue: scontrol requeue {job} at step {rank0_step(d)}")
    ctx.cluster.wait_job(job, timeout=180)
    runs = usage_runs(d)
    assert len(runs) >= 2, f"the job ran {len(runs)} time(s): {runs}"
    assert runs[0]["outcome"] in ("stopped", "stopped_outside") and 0 < runs[0]["final_step"] < STEPS, runs[0]
    assert runs[-1]["outcome"] == "finished", runs
    assert f"resumed" in job_log(d) or "resum" in job_log(d), "no resume in the log"
    same_weights(ctx, d, "requeue")
    ctx.figure("requeue_gap_s", requeue_gaps(runs))
    log(f"requeue: stopped at step {runs[0]['final_step']} on Slurm's SIGTERM, resumed, bit-identical")


def case_timelimit(ctx):
    # The warning comes when Slurm's periodic check sees less than warning + ~30 s left: for a 1-minute
    # limit and --warning 20, 10..40 s into a run. 600 steps x 75 ms outlast the first run.
    job, d = submit(ctx, "timelimit", ["--nodes", "1", "--ranks-per-node", "2", "--time", "1", "--warning", "20"],
                    env={"TRAINFLOW_TEST_STEP_DELAY_MS": "75"})
    ctx.cluster.wait_job(job, timeout=300)
    runs = usage_runs(d)
    warned = [r for r in runs if r["outcome"] == "time_warning"]
    assert warned, f"no run was stopped by the time-limit warning: {runs}"
    assert runs[-1]["outcome"] == "finished", runs
    text = job_log(d)
    assert "time limit warning (SIGUSR1)" in text and "requeueing job" in text, text[-3000:]
    assert "DUE TO TIME LIMIT" not in text, "a run reached its time limit"
    same_weights(ctx, d, "timelimit")
    # How long before the 60 s limit each warned run stopped (its checkpoint committed by then).
    ctx.figure("timelimit_stop_before_limit_s", [round(60 - (r["ended"] - r["started"]), 1) for r in warned])
    ctx.figure("timelimit_requeue_gap_s", requeue_gaps(runs))
    log(f"timelimit: {len(warned)} run(s) stopped at a checkpoint before the limit "
        f"(steps {[r['final_step'] for r in warned]}), requeued; bit-identical")


def case_preempt(ctx):
    job, d = submit(ctx, "preempt", ["--nodes", "1", "--ranks-per-node", "2", "--partition", "low"],
                    env={"TRAINFLOW_TEST_STEP_DELAY_MS": "25"})
    wait_for(lambda: rank0_step(d) >= 150, 120, "step 150")
    urgent = ctx.cluster.run("sbatch", "--parsable", "-p", "urgent", "-N", "1", "-n", "6", "-o", "/dev/null",
                             "--wrap", "sleep 3").stdout.strip()
    t0 = time.time()
    log(f"preempt: urgent job {urgent} submitted at step {rank0_step(d)}")
    wait_for(lambda: len(usage_runs(d)) >= 1, 60, "the preempted run's end")
    stopped = time.time() - t0
    ctx.cluster.wait_job(job, timeout=180)
    runs = usage_runs(d)
    assert runs[0]["outcome"] == "stopped_outside" and 0 < runs[0]["final_step"] < STEPS, runs
    assert stopped < 30, f"the preempted run took {stopped:.1f} s to stop (grace time 30 s)"
    text = job_log(d)
    assert f"checkpoint step {runs[0]['final_step']} committed" in text, \
        f"no checkpoint of step {runs[0]['final_step']} in the log:\n{text[-3000:]}"
    assert "preempted: requeueing job" in text, text[-3000:]
    assert runs[-1]["outcome"] == "finished" and len(runs) >= 2, runs
    assert ctx.cluster.job(urgent).get("JobState") == "COMPLETED", ctx.cluster.job(urgent)
    same_weights(ctx, d, "preempt")
    ctx.figure("preempt_stop_s", round(stopped, 2))
    ctx.figure("preempt_requeue_gap_s", requeue_gaps(runs))
    log(f"preempt: checkpoint of step {runs[0]['final_step']} within {stopped:.1f} s of the preemption; "
        f"requeued, resumed, bit-identical")


def http_status(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def case_tenants(ctx):
    root = os.path.join(ctx.args.work, "tenants")
    dirs, jobs = {}, {}
    for u in TENANTS:
        home = os.path.join(root, u)
        os.makedirs(home)
        pw = pwd.getpwnam(u)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        dirs[u] = os.path.join(home, "job")
    os.chmod(root, 0o755)
    for u in TENANTS:
        jobs[u], _ = submit(ctx, f"tenant-{u}", ["--nodes", "1", "--ranks-per-node", "2"], user=u, jobdir=dirs[u],
                            env={"TRAINFLOW_TEST_STEP_DELAY_MS": "20"})
    # While both run: endpoints, tokens, ports.
    for u in TENANTS:
        wait_for(lambda: len((read_json(os.path.join(dirs[u], "endpoints.json"), {}) or {}).get("ranks", {})) == 2,
                 120, f"{u}'s endpoints")
    ports = {}
    for u in TENANTS:
        other = TENANTS[1 - TENANTS.index(u)]
        e = read_json(os.path.join(dirs[u], "endpoints.json"))
        with open(os.path.join(dirs[u], "metrics.token")) as f:
            token = f.read().strip()
        with open(os.path.join(dirs[other], "metrics.token")) as f:
            other_token = f.read().strip()
        st = read_json(os.path.join(dirs[u], "launch", "state.json"))
        urls = [e["supervisor"] + "/metrics"] + [r["url"] + "/metrics" for r in e["ranks"].values()]
        for url in urls:
            assert http_status(url) == 401, f"{url} answered without a token"
            assert http_status(url, other_token) == 401, f"{url} answered {other}'s token"
            assert http_status(url, token) == 200, f"{url} refused its own job's token"
        ports[u] = {int(x.rsplit(":", 1)[1].split("/")[0]) for x in urls} | {st["job"]["port"]}
        def scrape():
            req = urllib.request.Request(e["supervisor"] + "/metrics", headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(req, timeout=5) as r:
                text = r.read().decode()
            tokens = [l for l in text.splitlines() if l.startswith("trainflow_job_tokens_total")]
            return text if tokens and float(tokens[0].split()[-1]) > 0 else None
        text = wait_for(scrape, 60, f"{u}'s supervisor to count tokens", interval=0.5)
        for family in ["trainflow_job_node_hours_total", "trainflow_job_tokens_total",
                       "trainflow_job_checkpoint_bytes_total", "trainflow_launch_restarts_total"]:
            assert family in text, f"the supervisor's /metrics lacks {family}"
        # The other tenant cannot read anything of this job.
        for path in [dirs[u], os.path.join(dirs[u], "metrics.token"), os.path.join(dirs[u], "launch", "secret"),
                     os.path.join(dirs[u], "checkpoints"), os.path.join(dirs[u], "job.sbatch")]:
            p = ctx.cluster.run("cat" if os.path.isfile(path) else "ls", path, check=False, user=other)
            assert p.returncode != 0 and "Permission denied" in p.stderr, \
                f"{other} could read {path}: rc {p.returncode} {p.stdout[:200]}"
        mode = os.stat(dirs[u]).st_mode & 0o777
        assert mode == 0o700, f"{dirs[u]} has mode {mode:o}"
    shared = ports[TENANTS[0]] & ports[TENANTS[1]]
    assert not shared, f"ports used by both jobs: {shared}"
    for u in TENANTS:
        ctx.cluster.wait_job(jobs[u], timeout=180)
        same_weights(ctx, dirs[u], f"tenant {u}")
        for dirpath, dirnames, filenames in os.walk(dirs[u]):
            for n in dirnames + filenames:
                path = os.path.join(dirpath, n)
                st = os.lstat(path)
                assert st.st_uid == pwd.getpwnam(u).pw_uid, f"{path} is not owned by {u}"
                assert st.st_mode & 0o077 == 0, f"{path} can be read by others (mode {st.st_mode & 0o777:o})"
    log(f"tenants: both finished bit-identical; no access across users; ports {sorted(ports[TENANTS[0]])} vs "
        f"{sorted(ports[TENANTS[1]])}")


def case_badnode(ctx):
    c = ctx.cluster
    # node6 is "in maintenance" at first, so the 2-node job gets node3 (bad) and node5.
    c.run("scontrol", "update", "NodeName=node6", "State=DRAIN", "Reason=test: maintenance")
    job, d = submit(ctx, "badnode", ["--nodes", "2", "--partition", "flaky", "--quarantine-after", "2"])
    wait_for(lambda: c.job(job).get("JobState") in ("RUNNING", "COMPLETING", "COMPLETED", "FAILED"), 60, "the job's start")
    c.run("scontrol", "update", "NodeName=node6", "State=RESUME")
    first = c.wait_job(job, states=("FAILED", "COMPLETED"), timeout=180)
    assert "node3" in first.get("NodeList", "") or "node[3" in first.get("NodeList", ""), first
    text = job_log(d)
    assert "host node3 quarantined" in text, text[-4000:]
    assert "Resubmitted as job" in text, text[-4000:]
    comment = c.run("squeue", "-h", "-j", job, "-o", "%k", check=False).stdout.strip() or first.get("Comment", "")
    full = c.run("scontrol", "show", "job", job, check=False).stdout
    assert "trainflow: " in full and "node3" in full, f"no job comment naming node3: {full}"
    node = c.run("scontrol", "show", "node", "node3").stdout
    assert "DRAIN" in node and "trainflow job" in node, f"node3 not drained with a reason: {node}"
    nxt = text.split("Resubmitted as job ")[1].split()[0]
    second = c.wait_job(nxt, timeout=180)
    assert "node3" not in second.get("NodeList", "") and "ExcNodeList=node3" in c.run(
        "scontrol", "show", "job", nxt).stdout, second
    runs = usage_runs(d)
    assert runs[0]["outcome"] == "too_few_hosts" and runs[-1]["outcome"] == "finished", runs
    same_weights(ctx, d, "badnode")
    ctx.figure("badnode_resubmit_gap_s", requeue_gaps(runs)[-1])
    log(f"badnode: node3 quarantined, drained, job {job} resubmitted as {nxt} on {second.get('NodeList')}; "
        f"bit-identical")


CASES = {"submit": case_submit, "requeue": case_requeue, "timelimit": case_timelimit, "preempt": case_preempt,
         "tenants": case_tenants, "badnode": case_badnode}


def reference(ctx):
    """The job under plain mpirun, 2 ranks on this machine."""
    d = os.path.join(ctx.args.work, "reference")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca", "btl", "self,vader,tcp",
           "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo",
           "-x", "OMP_NUM_THREADS=1", ctx.args.trainflow, "train", *JOB, "--out_dir", os.path.join(d, "out"),
           "--checkpoint_dir", os.path.join(d, "ckpt"), "--metrics_addr", "off"]
    p = subprocess.run(cmd, cwd=ctx.args.tree, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"the mpirun reference failed: {p.stdout[-2000:]}{p.stderr[-2000:]}"
    ctx.ref = tensors(os.path.join(d, "out", "model.safetensors"))
    ctx.ref_losses = losses(os.path.join(d, "out", "metrics.jsonl"))


def shared_tree(args):
    """What the jobs need, where every user can read it: the binary, configs and the corpus."""
    tree = os.path.join(args.work, "tree")
    os.makedirs(os.path.join(tree, "data"))
    shutil.copytree(os.path.join(args.source, "configs"), os.path.join(tree, "configs"))
    corpus = os.path.join(tree, "data", "fortunes")
    if os.path.exists(os.path.join(args.source, "data", "fortunes", "train.bin")):
        shutil.copytree(os.path.join(args.source, "data", "fortunes"), corpus)
    else:  # a fresh checkout: the corpus from Debian's fortunes, as the quickstart makes it
        r = subprocess.run([args.trainflow, "prepare", "--input", FORTUNES, "--delimiter", "%", "--val-fraction",
                            "0.05", "--out-dir", corpus], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"trainflow prepare of {FORTUNES} failed: {r.stdout}{r.stderr}"
    exe = os.path.join(tree, "trainflow")
    shutil.copy2(args.trainflow, exe)
    for dirpath, dirnames, filenames in os.walk(tree):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            os.chmod(os.path.join(dirpath, n), 0o755 if n == "trainflow" else 0o644)
    args.tree = tree
    args.trainflow = exe


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--report", help="write the measured figures (seconds) to this JSON file")
    args = ap.parse_args()
    args.trainflow = os.path.abspath(args.trainflow)
    args.source = os.path.abspath(args.source)
    missing = [t for t in ["munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "mpirun", "runuser"]
               if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        print(f"needs root and Slurm (slurm-wlm, munge): skipped ({'missing ' + ', '.join(missing) if missing else 'not root'})")
        return SKIP
    if not os.path.exists(os.path.join(args.source, "data", "fortunes", "train.bin")) and not os.path.isdir(FORTUNES):
        print(f"the fortunes corpus is missing (neither data/fortunes nor {FORTUNES}): skipped")
        return SKIP
    args.work = tempfile.mkdtemp(prefix="tf-slurm-")
    os.chmod(args.work, 0o755)
    names = args.only or list(CASES)
    created_users, created_groups = [], []
    cluster = Cluster(args.work, args.keep)
    failed = []
    t_start = time.time()
    ctx = None
    try:
        if "tenants" in names or "submit" in names:
            for u in TENANTS:
                try:
                    pwd.getpwnam(u)
                except KeyError:
                    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/bin/sh", u], check=True)
                    created_users.append(u)
            try:
                grp.getgrnam(TEAM)
            except KeyError:
                subprocess.run(["groupadd", "--system", TEAM], check=True)
                created_groups.append(TEAM)
            subprocess.run(["gpasswd", "--add", TENANTS[1], TEAM], check=True, capture_output=True)
        shared_tree(args)
        cluster.start()
        ctx = Ctx(args, cluster)
        reference(ctx)
        log(f"mpirun reference: {STEPS} steps in {time.time() - t_start:.1f} s since the start")
        ctx.figure("setup_and_reference_s", round(time.time() - t_start, 1))
        results = {}

        def run_case(name):
            t0 = time.time()
            try:
                CASES[name](ctx)
                results[name] = None
                ctx.figure(f"{name}_wall_s", round(time.time() - t0, 1))
                log(f"{name}: passed in {time.time() - t0:.1f} s")
            except Exception as e:  # noqa: BLE001 — every failure is reported with its case
                results[name] = e
                log(f"{name}: FAILED after {time.time() - t0:.1f} s: {e}\n{traceback.format_exc()}")

        threads = [threading.Thread(target=run_case, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        failed = [n for n in names if results.get(n) is not None]
    except Exception as e:  # noqa: BLE001
        log(f"setup failed: {e}\n{traceback.format_exc()}")
        failed = ["setup"]
    finally:
        cluster.stop()
        for u in created_users:
            subprocess.run(["userdel", u], capture_output=True)
        for g in created_groups:
            subprocess.run(["groupdel", g], capture_output=True)
        if failed or args.keep:
            log(f"work directory kept: {args.work}")
            for f in sorted(os.listdir(os.path.join(args.work, "log"))) if os.path.isdir(os.path.join(args.work, "log")) else []:
                if f.endswith(".log") and "slurmctld" in f and failed:
                    with open(os.path.join(args.work, "log", f), errors="replace") as fh:
                        print(f"---- {f} (tail)\n" + "".join(fh.readlines()[-40:]))
        else:
            shutil.rmtree(args.work, ignore_errors=True)
    log(f"{'FAILED: ' + ', '.join(failed) if failed else 'all passed'} in {time.time() - t_start:.1f} s")
    if args.report:
        figures = dict(ctx.figures if ctx else {}, total_s=round(time.time() - t_start, 1), failed=failed)
        with open(args.report, "w") as f:
            json.dump(figures, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
