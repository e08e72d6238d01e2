#!/usr/bin/env python3
"""Chaos tests of `trainflow launch` (CTest; stdlib only). docs/fault-tolerance.md.

  python3 tests/integration/fault/chaos_test.py --trainflow build/trainflow --source . [--only NAME ...] [--keep]

Each case runs the supervisor over a small CPU job (byte-tiny on the fortunes corpus, 2 ranks) and
breaks it on purpose; the uninterrupted run of the same job is the reference:
  kill9       random ranks killed with SIGKILL at random moments (forward, reduction, optimizer,
              checkpoint flush): the job completes with final weights bit-identical to the
              reference, and each recovery resumed at the step the survivor was on (its rescue).
  sigstop     3 ranks; one stopped with SIGSTOP: reported as hung, naming it, within two heartbeat
              intervals; the rescue is cross-checked between the 2 survivors; the job recovers.
  hang        a rank hangs in its forward pass while heartbeating (TRAINFLOW_TEST_HANG_AT): named
              (not the rank waiting for it) after --hang-timeout 3; recovered from step 299.
  freeze      a rank frozen for 4 s by the cgroup freezer (a VM pause, a reclaim stall): reported late,
              not failed; no restart; bit-identical.
  strangers   1,000 idle connections held on the heartbeat port: no failure; the supervisor holds a
              bounded number of them.
  budget      --max-restarts 1 and two failures: the job stops with exit 3 and a summary; the same
              command again names the earlier restarts and runs with a budget of its own.
  corrupt     every rank killed at once (no survivor) with the newest checkpoint corrupted: the
              restart uses the previous valid one and still ends bit-identical.
  badconfig   a configuration error the ranks find (a missing data file): one clear stop, exit 2,
              no restart.
  supervisor  the supervisor killed with SIGKILL mid-run and started again with the same arguments:
              it adopts the running job (one mpirun at any time) and the weights are bit-identical.
Multi-host cases (network namespaces as hosts) are in tests/integration/fault/netns_chaos_test.py.

Every process a case starts is stopped by PID (the supervisor, then the job's mpirun session and
ranks from the supervisor's state file) whatever happens. Exit status: 0 passed, 1 failed, 77 skipped.
"""
import argparse
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

SKIP = 77
JOB = ["--model", "configs/model/byte-tiny.json", "--train", "configs/train/fortunes.json",
       "--batch_size", "16", "--seq_len", "64", "--eval_interval", "0", "--sample_interval", "0",
       "--log_interval", "500", "--metrics_addr", "off", "--checkpoint_interval", "100"]


def log(msg):
    print(f"[chaos] {msg}", flush=True)


def tensors(path):
    """The raw tensor bytes of a safetensors file, by name (metadata left out)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    return {k: body[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in header.items() if k != "__metadata__"}


def read_json(path, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def incidents(state_dir):
    out = []
    try:
        with open(os.path.join(state_dir, "incidents.jsonl")) as f:
            for line in f:
                if line.strip():
                    out.append(json.loads(line))
    except OSError:
        pass
    return out


def alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


class Case:
    """One supervised run in its own directory; stops everything it started."""

    def __init__(self, args, name, steps, extra_launch=(), extra_train=(), np=2, env=None):
        self.args = args
        self.env = env or {}
        self.name = name
        self.dir = os.path.join(args.work, name)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.makedirs(self.dir)
        self.state = os.path.join(self.dir, "launch")
        self.cmd = [args.trainflow, "launch", "--np", str(np), "--state-dir", self.state, "--heartbeat-interval", "0.5",
                    *extra_launch, "--", "train", *JOB, "--max_steps", str(steps),
                    "--checkpoint_dir", os.path.join(self.dir, "ckpt"), "--out_dir", os.path.join(self.dir, "out"),
                    *extra_train]
        self.procs = []
        self.log_path = os.path.join(self.dir, "supervisor.log")

    def start(self):
        logf = open(self.log_path, "a")
        env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", **self.env)
        p = subprocess.Popen(self.cmd, cwd=self.args.source, stdout=logf, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def job(self):
        st = read_json(os.path.join(self.state, "state.json"), {})
        return st.get("job") or {}

    def rank_pid(self, rank, timeout=30):
        """The PID of `rank` of the running job once it has connected."""
        end = time.time() + timeout
        while time.time() < end:
            for r in self.job().get("ranks", []):
                if r.get("rank") == rank and r.get("pid") and alive(r["pid"]):
                    return r["pid"], r
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: rank {rank} never connected")

    def wait_step(self, step, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            ranks = self.job().get("ranks", [])
            if ranks and min(r.get("step", 0) for r in ranks) >= step:
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name}: step {step} not reached in {timeout} s")

    def wait(self, p, timeout):
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name}: the supervisor did not finish within {timeout} s")

    def check_metrics(self, restarts):
        """The supervisor's /metrics shows the restarts and failures (waits for the recovery)."""
        import re
        import urllib.request
        m = re.search(r"metrics at (http://[0-9.:]+)/metrics", self.output())
        assert m, f"{self.name}: no metrics endpoint line"
        end = time.time() + 30
        text = ""
        while time.time() < end:
            text = urllib.request.urlopen(m.group(1) + "/metrics", timeout=5).read().decode()
            if f"trainflow_launch_restarts_total {restarts}" in text:
                break
            time.sleep(0.2)
        assert f"trainflow_launch_restarts_total {restarts}" in text, f"{self.name}: /metrics:\n{text}"
        assert 'trainflow_launch_failures_total{cause="dead"} 1' in text, f"{self.name}: /metrics:\n{text}"
        for name in ("trainflow_launch_downtime_seconds_total", "trainflow_launch_effective_training_ratio",
                     "trainflow_launch_host_state{"):
            assert name in text, f"{self.name}: {name} missing from /metrics"

    def output(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def stop_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
                p.wait()
        job = self.job()
        if job.get("mpirun_pid"):
            try:
                os.killpg(job["mpirun_pid"], signal.SIGKILL)
            except OSError:
                pass
        for r in job.get("ranks", []):
            if r.get("pid") and alive(r["pid"]):
                try:
                    with open(f"/proc/{r['pid']}/cmdline", "rb") as f:
                        if b"trainflow" in f.read():
                            os.kill(r["pid"], signal.SIGKILL)
                except OSError:
                    pass


def reference(args, steps, np=2):
    """The uninterrupted run's weights (cached per step count and ranks)."""
    key = f"reference_{steps}" + (f"_np{np}" if np != 2 else "")
    if key in args.cache:
        return args.cache[key]
    c = Case(args, key, steps, np=np)
    try:
        p = c.start()
        rc = c.wait(p, 180)
        assert rc == 0, f"reference run failed ({rc}):\n{c.output()[-3000:]}"
        args.cache[key] = tensors(os.path.join(c.dir, "out", "model.safetensors"))
        losses = {}
        with open(os.path.join(c.dir, "out", "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "loss" in j and "step" in j:
                    losses[j["step"]] = j["loss"]
        args.cache[key + "_losses"] = losses
    finally:
        c.stop_all()
    return args.cache[key]


def reference_losses(args, steps):
    reference(args, steps)
    return args.cache[f"reference_{steps}_losses"]


def same_weights(args, case, steps, np=2):
    ref = reference(args, steps, np)
    got = tensors(os.path.join(case.dir, "out", "model.safetensors"))
    assert got.keys() == ref.keys(), f"{case.name}: tensor names differ"
    differ = [k for k in ref if got[k] != ref[k]]
    assert not differ, f"{case.name}: {len(differ)} tensor(s) differ from the uninterrupted run, e.g. {differ[:3]}"


def case_kill9(args):
    steps = 1500
    c = Case(args, "kill9", steps, extra_launch=["--quarantine-after", "100", "--metrics-addr", "127.0.0.1:0"])
    rng = random.Random(args.seed)
    try:
        p = c.start()
        kills = []
        for i in range(args.kills):
            c.wait_step(rng.randint(30, 80) + (i * steps) // (args.kills + 1), timeout=90)
            time.sleep(rng.uniform(0, 0.3))  # a random moment within the step loop
            rank = rng.randint(0, 1)
            pid, info = c.rank_pid(rank)
            gen = c.job().get("generation", 0)
            os.kill(pid, signal.SIGKILL)
            kills.append((rank, pid, info.get("step")))
            log(f"kill9: SIGKILL rank {rank} (pid {pid}) near step {info.get('step')} ({info.get('phase')})")
            if i == 0:
                c.check_metrics(restarts=1)
            # The next generation must be running before the next kill.
            end = time.time() + 60
            while time.time() < end:
                job = c.job()
                ranks = job.get("ranks", [])
                if job.get("generation", 0) > gen and len(ranks) == 2 and all(r.get("pid") for r in ranks):
                    break
                time.sleep(0.05)
        rc = c.wait(p, 180)
        out = c.output()
        assert rc == 0, f"kill9: supervisor exit {rc}:\n{out[-4000:]}"
        inc = [e for e in incidents(c.state) if e.get("kind") not in ("recovered", "readmitted")]
        assert len(inc) == len(kills), f"kill9: {len(kills)} kills but {len(inc)} incidents: {inc}"
        for e, (rank, pid, step) in zip(inc, kills):
            assert e["kind"] == "dead", f"kill9: incident {e}"
            assert e["rank"] == rank, f"kill9: killed rank {rank}, incident names {e['rank']}"
            rescue = e.get("rescue", {})
            assert rescue.get("ok"), f"kill9: no rescue after killing rank {rank}: {e}"
            # The survivor saved the step it was on: at or after what the dead rank last reported.
            assert rescue["step"] >= e["step"], f"kill9: rescued step {rescue['step']} < reported {e['step']}"
        recovered = [e for e in incidents(c.state) if e.get("kind") == "recovered"]
        assert len(recovered) == len(kills), f"kill9: {len(recovered)} recoveries for {len(kills)} kills"
        same_weights(args, c, steps)
        worst = max(e["failure_to_step_s"] for e in recovered)
        log(f"kill9: {len(kills)} kills, all rescued, bit-identical; failure to next step at most {worst:.2f} s")
    finally:
        c.stop_all()


def case_sigstop(args):
    steps = 1200
    c = Case(args, "sigstop", steps, np=3)
    try:
        p = c.start()
        c.wait_step(200)
        pid, info = c.rank_pid(1)
        t0 = time.time()
        os.kill(pid, signal.SIGSTOP)
        log(f"sigstop: SIGSTOP rank 1 (pid {pid}) at step {info.get('step')}")
        end = time.time() + 30
        while time.time() < end and not [e for e in incidents(c.state) if e.get("kind") == "hung"]:
            time.sleep(0.05)
        hung = [e for e in incidents(c.state) if e.get("kind") == "hung"]
        detected = time.time() - t0
        assert hung, f"sigstop: no hung incident:\n{c.output()[-3000:]}"
        e = hung[0]
        assert e["rank"] == 1 and "stopped" in e["detail"], f"sigstop: incident {e}"
        # Two 0.5 s intervals, plus the probe and the incident's write.
        assert detected < 5, f"sigstop: detected after {detected:.1f} s"
        rc = c.wait(p, 120)
        assert rc == 0, f"sigstop: supervisor exit {rc}:\n{c.output()[-3000:]}"
        assert not alive(pid), "sigstop: the stopped rank was left behind"
        rescue = hung[0].get("rescue", {})
        assert rescue.get("ok") and rescue.get("cross_check") == "match", \
            f"sigstop: with 2 survivors the rescue is cross-checked: {rescue}"
        same_weights(args, c, steps, np=3)
        log(f"sigstop: named rank 1 hung ({e['detail']}) {e.get('detected_after_s', 0):.2f} s after its last heartbeat")
    finally:
        c.stop_all()


def case_corrupt(args):
    steps = 1500
    c = Case(args, "corrupt", steps)
    try:
        p = c.start()
        c.wait_step(450)
        ckpt = os.path.join(c.dir, "ckpt")
        # Stop both ranks, then corrupt the newest committed checkpoint before the restart reads it.
        pids = [c.rank_pid(r)[0] for r in (0, 1)]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        steps_done = sorted(d for d in os.listdir(ckpt) if d.startswith("step-") and
                            os.path.exists(os.path.join(ckpt, d, "MANIFEST.json")))
        newest = os.path.join(ckpt, steps_done[-1])
        chunk = sorted(f for f in os.listdir(newest) if f.startswith("params."))[0]
        with open(os.path.join(newest, chunk), "r+b") as f:
            f.seek(40)
            b = f.read(1)
            f.seek(40)
            f.write(bytes([b[0] ^ 0xFF]))
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        log(f"corrupt: both ranks killed; flipped a byte of {steps_done[-1]}/{chunk}")
        rc = c.wait(p, 120)
        out = c.output()
        assert rc == 0, f"corrupt: supervisor exit {rc}:\n{out[-3000:]}"
        assert steps_done[-1] in out, f"corrupt: the corrupted checkpoint was not reported:\n{out[-3000:]}"
        resumed = [l for l in out.splitlines() if l.startswith("resumed from")]
        assert resumed and steps_done[-2] in resumed[-1], f"corrupt: did not resume from {steps_done[-2]}: {resumed}"
        same_weights(args, c, steps)
        log(f"corrupt: resumed from {steps_done[-2]} after {steps_done[-1]} failed its checksum; bit-identical")
    finally:
        c.stop_all()


def case_badconfig(args):
    c = Case(args, "badconfig", 100, extra_train=["--train_data", "/nonexistent/train.bin"])
    try:
        p = c.start()
        rc = c.wait(p, 60)
        out = c.output()
        assert rc == 2, f"badconfig: exit {rc}, expected 2:\n{out[-3000:]}"
        assert "/nonexistent/train.bin" in out, f"badconfig: the message does not name the file:\n{out[-2000:]}"
        st = read_json(os.path.join(c.state, "state.json"), {})
        assert st.get("generation") == 1 and st.get("restarts") == 0, f"badconfig: restarted: {st}"
        log("badconfig: stopped once with exit 2, naming the file; no restart")
    finally:
        c.stop_all()
    # A config the supervisor itself rejects: nothing is launched.
    c = Case(args, "badconfig2", 100, extra_train=["--lr", "-1"])
    try:
        p = c.start()
        rc = c.wait(p, 30)
        assert rc == 2 and "lr" in c.output(), f"badconfig2: exit {rc}:\n{c.output()[-2000:]}"
        assert not os.path.exists(os.path.join(c.state, "state.json")), "badconfig2: something was launched"
    finally:
        c.stop_all()


def case_supervisor(args):
    steps = 1500
    c = Case(args, "supervisor", steps)
    try:
        p = c.start()
        c.wait_step(300)
        mpirun = c.job()["mpirun_pid"]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        log(f"supervisor: SIGKILL to the supervisor; mpirun {mpirun} keeps running: {alive(mpirun)}")
        time.sleep(0.5)
        p2 = c.start()
        end = time.time() + 30
        while time.time() < end and read_json(os.path.join(c.state, "state.json"), {}).get("pid") != p2.pid:
            time.sleep(0.05)
        # A second supervisor for the same state is refused while the first runs.
        dup = subprocess.run(c.cmd, cwd=args.source, capture_output=True, text=True, timeout=30)
        assert dup.returncode == 2 and "another supervisor" in dup.stderr + dup.stdout, \
            f"supervisor: a duplicate supervisor was not refused ({dup.returncode}): {dup.stderr}"
        rc = c.wait(p2, 180)
        out = c.output()
        assert rc == 0, f"supervisor: restarted supervisor exit {rc}:\n{out[-3000:]}"
        assert f"adopting the running job of generation 1 (mpirun pid {mpirun})" in out, \
            f"supervisor: the running job was not adopted:\n{out[-3000:]}"
        st = read_json(os.path.join(c.state, "state.json"), {})
        assert st.get("generation") == 1, f"supervisor: a second job was launched: generation {st.get('generation')}"
        same_weights(args, c, steps)
        log("supervisor: the restarted supervisor adopted the job; one generation; bit-identical")
    finally:
        c.stop_all()


def case_hang(args):
    steps = 1200
    marker = os.path.join(args.work, "hang-once")
    c = Case(args, "hang", steps, extra_launch=["--hang-timeout", "3"],
             env={"TRAINFLOW_TEST_HANG_AT": f"1:300:{marker}"})
    try:
        p = c.start()
        end = time.time() + 60
        while time.time() < end and not [e for e in incidents(c.state) if e.get("kind") == "hung"]:
            time.sleep(0.05)
        hung = [e for e in incidents(c.state) if e.get("kind") == "hung"]
        assert hung, f"hang: no hung incident:\n{c.output()[-3000:]}"
        e = hung[0]
        # Rank 1 hangs in compute; rank 0 waits in communication and is not the one named.
        assert e["rank"] == 1 and e["phase"] == "compute" and e.get("ranks") == [1], f"hang: incident {e}"
        assert e.get("rescue", {}).get("ok") and e["rescue"]["step"] == 299, f"hang: rescue {e.get('rescue')}"
        rc = c.wait(p, 120)
        assert rc == 0, f"hang: supervisor exit {rc}:\n{c.output()[-3000:]}"
        same_weights(args, c, steps)
        log(f"hang: {e['detail']}; rescued step 299; bit-identical")
    finally:
        c.stop_all()


def case_budget(args):
    c = Case(args, "budget", 100000, extra_launch=["--max-restarts", "1"])
    try:
        p = c.start()
        for _ in range(2):
            c.wait_step(30)
            gen = c.job().get("generation")
            os.kill(c.rank_pid(0)[0], signal.SIGKILL)
            end = time.time() + 30
            while time.time() < end and c.job().get("generation") == gen and p.poll() is None:
                time.sleep(0.05)
        rc = c.wait(p, 60)
        out = c.output()
        assert rc == 3 and "giving up: 2 restarts, more than --max-restarts 1" in out, f"budget: exit {rc}:\n{out[-2000:]}"
        assert "summary:" in out, "budget: no summary"
        # The same command again: the earlier restarts are named and this run has a budget of its own.
        before = len(out)
        p = c.start()
        c.wait_step(1, timeout=60)
        again = c.output()[before:]
        assert "earlier runs of this job restarted it 2 time(s)" in again and "giving up" not in again, \
            f"budget: rerun:\n{again[-2000:]}"
        os.kill(p.pid, signal.SIGTERM)
        rc = c.wait(p, 60)
        assert rc == 5, f"budget: the rerun stopped with {rc}:\n{c.output()[before:][-2000:]}"
        log("budget: stopped after the restart budget, with a summary; a rerun names the earlier restarts")
    finally:
        c.stop_all()


class Freezer:
    """A cgroup whose processes the kernel's freezer stops and resumes (a VM pause or a reclaim stall,
    as the process sees it: every thread off the CPU, not SIGSTOPped). v1 freezer or cgroup v2."""

    def __init__(self, name):
        v1 = "/sys/fs/cgroup/freezer"
        v2 = next((d for d in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
                   if os.path.exists(os.path.join(d, "cgroup.subtree_control"))), None)
        if os.path.exists(os.path.join(v1, "freezer.state")):
            self.root, self.v2 = v1, False
        elif v2:
            self.root, self.v2 = v2, True
        else:
            raise OSError("no cgroup freezer")
        self.path = os.path.join(self.root, name)
        os.makedirs(self.path, exist_ok=True)
        if self.v2 and not os.path.exists(os.path.join(self.path, "cgroup.freeze")):
            self.remove()
            raise OSError("cgroup v2 without cgroup.freeze")

    def _write(self, name, value):
        with open(os.path.join(self.path, name), "w") as f:
            f.write(value)

    def add(self, pid):
        self._write("cgroup.procs", str(pid))

    def freeze(self, frozen):
        if self.v2:
            self._write("cgroup.freeze", "1" if frozen else "0")
            return
        self._write("freezer.state", "FROZEN" if frozen else "THAWED")
        end = time.time() + 5
        want = "FROZEN" if frozen else "THAWED"
        while time.time() < end:
            with open(os.path.join(self.path, "freezer.state")) as f:
                if f.read().strip() == want:
                    return
            time.sleep(0.01)

    def remove(self):
        try:
            self.freeze(False)
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                pids = [l.strip() for l in f if l.strip()]
            for pid in pids:
                with open(os.path.join(self.root, "cgroup.procs"), "w") as f:
                    f.write(pid)
            os.rmdir(self.path)
        except OSError:
            pass


def case_freeze(args):
    """A rank frozen for 4 s (every thread off the CPU, state D): late, not failed; no restart, the job
    finishes; SIGSTOP (case sigstop) is still caught within two intervals."""
    steps = 1500
    try:
        fr = Freezer(f"tf-chaos-freeze-{os.getpid()}")
    except OSError as e:
        log(f"freeze: skipped ({e})")
        return
    c = Case(args, "freeze", steps)
    try:
        p = c.start()
        c.wait_step(200)
        pid, info = c.rank_pid(1)
        fr.add(pid)
        fr.freeze(True)
        log(f"freeze: rank 1 (pid {pid}) frozen at step {info.get('step')}")
        time.sleep(4)
        fr.freeze(False)
        rc = c.wait(p, 120)
        out = c.output()
        assert rc == 0, f"freeze: supervisor exit {rc}:\n{out[-3000:]}"
        failures = [e for e in incidents(c.state) if e.get("kind") not in ("recovered", "readmitted")]
        assert not failures, f"freeze: a frozen rank was taken for a failure: {failures}"
        assert "rank 1 on" in out and "is late" in out, f"freeze: the lateness was not reported:\n{out[-3000:]}"
        assert "heartbeating again" in out, f"freeze: the return was not reported:\n{out[-3000:]}"
        same_weights(args, c, steps)
        log("freeze: 4 s frozen, reported late, no failure, no restart; bit-identical")
    finally:
        fr.remove()
        c.stop_all()


def case_strangers(args):
    """1,000 idle connections held on the heartbeat port while the job runs: no rank is taken for a
    failure, and the supervisor never holds more than a bounded number of them."""
    import resource
    import socket
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1100
    if hard != resource.RLIM_INFINITY and hard < want:
        log(f"strangers: skipped (RLIMIT_NOFILE {hard})")
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    steps = 1500
    c = Case(args, "strangers", steps)
    socks = []
    try:
        p = c.start()
        c.wait_step(100)
        port = c.job().get("port")
        assert port, f"strangers: no heartbeat port in the state: {c.job()}"
        end = time.time() + 20
        while len(socks) < 1000 and time.time() < end:
            s = socket.socket()
            s.settimeout(0.5)
            try:
                s.connect(("127.0.0.1", port))
                socks.append(s)
            except OSError:
                s.close()
        held = len(socks)
        sup = p.pid
        open_fds = len(os.listdir(f"/proc/{sup}/fd"))
        time.sleep(3)
        for s in socks:
            s.close()
        socks = []
        rc = c.wait(p, 120)
        out = c.output()
        assert rc == 0, f"strangers: supervisor exit {rc}:\n{out[-3000:]}"
        failures = [e for e in incidents(c.state) if e.get("kind") not in ("recovered", "readmitted")]
        assert not failures, f"strangers: {held} idle connections caused failures: {failures}"
        assert open_fds < 200, f"strangers: the supervisor held {open_fds} descriptors for {held} strangers"
        same_weights(args, c, steps)
        log(f"strangers: {held} idle connections; the supervisor held {open_fds} descriptors; no failure")
    finally:
        for s in socks:
            s.close()
        c.stop_all()


CASES = {"kill9": case_kill9, "freeze": case_freeze, "strangers": case_strangers, "hang": case_hang, "budget": case_budget, "sigstop": case_sigstop, "corrupt": case_corrupt, "badconfig": case_badconfig,
         "supervisor": case_supervisor}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("--only", nargs="*", choices=sorted(CASES))
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "0")) or None)
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    args.trainflow = os.path.abspath(args.trainflow)
    args.source = os.path.abspath(args.source)
    if shutil.which("mpirun") is None:
        print("mpirun not found: skipped")
        return SKIP
    if not os.path.exists(os.path.join(args.source, "data/fortunes/train.bin")):
        r = subprocess.run([args.trainflow, "prepare", "--input", "/usr/share/games/fortunes", "--delimiter", "%",
                            "--val-fraction", "0.05", "--out-dir", "data/fortunes"], cwd=args.source,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"no fortunes corpus ({r.stderr.strip()}): skipped")
            return SKIP
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    log(f"seed {args.seed} (CHAOS_SEED={args.seed} repeats this run)")
    args.work = tempfile.mkdtemp(prefix="tf-chaos-")
    args.cache = {}
    failed = []
    try:
        for name in args.only or list(CASES):
            t0 = time.time()
            try:
                CASES[name](args)
                log(f"{name}: passed in {time.time() - t0:.1f} s")
            except Exception as e:  # an assertion, or an error talking to the supervisor
                failed.append(name)
                log(f"{name}: FAILED: {type(e).__name__}: {e}")
                sup_log = os.path.join(args.work, name, "supervisor.log")
                if os.path.exists(sup_log):
                    with open(sup_log, errors="replace") as f:
                        tail = f.read().splitlines()[-60:]
                    log(f"{name}: the last {len(tail)} lines of {sup_log}:\n" + "\n".join(tail))
    finally:
        if args.keep or failed:
            log(f"work directory kept: {args.work}")
        else:
            shutil.rmtree(args.work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
