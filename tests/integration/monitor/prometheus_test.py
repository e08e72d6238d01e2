#!/usr/bin/env python3
"""The Grafana dashboard and the /metrics endpoint against a real Prometheus (CTest; stdlib only).

  python3 tests/integration/monitor/prometheus_test.py --trainflow build/trainflow --source . \
      [--fake-nvml libfake-nvml.so] [--mpirun "mpirun ... -np 2 ..."]

1. monitor/grafana/trainflow.json: valid JSON in Grafana's dashboard model (required keys, unique
   panel ids, every panel's datasource `${datasource}`, targets with expr and refId, a sane grid) and
   every metric any expression names is in docs/monitoring.md's metric table.
2. A real 2-rank training run (mpirun; fortunes data, byte-tiny, checkpoints, int8 gradient
   compression, evaluation) serving /metrics on 127.0.0.1; the ranks' ports come from their
   `monitor: rank R at http://HOST:PORT/` log lines.
3. Each rank's exposition: `promtool check metrics` is silent, and it matches the doc (every
   documented metric present with its type, labels and enumerated label values; nothing undocumented).
4. Debian's prometheus scrapes the ranks every second; every panel's expression (template variables
   substituted) returns data through /api/v1/query, and the template variables' label_values() resolve.
   GPU panels without --fake-nvml, and MFU panels when no rank exports trainflow_mfu_ratio (its peak
   is unknown on the CPU), are reported as skipped.

Everything runs on loopback and is stopped (process group, then every process of its session) at the
end, whatever happened. Exit status: 0 passed, 1 failed, 77 skipped (a tool or the corpus missing).
--server-cmd "CMD" replaces the training run by CMD --metrics_addr 127.0.0.1:PORT (development).
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

SKIP = 77
DEFAULT_MPIRUN = ("mpirun --allow-run-as-root --oversubscribe --mca oob_tcp_if_include lo "
                  "--mca btl_tcp_if_include lo -np 2 -x OMP_NUM_THREADS=1")
PROM_JOB = "trainflow"
# Grafana's built-in variables, as a 1 s scrape interval and the dashboard's default range give them,
# and the dashboard's own: $job is the scrape job below, $instance "All" (the variable's allValue).
GRAFANA_VARS = {"__rate_interval": "10s", "__interval": "1s", "__interval_ms": "1000", "__range": "1h",
                "__range_s": "3600", "__range_ms": "3600000", "job": PROM_JOB, "instance": ".*"}
DS_REF = {"type": "prometheus", "uid": "${datasource}"}
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text", "row", "state-timeline",
               "status-history", "barchart", "piechart", "histogram", "logs"}
EXTRA_LABELS = {"job", "instance", "le"}  # labels Prometheus adds, and the histogram's
MFU = "trainflow_mfu_ratio"
RANK_LINE = re.compile(r"monitor: rank (\d+) at http://([^/\s]+)/")

# Local loopback only: never through a proxy from the environment.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Results:
    def __init__(self):
        self.failures = []
        self.skips = []
        self.passed = 0

    def fail(self, what):
        self.failures.append(what)
        print(f"FAIL {what}", flush=True)

    def skip(self, what):
        self.skips.append(what)
        print(f"SKIP {what}", flush=True)

    def ok(self, what):
        self.passed += 1
        print(f"ok   {what}", flush=True)

    def summary(self, seconds):
        print(f"\n({seconds:.1f} s)\n{self.passed} passed, {len(self.failures)} failed, {len(self.skips)} skipped",
              flush=True)


# ------------------------------------------------------------------------------------------------
# docs/monitoring.md's metric table

def parse_doc_metrics(path):
    """{name: {"type", "labels": {label: [values] or None}, "rank0_only"}} from the table under ## Metrics."""
    text = open(path, encoding="utf-8").read()
    m = re.search(r"^## Metrics\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise ValueError(f"{path}: no '## Metrics' section")
    metrics = {}
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4:
            continue
        name = re.fullmatch(r"`(trainflow_[a-z0-9_]+)`", cells[0])
        if not name:
            continue
        labels = {}
        for chunk in filter(None, (c.strip() for c in cells[2].split(";"))):
            names_part, _, values_part = chunk.partition("=")
            names = re.findall(r"`([^`]+)`", names_part)
            for n in names:
                labels[n] = None
            if values_part and names:
                labels[names[-1]] = re.findall(r"`([^`]+)`", values_part)
        metrics[name.group(1)] = {"type": cells[1].split()[0], "labels": labels,
                                  "rank0_only": cells[3].lower().startswith("rank 0 only")}
    if not metrics:
        raise ValueError(f"{path}: no metrics in the table under '## Metrics'")
    return metrics


def optional_metric(name, fake_nvml):
    """Metrics whose absence is allowed: NVML's without a (fake) NVML, MFU when the peak is unknown."""
    return name == MFU or (name.startswith("trainflow_gpu_") and not fake_nvml)


# ------------------------------------------------------------------------------------------------
# PromQL: template variables, the metric and label names an expression uses

VAR_RE = re.compile(r"\$\{(\w+)(?::[^}]*)?\}|\$(\w+)|\[\[(\w+)(?::[^\]]*)?\]\]")
PROMQL_KEYWORDS = {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
                   "bool", "offset", "inf", "nan", "atan2", "start", "end"}


def substitute(expr, unknown=None):
    def repl(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in GRAFANA_VARS:
            return GRAFANA_VARS[name]
        if unknown is not None:
            unknown.add(name)
        return m.group(0)
    return VAR_RE.sub(repl, expr)


def promql_names(expr):
    """(metric names, grouping/matching label names, matcher label names) an expression mentions."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    matcher_labels = set()
    for body in re.findall(r"\{([^}]*)\}", s):
        matcher_labels.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    group_labels = set()
    for _, body in re.findall(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", s):
        group_labels.update(x.strip() for x in body.split(",") if x.strip())
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    metrics = set()
    for m in re.finditer(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)", s):
        word = m.group(1)
        rest = s[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_KEYWORDS:
            continue
        metrics.add(word)
    return metrics, group_labels, matcher_labels


def doc_metric_for(name, doc):
    """The documented metric a series name belongs to (histograms: _bucket, _sum, _count), or None."""
    if name in doc:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and doc.get(base, {}).get("type") == "histogram":
            return base
    return None


# ------------------------------------------------------------------------------------------------
# 1. the dashboard's JSON

def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels") or [])


def check_dashboard(path, doc, res):
    """Returns the targets [(panel, target)] to query, or None when the JSON cannot be used."""
    try:
        dash = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        res.fail(f"dashboard {path}: not valid JSON: {e}")
        return None
    errors = []
    for key in ("title", "uid", "panels", "templating", "schemaVersion", "__inputs"):
        if key not in dash:
            errors.append(f"no top-level '{key}'")
    if not isinstance(dash.get("schemaVersion"), int) or not 30 <= dash.get("schemaVersion", 0) <= 41:
        errors.append(f"schemaVersion {dash.get('schemaVersion')!r}: expected an integer 30..41 (Grafana 8-11)")
    if not isinstance(dash.get("uid"), str) or not 0 < len(dash.get("uid", "")) <= 40:
        errors.append("uid: a string of 1..40 characters")
    if dash.get("id") is not None:
        errors.append("id: should be null in an importable dashboard")
    inputs = dash.get("__inputs") or []
    if not any(i.get("name") == "DS_PROMETHEUS" and i.get("type") == "datasource" and i.get("pluginId") == "prometheus"
               for i in inputs if isinstance(i, dict)):
        errors.append("__inputs: no DS_PROMETHEUS datasource input (pluginId prometheus)")
    variables = (dash.get("templating") or {}).get("list") or []
    names = [v.get("name") for v in variables]
    if len(names) != len(set(names)):
        errors.append(f"templating: duplicate variable names {names}")
    dsvar = [v for v in variables if v.get("name") == "datasource"]
    if not dsvar or dsvar[0].get("type") != "datasource" or dsvar[0].get("query") != "prometheus":
        errors.append("templating: no variable 'datasource' of type datasource with query prometheus")
    known_vars = set(GRAFANA_VARS) | {"datasource"}
    for v in variables:
        if v.get("name") not in known_vars:
            errors.append(f"templating: variable ${v.get('name')} has no value in this test (GRAFANA_VARS)")
        if v.get("type") == "query" and v.get("datasource") != DS_REF:
            errors.append(f"templating: variable ${v.get('name')}: datasource must be {DS_REF}")
    required_types = {r.get("id") for r in dash.get("__requires") or [] if r.get("type") == "panel"}

    exprs = []  # (where, expr): every PromQL expression in the dashboard
    targets = []
    panels = list(all_panels(dash.get("panels") or []))
    ids = [p.get("id") for p in panels]
    dup = sorted({i for i in ids if ids.count(i) > 1}, key=str)
    if dup:
        errors.append(f"panel ids not unique: {dup}")
    boxes = []
    for p in panels:
        where = f"panel {p.get('id')} '{p.get('title')}'"
        if not isinstance(p.get("id"), int):
            errors.append(f"{where}: id must be an integer")
        ptype = p.get("type")
        if ptype not in PANEL_TYPES:
            errors.append(f"{where}: unknown panel type {ptype!r}")
        elif ptype != "row" and required_types and ptype not in required_types:
            errors.append(f"{where}: panel type {ptype} missing from __requires")
        if not p.get("title"):
            errors.append(f"{where}: no title")
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in ("h", "w", "x", "y")):
            errors.append(f"{where}: gridPos needs integer h, w, x, y")
        elif g["w"] <= 0 or g["h"] <= 0 or g["x"] < 0 or g["x"] + g["w"] > 24:
            errors.append(f"{where}: gridPos {g} outside the 24-column grid")
        else:
            boxes.append((where, g))
        if ptype == "row":  # rows group panels; they hold no queries
            if p.get("targets"):
                errors.append(f"{where}: a row with targets")
            continue
        if p.get("datasource") != DS_REF:
            errors.append(f"{where}: datasource {p.get('datasource')!r}, expected {DS_REF}")
        tg = p.get("targets") or []
        if not tg:
            errors.append(f"{where}: no targets")
        refs = [t.get("refId") for t in tg]
        if len(refs) != len(set(refs)):
            errors.append(f"{where}: duplicate refIds {refs}")
        for t in tg:
            twhere = f"{where} target {t.get('refId')}"
            if not t.get("refId"):
                errors.append(f"{twhere}: no refId")
            if not isinstance(t.get("expr"), str) or not t["expr"].strip():
                errors.append(f"{twhere}: empty expr")
                continue
            if "datasource" in t and t["datasource"] != DS_REF:
                errors.append(f"{twhere}: datasource {t['datasource']!r}, expected {DS_REF}")
            exprs.append((twhere, t["expr"]))
            targets.append((p, t))
    for i, (wa, a) in enumerate(boxes):  # overlapping panels are moved by Grafana: a layout bug
        for wb, b in boxes[i + 1:]:
            if a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]:
                errors.append(f"{wa} overlaps {wb}")
    for a in (dash.get("annotations") or {}).get("list") or []:
        if a.get("expr"):
            exprs.append((f"annotation '{a.get('name')}'", a["expr"]))
    for v in variables:
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            inner = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q)
            exprs.append((f"variable ${v.get('name')}", inner.group(1) if inner else q))

    all_labels = set(EXTRA_LABELS)
    for info in doc.values():
        all_labels.update(info["labels"])
    for where, expr in exprs:
        unknown = set()
        sub = substitute(expr, unknown)
        if unknown:
            errors.append(f"{where}: unknown template variables {sorted(unknown)} in {expr}")
        metrics, group_labels, matcher_labels = promql_names(sub)
        if not metrics:
            errors.append(f"{where}: names no metric: {expr}")
        for name in sorted(metrics):
            if doc_metric_for(name, doc) is None:
                errors.append(f"{where}: metric {name} is not in docs/monitoring.md: {expr}")
        for label in sorted((group_labels | matcher_labels) - all_labels):
            errors.append(f"{where}: label {label} is not a documented label: {expr}")

    for e in errors:
        res.fail(f"dashboard: {e}")
    if not errors:
        res.ok(f"dashboard: {len(panels)} panels, {len(targets)} targets, schema and metric names")
    return targets


# ------------------------------------------------------------------------------------------------
# processes: each in its own session, stopped by process group and then by session id

def start(cmd, log_prefix, env=None, cwd=None):
    out = open(log_prefix + ".out", "wb")
    err = open(log_prefix + ".err", "wb")
    try:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=cwd,
                                start_new_session=True)
    finally:
        out.close()
        err.close()


def session_pids(sid):
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 4 and int(fields[3]) == sid:  # state ppid pgrp session
            pids.append(int(entry))
    return pids


def stop(proc, grace=10.0):
    """SIGTERM to the process group, then SIGKILL to it and to anything left in its session."""
    if proc is None:
        return
    sid = proc.pid
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        targets = set(session_pids(sid))
        if proc.poll() is None:
            targets.add(proc.pid)
        if not targets:
            break
        try:
            os.killpg(sid, sig)
        except OSError:
            pass
        for pid in targets:  # processes that moved to another group of the session
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not session_pids(sid):
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def tail(path, n=25):
    try:
        lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    except OSError:
        return ""
    return "\n".join("    | " + l for l in lines[-n:])


def free_ports(count, tries=200):
    """A base port P with P .. P + count - 1 free on 127.0.0.1."""
    for _ in range(tries):
        socks = []
        try:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            base = s.getsockname()[1]
            if base + count > 65535:
                continue
            for k in range(1, count):
                t = socket.socket()
                socks.append(t)
                t.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports on 127.0.0.1")


def http_get(url, timeout=5.0):
    with HTTP.open(url, timeout=timeout) as r:
        return r.status, r.read().decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------------
# 2-3. the ranks' expositions

SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
LABEL_RE = re.compile(r'([a-zA-Z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_exposition(text):
    """({family: type}, [(series name, {labels}, value string)])."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3].strip()
            continue
        if not line.strip():
            continue
        m = SAMPLE_RE.match(line)
        if m:
            samples.append((m.group(1), dict(LABEL_RE.findall(m.group(2) or "")), m.group(3)))
    return types, samples


def exposition_problems(text, rank, world, doc, fake_nvml):
    """(what keeps this rank's exposition from matching the doc, remarks that fail nothing)."""
    types, samples = parse_exposition(text)
    problems, notes = [], []
    present = {}
    for name, labels, value in samples:
        if not name.startswith("trainflow_"):
            continue
        base = doc_metric_for(name, doc)
        if base is None:
            problems.append(f"{name}: not in docs/monitoring.md")
            continue
        present.setdefault(base, []).append(labels)
        allowed = set(doc[base]["labels"]) | ({"le"} if name.endswith("_bucket") else set())
        extra = set(labels) - allowed
        if extra:
            problems.append(f"{name}: undocumented labels {sorted(extra)}")
        for label, values in doc[base]["labels"].items():
            if values is not None and label in labels and labels[label] not in values:
                problems.append(f"{name}: {label}=\"{labels[label]}\" not among the documented {values}")
    for name, info in sorted(doc.items()):
        if name in present:
            if types.get(name) != info["type"]:
                problems.append(f"{name}: # TYPE {types.get(name)}, the doc says {info['type']}")
            for label, values in info["labels"].items():
                if values is None:
                    continue
                seen = {l.get(label) for l in present[name]}
                missing = [v for v in values if v not in seen]
                if missing:
                    problems.append(f"{name}: no series with {label}={missing} (export every documented value, "
                                    f"counters at 0, so increase() and rate() have data)")
            if info["rank0_only"] and rank != 0:
                notes.append(f"rank {rank} exports {name}, which the doc calls rank 0 only")
        elif optional_metric(name, fake_nvml) or (info["rank0_only"] and (rank != 0 or world == 1)):
            continue
        else:
            problems.append(f"{name}: missing")
    run_info = present.get("trainflow_run_info", [])
    if run_info and (run_info[0].get("rank") != str(rank) or run_info[0].get("world") != str(world)):
        problems.append(f"trainflow_run_info: rank={run_info[0].get('rank')!r} world={run_info[0].get('world')!r}, "
                        f"expected {rank} and {world} (the log line said rank {rank})")
    return problems, notes


def check_expositions(ranks, world, doc, fake_nvml, promtool, deadline, res):
    """Polls each rank's /metrics until it matches the doc (or the deadline), then promtool-checks it.
    Returns {rank: exposition text}."""
    texts = {}
    for rank, hostport in sorted(ranks.items()):
        url = f"http://{hostport}/metrics"
        problems, notes, text = ["never answered"], [], ""
        while True:
            try:
                status, text = http_get(url)
                if status == 200:
                    problems, notes = exposition_problems(text, rank, world, doc, fake_nvml)
                else:
                    problems = [f"HTTP {status}"]
            except (OSError, urllib.error.URLError) as e:
                problems = [f"GET {url}: {e}"]
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        texts[rank] = text
        for note in notes:
            print(f"note {note}", flush=True)
        if problems:
            res.fail(f"rank {rank} {url}: exposition does not match docs/monitoring.md:\n" +
                     "\n".join("    " + p for p in problems))
        else:
            res.ok(f"rank {rank} {url}: every documented metric, type, label")
        if not text:
            continue
        p = subprocess.run([promtool, "check", "metrics"], input=text.encode(), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        lint = p.stdout.decode(errors="replace").strip()
        if p.returncode != 0 or lint:
            res.fail(f"rank {rank}: promtool check metrics (exit {p.returncode}):\n" +
                     "\n".join("    " + l for l in lint.splitlines()))
        else:
            res.ok(f"rank {rank}: promtool check metrics")
    return texts


# ------------------------------------------------------------------------------------------------
# 4. Prometheus

def prom_api(base, path, params):
    url = f"{base}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        status, body = http_get(url)
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode("utf-8", errors="replace")
    try:
        return json.loads(body)
    except ValueError:
        return {"status": "error", "error": f"HTTP {status}: {body[:200]}"}


def result_state(reply):
    """'ok', 'empty', 'nan' or 'error: ...' for an /api/v1/query reply."""
    if reply.get("status") != "success":
        return f"error: {reply.get('errorType', '')} {reply.get('error', '')}".strip()
    data = reply.get("data") or {}
    result = data.get("result")
    if data.get("resultType") in ("scalar", "string"):
        values = [result[1]] if result else []
    else:
        values = [s["value"][1] for s in result or [] if "value" in s]
        values += [v[1] for s in result or [] for v in s.get("values", [])]
    if not values:
        return "empty"
    if all(v.lower() == "nan" for v in values):
        return "nan"
    return "ok"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trainflow", help="the trainflow binary")
    ap.add_argument("--source", required=True, help="the repository root")
    ap.add_argument("--fake-nvml", help="a fake libnvidia-ml .so: the ranks export GPU metrics (TRAINFLOW_NVML_LIBRARY)")
    ap.add_argument("--mpirun", default=DEFAULT_MPIRUN, help="mpirun command with its arguments")
    ap.add_argument("--ranks", type=int, help="ranks to expect (default: mpirun's -np, else 2)")
    ap.add_argument("--server-cmd", help="development: run CMD --metrics_addr 127.0.0.1:PORT instead of training")
    ap.add_argument("--max-steps", type=int, default=100000,
                    help="the run's max_steps: more than the test needs; it stops the run when done")
    ap.add_argument("--prometheus", default=shutil.which("prometheus") or "/usr/bin/prometheus")
    ap.add_argument("--promtool", default=shutil.which("promtool") or "/usr/bin/promtool")
    ap.add_argument("--corpus", default="/usr/share/games/fortunes")
    ap.add_argument("--query-timeout", type=float, default=40.0, help="seconds the panel queries may take to have data")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data, TSDB)")
    args = ap.parse_args()
    t0 = time.monotonic()
    res = Results()

    def terminated(*_):  # a CTest timeout: fail, and run the clean-up below
        res.fail("terminated by SIGTERM")
        sys.exit(1)
    signal.signal(signal.SIGTERM, terminated)

    source = os.path.abspath(args.source)
    doc = parse_doc_metrics(os.path.join(source, "docs", "monitoring.md"))
    targets = check_dashboard(os.path.join(source, "monitor", "grafana", "trainflow.json"), doc, res)

    mpirun = shlex.split(args.mpirun)
    world = args.ranks
    if world is None:
        np_arg = [mpirun[i + 1] for i in range(len(mpirun) - 1) if mpirun[i] in ("-np", "-n", "--np", "-c")]
        world = int(np_arg[-1]) if np_arg else 2
    missing = [p for p in (args.prometheus, args.promtool) if not (os.path.isfile(p) and os.access(p, os.X_OK))]
    if not args.server_cmd:
        if not args.trainflow:
            ap.error("--trainflow is required (or --server-cmd)")
        if not shutil.which(mpirun[0]):
            missing.append(mpirun[0])
        if not os.path.isdir(args.corpus):
            missing.append(args.corpus)
    if missing:
        res.skip(f"run against Prometheus: {', '.join(missing)} not found")
        res.summary(time.monotonic() - t0)
        return 1 if res.failures else SKIP

    tmp = tempfile.mkdtemp(prefix="trainflow-prometheus-")
    job = prom = None
    timeout_cmd = [shutil.which("timeout"), "-k", "10", "300"] if shutil.which("timeout") else []  # orphan guard
    try:
        env = dict(os.environ)
        extra_mpi = []
        if args.fake_nvml:
            env["TRAINFLOW_NVML_LIBRARY"] = os.path.abspath(args.fake_nvml)
            # One fake GPU per rank, with ECC counts (so the ECC panel has data too).
            env["FAKE_NVML_DEVICES"] = str(world)
            env["FAKE_NVML_ECC"] = "1"
            extra_mpi = ["-x", f"TRAINFLOW_NVML_LIBRARY={env['TRAINFLOW_NVML_LIBRARY']}",
                         "-x", f"FAKE_NVML_DEVICES={world}", "-x", "FAKE_NVML_ECC=1"]
        base_port = free_ports(world)
        addr = f"127.0.0.1:{base_port}"
        if args.server_cmd:
            cmd = shlex.split(args.server_cmd) + ["--metrics_addr", addr]
        else:
            data = os.path.join(tmp, "data")
            p = subprocess.run([args.trainflow, "prepare", "--input", args.corpus, "--delimiter", "%",
                                "--val-fraction", "0.05", "--out-dir", data],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
            if p.returncode != 0:
                res.fail(f"trainflow prepare (exit {p.returncode}):\n{p.stdout.decode(errors='replace')[-2000:]}")
                return 1
            cmd = mpirun + extra_mpi + [
                os.path.abspath(args.trainflow), "train",
                "--model", os.path.join(source, "configs/model/byte-tiny.json"),
                "--train", os.path.join(source, "configs/train/fortunes.json"),
                "--train_data", os.path.join(data, "train.bin"), "--val_data", os.path.join(data, "val.bin"),
                "--out_dir", os.path.join(tmp, "out"), "--seq_len", "64", "--device", "cpu",
                "--checkpoint_dir", os.path.join(tmp, "ckpt"), "--checkpoint_interval", "10",
                "--compression", "int8", "--eval_interval", "10", "--eval_batches", "4",
                "--max_steps", str(args.max_steps), "--metrics_addr", addr]
        print(f"run: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        job_log = os.path.join(tmp, "job")
        job = start(timeout_cmd + cmd, job_log, env=env, cwd=tmp)

        # The ranks' addresses from their log lines (rank 0: stdout, the others: stderr).
        ranks = {}
        deadline = time.monotonic() + 60
        while len(ranks) < world:
            for suffix in (".out", ".err"):
                try:
                    text = open(job_log + suffix, encoding="utf-8", errors="replace").read()
                except OSError:
                    continue
                for r, hostport in RANK_LINE.findall(text):
                    ranks[int(r)] = hostport
            if len(ranks) >= world:
                break
            if job.poll() is not None or time.monotonic() > deadline:
                why = f"exited with {job.returncode}" if job.poll() is not None else "60 s passed"
                res.fail(f"run: {why} before every rank logged 'monitor: rank R at http://HOST:PORT/' "
                         f"(found {ranks}, expected {world} ranks)\n  stdout:\n{tail(job_log + '.out')}\n"
                         f"  stderr:\n{tail(job_log + '.err')}")
                return 1
            time.sleep(0.2)
        res.ok(f"run: {world} ranks serving at {', '.join(f'{r}={h}' for r, h in sorted(ranks.items()))} "
               f"({time.monotonic() - t0:.1f} s)")
        for r, hostport in ranks.items():
            if not hostport.startswith("127.0.0.1:"):
                res.fail(f"rank {r} serves at {hostport}, not on 127.0.0.1 as --metrics_addr asked")
        if sorted(ranks) != list(range(world)):
            res.fail(f"rank numbers {sorted(ranks)}, expected 0..{world - 1}")

        # Prometheus, started now so that it starts while the expositions are checked.
        prom_port = free_ports(1)
        prom_base = f"http://127.0.0.1:{prom_port}"
        config = os.path.join(tmp, "prometheus.yml")
        with open(config, "w") as f:
            f.write("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                    f"scrape_configs:\n  - job_name: {PROM_JOB}\n    static_configs:\n"
                    f"      - targets: [{', '.join(repr(h) for _, h in sorted(ranks.items()))}]\n")
        prom_log = os.path.join(tmp, "prometheus")
        prom = start(timeout_cmd + [args.prometheus, f"--config.file={config}",
                                    f"--storage.tsdb.path={os.path.join(tmp, 'tsdb')}",
                                    f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], prom_log, cwd=tmp)

        check_expositions(ranks, world, doc, args.fake_nvml, args.promtool, time.monotonic() + 20, res)
        if job.poll() is not None:
            res.fail(f"run: exited with {job.returncode} while being checked\n{tail(job_log + '.err')}")
            return 1

        deadline = time.monotonic() + 30
        while True:
            try:
                if http_get(f"{prom_base}/-/ready", timeout=2)[0] == 200:
                    break
            except (OSError, urllib.error.URLError):
                pass
            if prom.poll() is not None or time.monotonic() > deadline:
                res.fail(f"prometheus: not ready (exit {prom.poll()})\n{tail(prom_log + '.err')}")
                return 1
            time.sleep(0.2)
        deadline = time.monotonic() + 30
        while True:
            reply = prom_api(prom_base, "/api/v1/targets", {"state": "active"})
            active = (reply.get("data") or {}).get("activeTargets") or []
            up = [t for t in active if t.get("health") == "up"]
            if len(active) == world and len(up) == world:
                res.ok(f"prometheus: {world} targets up ({time.monotonic() - t0:.1f} s)")
                break
            if time.monotonic() > deadline:
                res.fail("prometheus: targets not up: " + "; ".join(
                    f"{t.get('scrapeUrl')} {t.get('health')} {t.get('lastError')}" for t in active))
                return 1
            time.sleep(0.5)

        # Which optional metrics exist at all (GPU without a fake NVML, MFU without a known peak).
        exported = set()
        for r, hostport in ranks.items():
            try:
                exported |= {doc_metric_for(n, doc) for n, _, _ in parse_exposition(http_get(f"http://{hostport}/metrics")[1])[1]}
            except (OSError, urllib.error.URLError):
                pass
        dash = json.load(open(os.path.join(source, "monitor", "grafana", "trainflow.json"), encoding="utf-8"))
        queries = []  # [(where, expr, substituted)]: must have data
        syntax_only = []  # [(where, substituted)]: must parse
        for panel, t in targets or []:
            where = f"panel {panel['id']} '{panel['title']}' target {t['refId']}"
            sub = substitute(t["expr"])
            metrics = {doc_metric_for(m, doc) for m in promql_names(sub)[0]}
            absent = sorted(m for m in metrics if m and optional_metric(m, args.fake_nvml) and m not in exported)
            if absent:
                why = "no NVML (pass --fake-nvml)" if any(m.startswith("trainflow_gpu_") for m in absent) else \
                      "no rank exports it (the device's peak FLOP/s is unknown)"
                res.skip(f"{where}: {', '.join(absent)}: {why}")
                syntax_only.append((where, sub))
                continue
            queries.append((where, t["expr"], sub))
        for a in dash.get("annotations", {}).get("list", []):
            if a.get("expr"):  # annotations: valid PromQL; no data is their normal state
                syntax_only.append((f"annotation '{a.get('name')}'", substitute(a["expr"])))
        for where, sub in syntax_only:
            state = result_state(prom_api(prom_base, "/api/v1/query", {"query": sub}))
            if state.startswith("error"):
                res.fail(f"{where}: {state}\n    query: {sub}")
        var_checks = []  # label_values(selector, label) of the query variables
        for v in dash.get("templating", {}).get("list", []):
            q = v.get("query")
            q = q.get("query") if isinstance(q, dict) else q
            m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", q or "") if v.get("type") == "query" else None
            if m:
                var_checks.append((f"variable ${v['name']}", substitute(m.group(1)), m.group(2)))

        # Every panel query has data: poll until they all do (rate() needs two scrapes) or the deadline.
        pending = {i: "not queried" for i in range(len(queries))}
        bad = {}
        pending_vars = {i: "not queried" for i in range(len(var_checks))}
        deadline = time.monotonic() + args.query_timeout
        while pending or pending_vars:
            if job.poll() is not None:
                res.fail(f"run: exited with {job.returncode} before every query had data\n{tail(job_log + '.err')}")
                break
            for i in list(pending):
                state = result_state(prom_api(prom_base, "/api/v1/query", {"query": queries[i][2]}))
                if state == "ok":
                    del pending[i]
                elif state.startswith("error"):  # a bad query stays bad
                    del pending[i]
                    bad[i] = state
                else:
                    pending[i] = state
            for i in list(pending_vars):
                where, selector, label = var_checks[i]
                reply = prom_api(prom_base, "/api/v1/series", {"match[]": selector, "start": time.time() - 300})
                values = {s.get(label) for s in reply.get("data") or [] if s.get(label)}
                if reply.get("status") == "success" and values:
                    del pending_vars[i]
                else:
                    pending_vars[i] = reply.get("error") or f"no series of {selector} with label {label}"
            if not (pending or pending_vars) or time.monotonic() > deadline:
                break
            time.sleep(1.0)
        for i, state in sorted(list(pending.items()) + list(bad.items())):
            where, expr, sub = queries[i]
            what = state if i in bad else f"{state} result after {args.query_timeout:.0f} s"
            res.fail(f"{where}: {what}\n    expr:  {expr}\n    query: {sub}")
        for i, state in sorted(pending_vars.items()):
            res.fail(f"{var_checks[i][0]}: {state}")
        if not pending and not bad:
            res.ok(f"prometheus: all {len(queries)} panel queries have data ({time.monotonic() - t0:.1f} s)")
        if not pending_vars and var_checks:
            res.ok(f"prometheus: template variables {', '.join(w for w, _, _ in var_checks)} resolve")
        return 1 if res.failures else 0
    finally:
        stop(job)
        stop(prom)
        if res.failures and not args.keep:
            for log in ("job.out", "job.err", "prometheus.err"):
                text = tail(os.path.join(tmp, log), 15)
                if text:
                    print(f"last lines of {log}:\n{text}")
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        res.summary(time.monotonic() - t0)


if __name__ == "__main__":
    sys.exit(main())
