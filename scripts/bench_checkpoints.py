#!/usr/bin/env python3
"""Checkpoint benchmarks on the CPU (bench/RESULTS.md, "Checkpoints"), one run after another.

  python3 scripts/bench_checkpoints.py [--steps 130] [--out /tmp/tf_bench_ckpt] [--parts ...]

Parts:
  overhead  GPT-2 124M (gpt2-tokenized fortunes, B=4, T=64, 2 threads): no checkpoints, an
            asynchronous full checkpoint at step 100, an incremental one (full at 50, incremental
            at 100), and the synchronous save of the same bytes (checkpoint_async false). Per run:
            the median step time, the stall at step 100 (time the loop was blocked), the writer's
            time, and the overhead per 100 steps = stall + the extra time of the steps after it
            (against the no-checkpoint run's median).
  s3        upload and restore of an uncompressed 124M checkpoint through s3rver on loopback, against
            boto3's upload_file/download_file of the same number of bytes on the same server.
  disk      write throughput of an uncompressed 124M checkpoint against dd (conv=fsync) of the
            same size on the same disk, and the restore time of a checkpoint.
  sizes     per-component sizes of incremental checkpoints 10, 100 (and 1000) steps after their
            full base, against the uncompressed full state: the fortunes default job (byte-small)
            and GPT-2 124M.
Run it on a quiet machine: nothing else may use the cores.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "trainflow")


def run(args, env=None):
    t0 = time.time()
    p = subprocess.run([BIN] + args, capture_output=True, text=True, env=env, cwd=ROOT)
    if p.returncode not in (0, 5):
        sys.exit(f"trainflow {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p.stdout + p.stderr, time.time() - t0


def records(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def gpt2_data(out):
    d = os.path.join(out, "fortunes-gpt2")
    if not os.path.exists(os.path.join(d, "train.bin")):
        run(["prepare", "--input", "/usr/share/games/fortunes", "--out-dir", d, "--tokenizer", "gpt2"])
    return d


def train_124m(out, data, name, steps, extra):
    out_dir = os.path.join(out, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    args = ["train", "--model", os.path.join(ROOT, "configs/model/gpt2-124m.json"), "--train_data",
            os.path.join(data, "train.bin"), "--batch_size", "4", "--seq_len", "64", "--max_steps", str(steps),
            "--eval_batches", "0", "--sample_tokens", "0", "--threads", "2", "--log_interval", "50",
            "--lr", "3e-4", "--warmup_steps", "10", "--out_dir", out_dir] + extra
    text, wall = run(args)
    return records(out_dir), text


def writer_seconds(text, step):
    m = re.search(rf"checkpoint step {step} committed .*written in ([0-9.]+) s", text)
    return float(m.group(1)) if m else float("nan")


def part_overhead(out, data, steps):
    """Overhead per checkpoint, measured where drift cannot hide it: each run checkpoints every 20
    steps, and each checkpoint's cost is its stall plus the extra time of the 10 steps after it
    (which overlap the writer; on 2 cores it takes CPU from training) against the median of the 10
    steps before the next one (the writer long done). The median over the run's checkpoints, divided
    by 100 steps, is the overhead of checkpointing every 100 steps. Runs drift by a few percent on
    this shared 2-core VM (as large as the effect); neighbouring steps do not. The control run,
    without checkpoints, gives the method's zero."""
    interval, after = 20, 10
    ckdir = os.path.join(out, "ckpt")
    configs = [
        ("no checkpoints (control)", None, []),
        ("async full (writer at normal priority, the default)", "full", []),
        ("async full, writer at idle priority", "full", ["--checkpoint_writer_priority", "idle"]),
        ("async incremental, full every 5th", "incremental", ["--checkpoint_full_every", "5"]),
        ("async incremental, full every 5th, idle priority", "incremental",
         ["--checkpoint_full_every", "5", "--checkpoint_writer_priority", "idle"]),
        ("sync full (`checkpoint_async false`)", "full", ["--checkpoint_async", "false"]),
    ]
    rows = []
    for i, (name, kind, extra) in enumerate(configs):
        shutil.rmtree(ckdir, ignore_errors=True)
        flags = []
        if kind:
            flags = ["--checkpoint_dir", ckdir, "--checkpoint_interval", str(interval), "--checkpoint_keep_last", "2",
                     "--checkpoint_when_busy", "wait"] + extra
        recs, text = train_124m(out, data, f"run{i}", steps, flags)
        at = {r["step"]: r for r in recs}
        step_ms = statistics.median(at[s]["ms"] for s in range(3, steps + 1))
        costs, stalls, writers = [], [], []
        for c in range(interval, steps - interval + 1, interval):
            if kind == "incremental" and (c // interval) % 5 == 1:
                continue  # a full one
            ref = statistics.median(at[s]["ms"] for s in range(c + after + 1, c + interval + 1))
            stall = at[c].get("checkpoint_stall_ms", 0.0)
            costs.append(stall + sum(at[s]["ms"] - ref for s in range(c + 1, c + after + 1)))
            stalls.append(stall)
            w = writer_seconds(text, c)
            if w == w:
                writers.append(w)
        cost = statistics.median(costs)
        rows.append((name, step_ms, len(costs), statistics.median(stalls), statistics.median(writers) if writers else
                     float("nan"), cost, min(costs), max(costs), cost / (100 * step_ms) * 100))
    print(f"\n## overhead: GPT-2 124M, CPU, 2 threads, B=4 T=64, a checkpoint every {interval} steps ({steps} steps)")
    print("| run | median step ms | checkpoints measured | median stall (ms) | median writer time (s) | "
          "median cost per checkpoint (ms) [min, max] | overhead at one checkpoint per 100 steps |")
    print("|---|---|---|---|---|---|---|")
    for name, ms, n, stall, wr, cost, lo, hi, ov in rows:
        print(f"| {name} | {ms:.0f} | {n} | {stall:.0f} | {wr:.2f} | {cost:.0f} [{lo:.0f}, {hi:.0f}] | {ov:+.2f}% |")


def part_disk(out, data, reps=3):
    """The writer's time for an uncompressed 124M checkpoint against dd writing the same bytes
    (concatenated, from the page cache) with conv=fsync to the same disk: `reps` of each,
    interleaved, medians (this VM's disk varies by 2x from one write to the next)."""
    ckdir = os.path.join(out, "ckpt")
    src = os.path.join(out, "dd-source.bin")
    target = os.path.join(out, "dd.bin")
    writes, dds = [], []
    for rep in range(reps):
        shutil.rmtree(ckdir, ignore_errors=True)
        subprocess.run(["sync"], check=True)
        _, text = train_124m(out, data, "run", 1, ["--checkpoint_dir", ckdir, "--checkpoint_compress", "false"])
        with open(os.path.join(ckdir, "step-000000000001", "MANIFEST.json")) as f:
            m = json.load(f)
        objects = [o for o in m["objects"] if o["key"].startswith("step-000000000001/")]
        nbytes = sum(o["bytes"] for o in objects)
        writes.append(writer_seconds(text, 1))
        if rep == 0:
            with open(src, "wb") as f:
                for o in objects:
                    with open(os.path.join(ckdir, o["key"]), "rb") as g:
                        shutil.copyfileobj(g, f)
            with open(src, "rb") as f:  # into the page cache: dd reads from memory
                while f.read(1 << 24):
                    pass
        subprocess.run(["sync"], check=True)
        t0 = time.time()
        subprocess.run(["dd", f"if={src}", f"of={target}", "bs=16M", "conv=fsync"], capture_output=True, check=True)
        dds.append(time.time() - t0)
        os.remove(target)
    os.remove(src)
    wr, dd_s = statistics.median(writes), statistics.median(dds)
    # Restore: a run that resumes and stops right away; its resume line says how long loading took.
    text, _ = run(["train", "--model", os.path.join(ROOT, "configs/model/gpt2-124m.json"), "--train_data",
                   os.path.join(data, "train.bin"), "--batch_size", "4", "--seq_len", "64", "--max_steps", "1",
                   "--eval_batches", "0", "--sample_tokens", "0", "--threads", "2", "--lr", "3e-4", "--warmup_steps",
                   "10", "--out_dir", os.path.join(out, "restore"), "--checkpoint_dir", ckdir,
                   "--checkpoint_compress", "false"])
    restored = re.search(r"restored in ([0-9.]+) s", text)
    print(f"\n## disk: uncompressed 124M checkpoint (params + moments) vs dd of the same bytes, medians of {reps}")
    print(f"checkpoint write: {nbytes / 2**30:.2f} GiB in {wr:.2f} s = {nbytes / wr / 2**20:.0f} MiB/s "
          f"(each: {', '.join(f'{w:.2f}' for w in writes)} s)")
    print(f"dd conv=fsync:    {nbytes / 2**30:.2f} GiB in {dd_s:.2f} s = {nbytes / dd_s / 2**20:.0f} MiB/s "
          f"(each: {', '.join(f'{d:.2f}' for d in dds)} s)")
    print(f"ratio: {dd_s / wr * 100:.0f}% of dd")
    print(f"restore (read, verify, load into the model): {restored.group(1) if restored else '?'} s")


DELTA_SIZES = os.path.join(ROOT, "build", "bench", "checkpoint_delta_sizes")


def delta_sizes(ckdir, base, steps):
    """bench/checkpoint_delta_sizes: what incremental checkpoints at `steps` would store against a
    full one at `base`, per component, by the writer's own rules."""
    p = subprocess.run([DELTA_SIZES, ckdir, str(base)] + [str(s) for s in steps], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"checkpoint_delta_sizes {ckdir} {base} failed:\n{p.stderr}")
    print(p.stdout, end="")


def part_sizes(out, data, big_steps):
    # The default job (byte-small on fortunes), a checkpoint every 10 steps, all kept.
    ckdir = os.path.join(out, "ckpt_sizes")
    shutil.rmtree(ckdir, ignore_errors=True)
    fortunes_dir = os.path.join(out, "fortunes")
    shutil.rmtree(fortunes_dir, ignore_errors=True)
    run(["train", "--model", os.path.join(ROOT, "configs/model/byte-small.json"), "--train",
         os.path.join(ROOT, "configs/train/fortunes.json"), "--eval_interval", "0", "--sample_tokens", "0",
         "--log_interval", "500", "--out_dir", fortunes_dir, "--checkpoint_dir", ckdir, "--checkpoint_interval", "10",
         "--checkpoint_keep_last", "0", "--checkpoint_when_busy", "wait"])
    for base in (10, 500, 1000):
        print(f"\n## sizes: the default job (byte-small, fortunes, 1500 steps), against a full checkpoint at step {base}")
        delta_sizes(ckdir, base, [s for s in (base + 10, base + 100, base + 1000) if s <= 1500])
    shutil.rmtree(ckdir, ignore_errors=True)
    # The residuals: the same job on 2 ranks (MPI on loopback) with int8 compression and error
    # feedback, stopped at step 210.
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "oob_tcp_if_include", "lo", "--mca",
           "btl_tcp_if_include", "lo", "-np", "2", "-x", "OMP_NUM_THREADS=1", "-x", "OMP_WAIT_POLICY=PASSIVE", BIN]
    shutil.rmtree(fortunes_dir, ignore_errors=True)
    p = subprocess.run(mpi + ["train", "--model", os.path.join(ROOT, "configs/model/byte-small.json"), "--train",
                              os.path.join(ROOT, "configs/train/fortunes.json"), "--eval_interval", "0",
                              "--sample_tokens", "0", "--threads", "1", "--compression", "int8", "--error_feedback",
                              "true", "--stop_at_step", "210", "--out_dir", fortunes_dir, "--checkpoint_dir", ckdir,
                              "--checkpoint_interval", "10", "--checkpoint_keep_last", "0", "--checkpoint_when_busy",
                              "wait"], capture_output=True, text=True, cwd=ROOT)
    if p.returncode not in (0, 5):
        sys.exit(f"2-rank int8 run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    print("\n## sizes: the default job on 2 ranks, int8 compression with error feedback, against step 100")
    delta_sizes(ckdir, 100, [110, 200])
    shutil.rmtree(ckdir, ignore_errors=True)
    # GPT-2 124M: one run of big_steps keeping a checkpoint every 100 steps; the +10 ones come from
    # runs resumed from those and stopped 10 steps later (same schedule: stop_at_step, not max_steps).
    ck = os.path.join(out, "ckpt_sizes124m")
    shutil.rmtree(ck, ignore_errors=True)
    train_124m(out, data, "sizes124m", big_steps, ["--checkpoint_dir", ck, "--checkpoint_interval", "100",
                                                   "--checkpoint_keep_last", "0"])
    side = os.path.join(out, "ckpt_sizes124m_side")
    for base in (0, 500, big_steps - 100):
        shutil.rmtree(side, ignore_errors=True)
        resume = ["--resume", os.path.join(ck, f"step-{base:012d}")] if base else []
        train_124m(out, data, f"sizes124m_{base}", big_steps, ["--checkpoint_dir", side, "--checkpoint_interval", "10",
                                                               "--stop_at_step", str(base + 20 if base == 0 else base + 10)]
                   + resume)
        for name in os.listdir(side):
            if name.startswith("step-") and not os.path.exists(os.path.join(ck, name)):
                shutil.copytree(os.path.join(side, name), os.path.join(ck, name))
    shutil.rmtree(side, ignore_errors=True)
    print(f"\n## sizes: GPT-2 124M (B=4, T=64, lr 3e-4 cosine over {big_steps} steps)")
    delta_sizes(ck, 10, [20])
    for base in (100, 500, big_steps - 100):
        delta_sizes(ck, base, [s for s in (base + 10, base + 100, base + 1000) if s <= big_steps])


def start_s3rver(out):
    """s3rver (scripts/install_s3rver.sh) on 127.0.0.1 with bucket 'bench'; returns (process, endpoint)."""
    import socket
    script = os.path.join(ROOT, "third_party/s3rver/node_modules/s3rver/bin/s3rver.js")
    if not os.path.exists(script):
        sys.exit(f"{script} missing: run scripts/install_s3rver.sh")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = os.path.join(out, "s3rver")
    shutil.rmtree(data, ignore_errors=True)
    os.makedirs(data)
    legacy = subprocess.run(["node", "--openssl-legacy-provider", "-e", "0"], capture_output=True).returncode == 0
    proc = subprocess.Popen(["node"] + (["--openssl-legacy-provider"] if legacy else []) +
                            [script, "-d", data, "-a", "127.0.0.1", "-p", str(port), "--silent",
                             "--configure-bucket", "bench"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):  # bounded: 30 s
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
        except OSError:
            time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}"


def part_s3(out, data):
    proc, endpoint = start_s3rver(out)
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="S3RVER", AWS_SECRET_ACCESS_KEY="S3RVER",
               AWS_REGION="us-east-1")
    try:
        url = "s3://bench/ckpt"
        common = ["train", "--model", os.path.join(ROOT, "configs/model/gpt2-124m.json"), "--train_data",
                  os.path.join(data, "train.bin"), "--batch_size", "4", "--seq_len", "64", "--eval_batches", "0",
                  "--sample_tokens", "0", "--threads", "2", "--lr", "3e-4", "--warmup_steps", "10",
                  "--checkpoint_dir", url, "--checkpoint_compress", "false"]
        text, _ = run(common + ["--max_steps", "1", "--out_dir", os.path.join(out, "s3run")], env=env)
        m = re.search(r"checkpoint step 1 committed to .*\(([0-9.]+) GiB of state, ([0-9.]+) GiB stored", text)
        wr = re.search(r"written in ([0-9.]+) s", text)
        text2, _ = run(common + ["--max_steps", "1", "--out_dir", os.path.join(out, "s3restore")], env=env)
        restored = re.search(r"restored in ([0-9.]+) s", text2)
        import boto3
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="S3RVER", aws_secret_access_key="S3RVER",
                          region_name="us-east-1")
        blob = os.path.join(out, "blob.bin")
        size = int(float(m.group(2)) * 2**30) if m else 1 << 30
        with open(blob, "wb") as f:
            f.write(os.urandom(size))
        t0 = time.time()
        s3.upload_file(blob, "bench", "blob.bin")
        up = time.time() - t0
        t0 = time.time()
        s3.download_file("bench", "blob.bin", blob + ".back")
        down = time.time() - t0
        os.remove(blob)
        os.remove(blob + ".back")
        print("\n## S3 (s3rver on loopback): uncompressed 124M checkpoint vs boto3 on a file of the same size")
        if m and wr:
            gib = float(m.group(2))
            print(f"trainflow upload (writer, 4 chunks in flight): {gib:.2f} GiB in {float(wr.group(1)):.2f} s = "
                  f"{gib * 1024 / float(wr.group(1)):.0f} MiB/s")
        if restored and m:
            print(f"trainflow restore (download + verify + load): {restored.group(1)} s = "
                  f"{float(m.group(2)) * 1024 / float(restored.group(1)):.0f} MiB/s")
        print(f"boto3 upload_file:   {size / 2**30:.2f} GiB in {up:.2f} s = {size / up / 2**20:.0f} MiB/s")
        print(f"boto3 download_file: {size / 2**30:.2f} GiB in {down:.2f} s = {size / down / 2**20:.0f} MiB/s")
    finally:
        proc.kill()
        proc.wait()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="steps of the overhead runs")
    ap.add_argument("--big-steps", type=int, default=1100, help="124M steps for the sizes part")
    ap.add_argument("--out", default="/tmp/tf_bench_ckpt")
    ap.add_argument("--parts", default="overhead,disk,s3,sizes")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    data = gpt2_data(a.out)
    print(f"# bench_checkpoints.py --steps {a.steps} --big-steps {a.big_steps} ({time.strftime('%Y-%m-%d %H:%M')})")
    parts = a.parts.split(",")
    if "overhead" in parts:
        part_overhead(a.out, data, a.steps)
    if "disk" in parts:
        part_disk(a.out, data)
    if "s3" in parts:
        part_s3(a.out, data)
    if "sizes" in parts:
        part_sizes(a.out, data, a.big_steps)


if __name__ == "__main__":
    main()
