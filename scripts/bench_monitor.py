#!/usr/bin/env python3
"""The monitor's cost on the default job, end to end: the same run with the endpoint off and on
(on: a client scrapes /metrics and polls the dashboard's /api/steps and /api/events every second, as
Prometheus and an open dashboard tab would), interleaved repetitions, the median step time of each
run from its metrics.jsonl (the first 20 steps left out as warm-up), then the median over runs.

Usage: python3 scripts/bench_monitor.py [--build build] [--steps 200] [--reps 3]
Run on a quiet machine (nothing else timing or building). The training-thread cost per step alone is
measured by build/bench/monitor_bench (Google Benchmark)."""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def poll(url, stop):
    """Scrapes like Prometheus plus one dashboard tab, once a second, until stop is set."""
    after = 0
    while not stop.is_set():
        try:
            urllib.request.urlopen(url + "/metrics", timeout=5).read()
            body = urllib.request.urlopen(f"{url}/api/steps?after={after}", timeout=5).read()
            after = json.loads(body).get("last_step", after)
            urllib.request.urlopen(url + "/api/events?after=0", timeout=5).read()
        except OSError:
            pass
        stop.wait(1.0)


def run(binary, data, out, steps, monitor):
    args = [binary, "train", "--model", f"{ROOT}/configs/model/byte-small.json",
            "--train", f"{ROOT}/configs/train/fortunes.json", "--train_data", f"{data}/train.bin",
            "--val_data", f"{data}/val.bin", "--out_dir", out, "--max_steps", str(steps),
            "--eval_batches", "0", "--sample_tokens", "0", "--log_interval", "1000",
            "--metrics_addr", "127.0.0.1:0" if monitor else "off"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop = threading.Event()
    poller = None
    lines = []
    for line in p.stdout:
        lines.append(line)
        m = re.search(r"monitor: rank 0 at (http://[0-9.]+:\d+)/", line)
        if m and poller is None:
            poller = threading.Thread(target=poll, args=(m.group(1), stop), daemon=True)
            poller.start()
    p.wait()
    stop.set()
    if poller:
        poller.join(10)
    if p.returncode != 0:
        sys.exit("run failed:\n" + "".join(lines[-20:]))
    if monitor and poller is None:
        sys.exit("the run did not say where it serves")
    ms = []
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if "event" not in r and r["step"] > 20:
                ms.append(r["ms"])
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    binary = os.path.join(args.build, "trainflow")
    tmp = tempfile.mkdtemp(prefix="tf-bench-monitor-")
    try:
        data = os.path.join(tmp, "data")
        subprocess.run([binary, "prepare", "--input", "/usr/share/games/fortunes", "--delimiter", "%",
                        "--val-fraction", "0.05", "--out-dir", data], check=True, stdout=subprocess.DEVNULL)
        results = {False: [], True: []}
        for rep in range(args.reps):
            for monitor in (False, True):
                ms = run(binary, data, os.path.join(tmp, f"out-{rep}-{int(monitor)}"), args.steps, monitor)
                results[monitor].append(ms)
                print(f"rep {rep}: monitor {'on ' if monitor else 'off'} median step {ms:.2f} ms", flush=True)
        off, on = statistics.median(results[False]), statistics.median(results[True])
        print(f"median over {args.reps} runs: off {off:.2f} ms, on {on:.2f} ms: {100 * (on - off) / off:+.2f}%")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
