#!/usr/bin/env python3
"""The live dashboard in a real browser, against a real training run.

  python3 tests/integration/monitor/dashboard_browser_test.py --trainflow build/trainflow --source . --artifacts build/test-artifacts

Prepares the fortunes data with the binary, starts a long training run with --metrics_addr
127.0.0.1:0, reads rank 0's address from the run's log ("monitor: rank 0 at http://HOST:PORT/"),
opens the dashboard in headless Chromium and drives it over the Chrome DevTools Protocol (a small
stdlib WebSocket client below): Chart.js must come from the server, the loss chart must have points,
the charts must update (window.tfDashboard and its DOM mirrors, two observations seconds apart), the
events list must fill, and the page must throw no exception or reach any address but the server.
Writes <artifacts>/dashboard.png (1400x1000 viewport) and dashboard-full.png (the whole page), plus
the page's last state and the run's log. The run and Chromium are killed (their process groups) and
the temporary directory removed whatever happens.

Needs Debian's chromium and fortunes (or fortunes-min); python3's standard library only.
--server-cmd "CMD" replaces the training run by any command that prints the same "monitor:" line
(a mock server, while developing the page).
"""

import argparse
import base64
import hashlib
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

URL_RE = re.compile(r"monitor: rank 0 at (http://[0-9.]+:[0-9]+)/")
FORTUNES = "/usr/share/games/fortunes"
VIEWPORT = (1400, 1000)
T0 = time.monotonic()


class Failure(Exception):
    pass


def log(msg):
    print("[%5.1fs] %s" % (time.monotonic() - T0, msg), flush=True)


class Deadline:
    def __init__(self, seconds):
        self.end = time.monotonic() + seconds
        self.seconds = seconds

    def left(self):
        return self.end - time.monotonic()

    def cap(self, timeout):
        left = self.left()
        if left <= 0:
            raise Failure("the test's overall deadline (%.0f s) passed" % self.seconds)
        return min(timeout, left)


# ---------------------------------------------------------------- loopback HTTP (no proxies)
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def check_loopback(url):
    host = urllib.parse.urlsplit(url).hostname
    if host != "127.0.0.1":
        raise Failure("refusing to talk to %r: this test only uses 127.0.0.1" % url)


def http_get(url, timeout):
    check_loopback(url)
    with _OPENER.open(url, timeout=timeout) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read()


# ---------------------------------------------------------------- a minimal WebSocket client (RFC 6455)
class WebSocket:
    GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

    def __init__(self, url, timeout):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "ws" or u.hostname != "127.0.0.1":
            raise Failure("unexpected DevTools WebSocket address %r" % url)
        self.sock = socket.create_connection((u.hostname, u.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16))
        path = u.path + ("?" + u.query if u.query else "")
        self.sock.sendall(("GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                           "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
                           % (path, u.hostname, u.port, key.decode())).encode())
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise Failure("DevTools closed the WebSocket during the handshake")
            buf += chunk
            if len(buf) > 65536:
                raise Failure("DevTools WebSocket handshake: answer too long")
        head, self.buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        if " 101 " not in lines[0] + " ":
            raise Failure("DevTools WebSocket handshake failed: %r" % lines[0])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        accept = base64.b64encode(hashlib.sha1(key + self.GUID).digest()).decode()
        if headers.get("sec-websocket-accept") != accept:
            raise Failure("DevTools WebSocket handshake: bad Sec-WebSocket-Accept")

    @staticmethod
    def _mask(data, key):
        n = len(data)
        if not n:
            return data
        k = (key * (n // 4 + 1))[:n]
        return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")

    def _send_frame(self, opcode, payload):
        n = len(payload)
        if n < 126:
            head = bytes([0x80 | opcode, 0x80 | n])
        elif n < 1 << 16:
            head = bytes([0x80 | opcode, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 0x80 | 127]) + n.to_bytes(8, "big")
        key = os.urandom(4)                       # a client masks every frame
        self.sock.sendall(head + key + self._mask(payload, key))

    def send_text(self, text):
        self._send_frame(0x1, text.encode())

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self.buf)))
            if not chunk:
                raise Failure("DevTools closed the WebSocket")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_message(self, timeout):
        self.sock.settimeout(max(0.05, timeout))
        parts = []
        while True:
            b0, b1 = self._read(2)
            opcode, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = int.from_bytes(self._read(2), "big")
            elif n == 127:
                n = int.from_bytes(self._read(8), "big")
            key = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if key:
                payload = self._mask(payload, key)
            if opcode == 0x8:
                raise Failure("DevTools closed the WebSocket (close frame)")
            if opcode == 0x9:
                self._send_frame(0xA, payload)    # ping: pong
                continue
            if opcode == 0xA:
                continue
            parts.append(payload)                 # text, binary or continuation
            if b0 & 0x80:
                return b"".join(parts).decode("utf-8", "replace")

    def close(self):
        try:
            self._send_frame(0x8, b"\x03\xe8")
        except OSError:
            pass
        self.sock.close()


class DevTools:
    """Chrome DevTools Protocol over one page target: calls, and the events the test cares about."""

    KEPT = ("Runtime.exceptionThrown", "Runtime.consoleAPICalled", "Log.entryAdded",
            "Network.requestWillBeSent", "Network.responseReceived", "Network.loadingFailed")

    def __init__(self, ws, deadline):
        self.ws, self.deadline, self.next_id = ws, deadline, 0
        self.events = []

    def call(self, method, params=None, timeout=15):
        self.next_id += 1
        mid = self.next_id
        self.ws.send_text(json.dumps({"id": mid, "method": method, "params": params or {}}))
        end = time.monotonic() + self.deadline.cap(timeout)
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise Failure("DevTools %s: no answer within %.0f s" % (method, timeout))
            try:
                msg = json.loads(self.ws.recv_message(left))
            except socket.timeout:
                continue
            if msg.get("id") == mid:
                if "error" in msg:
                    raise Failure("DevTools %s failed: %s" % (method, msg["error"]))
                return msg.get("result", {})
            if msg.get("method") in self.KEPT and len(self.events) < 20000:
                self.events.append(msg)

    def evaluate(self, expression, timeout=10):
        r = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, timeout)
        if "exceptionDetails" in r:
            raise Failure("evaluating in the page threw: %s" % json.dumps(r["exceptionDetails"])[:800])
        return r.get("result", {}).get("value")


# What the test reads from the page: window.tfDashboard, its DOM mirrors, Chart.js and the events.
PROBE = r"""JSON.stringify((() => {
  if (!document.body) return { readyState: document.readyState };
  const d = window.tfDashboard || null;
  const canvases = {};
  document.querySelectorAll('canvas').forEach((c) => { canvases[c.id || '?'] = c.dataset.points === undefined ? null : +c.dataset.points; });
  const res = performance.getEntriesByType('resource').map((e) => e.name).filter((n) => /\/chart\.js(\?|$)/.test(n));
  const list = document.getElementById('events');
  return {
    dash: d, origin: location.origin, readyState: document.readyState,
    chartVersion: typeof window.Chart === 'function' ? String(window.Chart.version) : null,
    chartScriptTag: !!document.querySelector('script[src="/chart.js"]'), chartResources: res,
    body: { updates: document.body.dataset.updates, lastStep: document.body.dataset.lastStep },
    canvases, eventsList: !!list, eventItems: list ? list.querySelectorAll('li[data-kind]').length : 0,
    eventKinds: list ? Array.from(new Set(Array.from(list.querySelectorAll('li[data-kind]')).map((li) => li.dataset.kind))) : [],
    status: (document.getElementById('status') || {}).textContent || null,
    conn: (document.getElementById('conn-text') || {}).textContent || null,
  };
})())"""


# ---------------------------------------------------------------- processes
def start(cmd, logfile, cwd=None):
    out = open(logfile, "wb")
    try:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                cwd=cwd, start_new_session=True)
    finally:
        out.close()


def kill_group(proc, name, grace):
    """SIGTERM to the process group, SIGKILL after `grace` seconds; then any member left gets SIGKILL."""
    if proc is None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        log("%s did not exit within %.0f s of SIGTERM: SIGKILL" % (name, grace))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            log("%s (pid %d) still not gone" % (name, proc.pid))
    try:
        os.killpg(proc.pid, signal.SIGKILL)       # children that outlived the leader
    except (ProcessLookupError, PermissionError):
        pass


def tail(path, lines=40):
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        # Chromium's complaints about a missing D-Bus are noise here.
        kept = [line for line in text.splitlines() if "dbus" not in line and "zygote_communication" not in line]
        return "\n".join(kept[-lines:])
    except OSError as e:
        return "(no log: %s)" % e


def wait_for_url(proc, logfile, deadline, timeout):
    timeout = deadline.cap(timeout)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(logfile, "rb") as f:
                m = URL_RE.search(f.read().decode("utf-8", "replace"))
        except OSError:
            m = None
        if m:
            return m.group(1)
        if proc.poll() is not None:
            raise Failure("the training run exited (code %s) before logging 'monitor: rank 0 at http://HOST:PORT/';"
                          " its output:\n%s" % (proc.returncode, tail(logfile)))
        time.sleep(0.1)
    raise Failure("no line matching %r in the run's output within %.0f s; its output:\n%s"
                  % (URL_RE.pattern, timeout, tail(logfile)))


def check_api(url, run_info, deadline):
    """What the API says of this CPU run: the device and dtype it resolved, the evaluation before
    training as a record of step 0, and a clear 400 for an `after` that is not an integer."""
    train = run_info.get("train") or {}
    if (train.get("device"), train.get("dtype")) != ("cpu", "fp32") or train.get("device_configured") != "auto":
        raise Failure("/api/run's train config should show what the CPU run resolved (device cpu, dtype fp32, "
                      "device_configured auto); it shows device %r, dtype %r, device_configured %r"
                      % (train.get("device"), train.get("dtype"), train.get("device_configured")))
    end = time.monotonic() + deadline.cap(20)
    while True:
        first = (json.loads(http_get(url + "/api/steps?after=-1", deadline.cap(10))[2]).get("steps") or [None])[0]
        if first is not None or time.monotonic() > end:
            break
        time.sleep(0.2)
    if not first or first.get("step") != 0 or not isinstance(first.get("val_loss"), (int, float)) or "loss" in first:
        raise Failure("/api/steps should start with the evaluation before training ({step: 0, val_loss}); it starts with %r"
                      % (first,))
    metrics = http_get(url + "/metrics", deadline.cap(10))[2].decode()
    if not re.search(r"^trainflow_eval_loss [0-9.]+$", metrics, re.M):
        raise Failure("/metrics has no trainflow_eval_loss sample after the step-0 evaluation")
    for path in ("/api/steps?after=junk", "/api/events?after=1.5"):
        try:
            status, _, body = http_get(url + path, deadline.cap(10))
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        if status != 400 or b"after must be an integer" not in body:
            raise Failure("GET %s answered %d %r; expected 400 saying after must be an integer" % (path, status, body[:200]))
    log("API: step-0 evaluation %.4f, device/dtype resolved, bad 'after' refused" % first["val_loss"])


# The loss card and the smoothing, read in the page: the card shows the newest raw loss; the smoothed
# series is the page's smoother over the raw one, never moving further than the newest raw value from
# the previous smoothed one (the old curve jumped at its 20th point), equal to a flat series and
# within its noise; the val curve starts at step 0; no KPI text is cut off.
LOSS_PROBE = r"""JSON.stringify((() => {
  const d = window.tfDashboard;
  const raw = d.series('loss'), sm = d.series('loss_ema'), val = d.series('val_loss');
  const flat = d.smooth(Array.from({length: 60}, () => 4));
  const noisy = d.smooth(Array.from({length: 200}, (_, i) => 4 + 0.1 * Math.sin(i * 1.7)));
  const ramp = d.smooth(Array.from({length: 60}, (_, i) => 5.5 - 0.025 * i));
  const cut = {};
  for (const id of ['k-loss', 'k-loss-sub', 'k-model', 'k-model-sub', 'k-tps-sub', 'k-device-sub']) {
    const e = document.getElementById(id);
    cut[id] = e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1;
  }
  const cfg = {};
  document.querySelectorAll('#cfg-train tr').forEach((tr) => { cfg[tr.cells[0].textContent] = tr.cells[1] ? tr.cells[1].textContent : null; });
  return { loss: d.loss, raw, sm, val: val.slice(0, 2), flat, noisy, ramp, cut, cfg: { device: cfg.device, dtype: cfg.dtype } };
})())"""


def check_loss(p):
    raw, sm = p["raw"], p["sm"]
    if len(raw) < 25 or len(sm) != len(raw):
        raise Failure("expected >= 25 raw loss points and as many smoothed; got %d and %d" % (len(raw), len(sm)))
    loss = p["loss"] or {}
    try:
        shown = float(loss.get("shown"))
    except (TypeError, ValueError):
        shown = float("nan")
    if loss.get("raw") is None or not abs(shown - loss["raw"]) <= 1e-3 * abs(loss["raw"]):
        raise Failure("the LOSS card shows %r; the newest raw loss is %r (smoothed %r)"
                      % (loss.get("shown"), loss.get("raw"), loss.get("smoothed")))
    for i in range(1, len(raw)):
        if abs(sm[i][1] - sm[i - 1][1]) > abs(raw[i][1] - sm[i - 1][1]) + 1e-9:
            raise Failure("the smoothed loss moves from %.4f to %.4f at step %d, further than the raw value %.4f"
                          % (sm[i - 1][1], sm[i][1], sm[i][0], raw[i][1]))
    if any(abs(v - 4) > 1e-9 for v in p["flat"]) or any(abs(v - 4) > 0.1 for v in p["noisy"]):
        raise Failure("smoothing a flat series at 4 (+- 0.1) gives values from %.4f to %.4f"
                      % (min(p["flat"] + p["noisy"]), max(p["flat"] + p["noisy"])))
    if any(b > a for a, b in zip(p["ramp"], p["ramp"][1:])) or abs(p["ramp"][0] - 5.5) > 1e-9:
        raise Failure("smoothing a falling series should start at its first value and never rise: %s" % p["ramp"][:25])
    if not p["val"] or p["val"][0][0] != 0:
        raise Failure("the eval curve should start at step 0 (the evaluation before training): %s" % p["val"])
    cut = [k for k, v in p["cut"].items() if v]
    if cut:
        raise Failure("cut-off text in the KPI cards: %s" % cut)
    if p["cfg"] != {"device": "cpu", "dtype": "fp32"}:
        raise Failure("the configuration table should show the resolved device and dtype (cpu, fp32): %s" % p["cfg"])


def find_chromium(explicit):
    for c in [explicit] if explicit else ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(c) if c else None
        if path:
            return path
    raise Failure("no Chromium found (Debian: apt-get install chromium), or pass --chromium PATH")


# ---------------------------------------------------------------- the test
def run(args, tmp, procs, deadline):
    os.makedirs(args.artifacts, exist_ok=True)
    for name in ("dashboard.png", "dashboard-full.png", "dashboard-failed.png", "dashboard_state.json", "server.log"):
        try:
            os.remove(os.path.join(args.artifacts, name))
        except FileNotFoundError:
            pass
    server_log = os.path.join(tmp, "server.log")
    procs["server_log"] = server_log

    # 1. The training run (or, while developing the page, a mock server).
    if args.server_cmd:
        cmd = shlex.split(args.server_cmd)
    else:
        if not args.trainflow or not args.source:
            raise Failure("--trainflow and --source are needed (or --server-cmd)")
        if not os.access(args.trainflow, os.X_OK):
            raise Failure("%s is not an executable" % args.trainflow)
        if not os.path.isdir(FORTUNES):
            raise Failure("%s is missing (Debian: apt-get install fortunes-min)" % FORTUNES)
        data = os.path.join(tmp, "data")
        prep = [args.trainflow, "prepare", "--input", FORTUNES, "--delimiter", "%", "--val-fraction", "0.05",
                "--out-dir", data]
        log("prepare: " + " ".join(prep))
        try:
            r = subprocess.run(prep, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                               timeout=deadline.cap(60))
        except subprocess.TimeoutExpired:
            raise Failure("trainflow prepare did not finish within 60 s")
        if r.returncode != 0:
            raise Failure("trainflow prepare failed (exit %d):\n%s" % (r.returncode, r.stdout.decode("utf-8", "replace")[-4000:]))
        src = args.source
        cmd = [args.trainflow, "train",
               "--model", os.path.join(src, "configs/model/byte-tiny.json"),
               "--train", os.path.join(src, "configs/train/fortunes.json"),
               "--train_data", os.path.join(data, "train.bin"), "--val_data", os.path.join(data, "val.bin"),
               "--out_dir", os.path.join(tmp, "out"),
               "--seq_len", "64",                  # byte-tiny's block_size (fortunes.json says 128)
               "--max_steps", "100000",            # far longer than the test: it is stopped at the end
               "--eval_interval", "20", "--sample_interval", "40",
               "--checkpoint_dir", os.path.join(tmp, "ckpt"), "--checkpoint_interval", "500",
               "--metrics_addr", "127.0.0.1:0", "--threads", "1"]
    log("server: " + " ".join(shlex.quote(c) for c in cmd))
    procs["server"] = start(cmd, server_log, cwd=None if args.server_cmd else tmp)
    url = wait_for_url(procs["server"], server_log, deadline, 30)
    check_loopback(url)
    log("dashboard at " + url + "/")

    # 2. The server answers (so that a failure below is the page's, not the server's).
    try:
        status, ctype, body = http_get(url + "/", deadline.cap(10))
        if status != 200 or b"/chart.js" not in body:
            raise Failure("GET / answered %d (%s) without a /chart.js script: %r" % (status, ctype, body[:200]))
        status, ctype, body = http_get(url + "/chart.js", deadline.cap(10))
        if status != 200 or b"Chart" not in body[:2000]:
            raise Failure("GET /chart.js answered %d (%s), %d bytes, not Chart.js" % (status, ctype, len(body)))
        run_info = json.loads(http_get(url + "/api/run", deadline.cap(10))[2])
        log("run %s: %s, status %s" % (run_info.get("run_id"), run_info.get("device"), run_info.get("status")))
    except (OSError, ValueError) as e:
        raise Failure("the server at %s does not answer properly: %s" % (url, e))
    if not args.server_cmd:
        check_api(url, run_info, deadline)

    # 3. Headless Chromium, driven over the DevTools protocol.
    chrome_dir = os.path.join(tmp, "chrome")
    chrome_log = os.path.join(tmp, "chrome.log")
    procs["chrome_log"] = chrome_log
    chrome = [find_chromium(args.chromium), "--headless=new", "--no-sandbox", "--disable-gpu",
              "--user-data-dir=" + chrome_dir, "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
              "--window-size=%d,%d" % VIEWPORT, "--hide-scrollbars", "--mute-audio", "--no-first-run",
              "--no-default-browser-check", "--no-proxy-server", "--disable-background-networking",
              "--disable-component-update", "--disable-sync", "--disable-extensions", "--disable-default-apps",
              "--disable-domain-reliability", "--disable-client-side-phishing-detection", "--no-pings",
              "--disable-breakpad", "--disable-dev-shm-usage", "--metrics-recording-only",
              "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,InterestFeedContentSuggestions",
              "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
              "about:blank"]
    log("chromium: starting")
    procs["chrome"] = start(chrome, chrome_log)
    port_file = os.path.join(chrome_dir, "DevToolsActivePort")
    end = time.monotonic() + deadline.cap(30)
    port = None
    while time.monotonic() < end:
        try:
            with open(port_file) as f:
                first = f.readline().strip()
            if first.isdigit():
                port = int(first)
                break
        except OSError:
            pass
        if procs["chrome"].poll() is not None:
            raise Failure("chromium exited (code %s) before opening DevTools:\n%s" % (procs["chrome"].returncode, tail(chrome_log)))
        time.sleep(0.1)
    if port is None:
        raise Failure("chromium wrote no %s within 30 s:\n%s" % (port_file, tail(chrome_log)))

    page = None
    end = time.monotonic() + deadline.cap(15)
    while page is None and time.monotonic() < end:
        try:
            targets = json.loads(http_get("http://127.0.0.1:%d/json/list" % port, 5)[2])
            page = next((t for t in targets if t.get("type") == "page" and t.get("webSocketDebuggerUrl")), None)
        except (OSError, ValueError):
            pass
        if page is None:
            time.sleep(0.2)
    if page is None:
        raise Failure("chromium's DevTools (port %d) lists no page target" % port)
    ws = WebSocket(page["webSocketDebuggerUrl"], deadline.cap(10))
    procs["ws"] = ws
    cdp = DevTools(ws, deadline)
    procs["cdp"] = cdp
    for method in ("Runtime.enable", "Page.enable", "Log.enable", "Network.enable"):
        cdp.call(method)
    cdp.call("Emulation.setDeviceMetricsOverride",
             {"width": VIEWPORT[0], "height": VIEWPORT[1], "deviceScaleFactor": 1, "mobile": False})
    nav = cdp.call("Page.navigate", {"url": url + "/"})
    if nav.get("errorText"):
        raise Failure("chromium could not open %s/: %s" % (url, nav["errorText"]))
    log("chromium: page %s/ opened" % url)

    def probe():
        return json.loads(cdp.evaluate(PROBE))

    def wait_until(what, cond, timeout):
        timeout = deadline.cap(timeout)
        stop = time.monotonic() + timeout
        last = None
        while time.monotonic() < stop:
            last = probe()
            if cond(last):
                return last
            time.sleep(0.3)
        raise Failure("%s: not within %.0f s; the page showed:\n%s" % (what, timeout, json.dumps(last, indent=1)[:3000]))

    def dash(p):
        return p.get("dash") or {}

    def loss_points(p):
        return (dash(p).get("points") or {}).get("loss") or 0

    # 4. Chart.js from the server, the first points, the events.
    first = wait_until("window.tfDashboard with loss points after a successful step poll",
                       lambda p: p.get("readyState") == "complete" and dash(p).get("updates", 0) >= 1 and loss_points(p) > 0,
                       30)
    if not first.get("chartVersion"):
        raise Failure("Chart.js is not loaded in the page (window.Chart missing); tfDashboard.chartjs=%s"
                      % dash(first).get("chartjs"))
    chart_url = first["origin"] + "/chart.js"
    if chart_url not in first.get("chartResources", []):
        raise Failure("the page did not load Chart.js from %s; chart.js resources: %s" % (chart_url, first.get("chartResources")))
    if not first.get("chartScriptTag"):
        raise Failure('the page has no <script src="/chart.js">')
    responses = [e["params"]["response"] for e in cdp.events if e["method"] == "Network.responseReceived"]
    chart_resp = [r for r in responses if r.get("url") == chart_url]
    if not chart_resp or chart_resp[0].get("status") != 200:
        raise Failure("no 200 answer for %s in the page's network log (saw %s)" % (chart_url, [(r.get("url"), r.get("status")) for r in chart_resp]))
    log("Chart.js %s loaded from %s" % (first["chartVersion"], chart_url))
    if not first.get("eventsList"):
        raise Failure("the page has no events list (#events)")
    first = wait_until("at least one event in the events list", lambda p: p.get("eventItems", 0) > 0, 20)
    log("first observation: updates %s, lastStep %s, loss points %s, events %s (%s)"
        % (dash(first).get("updates"), dash(first).get("lastStep"), loss_points(first), first["eventItems"],
           ", ".join(first.get("eventKinds", []))))

    # 5. The charts update: a second observation at least 2.5 s later shows more.
    t1 = time.monotonic()
    time.sleep(min(2.5, max(0, deadline.left() - 20)))

    def grew(p):
        return (time.monotonic() - t1 >= 2.0 and dash(p).get("updates", 0) > dash(first).get("updates", 0)
                and (dash(p).get("lastStep") or 0) > (dash(first).get("lastStep") or 0)
                and loss_points(p) > loss_points(first))
    second = wait_until("the charts updating (tfDashboard.updates, lastStep and points.loss growing past %s, %s, %s)"
                        % (dash(first).get("updates"), dash(first).get("lastStep"), loss_points(first)), grew, 20)
    log("second observation %.1f s later: updates %s, lastStep %s, loss points %s"
        % (time.monotonic() - t1, dash(second).get("updates"), dash(second).get("lastStep"), loss_points(second)))

    # 6. The DOM mirrors agree with window.tfDashboard.
    d = dash(second)
    body = second.get("body") or {}
    if str(body.get("lastStep")) != str(d.get("lastStep")) or str(body.get("updates")) != str(d.get("updates")):
        raise Failure("<body data-last-step/data-updates> (%s/%s) do not mirror tfDashboard (%s/%s)"
                      % (body.get("lastStep"), body.get("updates"), d.get("lastStep"), d.get("updates")))
    canvases = second.get("canvases") or {}
    if not canvases or any(v is None for v in canvases.values()):
        raise Failure("every chart canvas must carry data-points; saw %s" % canvases)
    if (canvases.get("chart-loss") or 0) <= 0:
        raise Failure("the loss canvas has data-points=%s; expected > 0 (canvases: %s)" % (canvases.get("chart-loss"), canvases))
    if not d.get("connected"):
        raise Failure("the page says it is not connected: %s" % second.get("conn"))
    if not args.server_cmd:
        loss = wait_until("25 loss points", lambda p: loss_points(p) >= 50, 20)   # raw + smoothed
        check_loss(json.loads(cdp.evaluate(LOSS_PROBE)))
        log("loss card, smoothing, step-0 eval, KPI text and resolved config OK (%d points)" % loss_points(loss))

    # 7. The screenshots, then the page's health: no exception, nothing but the server contacted.
    shot = cdp.call("Page.captureScreenshot", {"format": "png"}, 20)
    png = base64.b64decode(shot.get("data", ""))
    if not png.startswith(b"\x89PNG\r\n\x1a\n"):
        raise Failure("Page.captureScreenshot returned no PNG")
    with open(os.path.join(args.artifacts, "dashboard.png"), "wb") as f:
        f.write(png)
    log("wrote %s (%d bytes)" % (os.path.join(args.artifacts, "dashboard.png"), len(png)))
    try:
        metrics = cdp.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics.get("contentSize") or {}
        height = int(min(max(size.get("height", VIEWPORT[1]), VIEWPORT[1]), 6000))
        full = cdp.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True,
                                                   "clip": {"x": 0, "y": 0, "width": VIEWPORT[0], "height": height, "scale": 1}}, 20)
        with open(os.path.join(args.artifacts, "dashboard-full.png"), "wb") as f:
            f.write(base64.b64decode(full.get("data", "")))
    except Failure as e:
        log("note: no full-page screenshot (%s)" % e)
    final = probe()
    with open(os.path.join(args.artifacts, "dashboard_state.json"), "w") as f:
        json.dump(final, f, indent=1)

    exceptions = [e["params"].get("exceptionDetails", {}) for e in cdp.events if e["method"] == "Runtime.exceptionThrown"]
    if exceptions:
        details = [((x.get("exception") or {}).get("description") or x.get("text")) for x in exceptions]
        raise Failure("the page threw %d JavaScript exception(s): %s" % (len(exceptions), details[:3]))
    origin = first["origin"]
    foreign = sorted({e["params"]["request"]["url"] for e in cdp.events if e["method"] == "Network.requestWillBeSent"
                      and not e["params"]["request"]["url"].startswith((origin + "/", "data:", "blob:"))})
    if foreign:
        raise Failure("the page requested addresses other than its server %s: %s" % (origin, foreign[:5]))
    responses = [e["params"]["response"] for e in cdp.events if e["method"] == "Network.responseReceived"]
    failed = [e["params"] for e in cdp.events if e["method"] == "Network.loadingFailed" and not e["params"].get("canceled")]
    bad = [(r.get("url"), r.get("status")) for r in responses if r.get("status", 200) >= 400]
    if bad or failed:
        raise Failure("requests failed: %s %s" % (bad[:5], [f.get("errorText") for f in failed[:5]]))
    for e in cdp.events:
        if e["method"] == "Runtime.consoleAPICalled" and e["params"].get("type") in ("error", "assert"):
            log("note: console %s: %s" % (e["params"]["type"], [a.get("value", a.get("description")) for a in e["params"].get("args", [])][:3]))
        if e["method"] == "Log.entryAdded" and e["params"]["entry"].get("level") == "error":
            log("note: browser log: %s" % e["params"]["entry"].get("text"))
    log("dashboard OK: %d requests to %s, no exceptions" % (len(responses), origin))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trainflow", help="the trainflow binary")
    ap.add_argument("--source", help="the repository root (configs/)")
    ap.add_argument("--artifacts", required=True, help="directory for dashboard.png and the logs")
    ap.add_argument("--server-cmd", help="run this instead of prepare + train (it must print the 'monitor: rank 0 at' line)")
    ap.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    ap.add_argument("--deadline", type=float, default=90, help="overall time limit in seconds")
    args = ap.parse_args()
    for name in ("trainflow", "source", "artifacts"):
        if getattr(args, name):
            setattr(args, name, os.path.abspath(getattr(args, name)))

    def on_signal(signum, frame):
        raise Failure("interrupted by signal %d" % signum)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    deadline = Deadline(args.deadline)
    tmp = tempfile.mkdtemp(prefix="tf-dashboard-")
    procs = {}
    ok = False
    try:
        run(args, tmp, procs, deadline)
        ok = True
    except Failure as e:
        print("FAIL: %s" % e, file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - report anything, still clean up
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), file=sys.stderr, flush=True)
        import traceback
        traceback.print_exc()
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if not ok and procs.get("cdp"):
            try:                                   # what the page looked like when it failed
                procs["cdp"].deadline = Deadline(10)
                shot = procs["cdp"].call("Page.captureScreenshot", {"format": "png"}, 8)
                path = os.path.join(args.artifacts, "dashboard-failed.png")
                with open(path, "wb") as f:
                    f.write(base64.b64decode(shot.get("data", "")))
                print("the page at the failure: %s" % path, file=sys.stderr)
            except (Failure, OSError, ValueError) as e:
                print("no screenshot of the failure: %s" % e, file=sys.stderr)
        if procs.get("ws"):
            procs["ws"].close()
        kill_group(procs.get("chrome"), "chromium", 5)
        kill_group(procs.get("server"), "the training run", 15)
        if not ok:
            for name in ("server_log", "chrome_log"):
                if procs.get(name):
                    print("---- %s (tail) ----\n%s" % (os.path.basename(procs[name]), tail(procs[name], 30)), file=sys.stderr)
        if procs.get("server_log"):
            try:
                os.makedirs(args.artifacts, exist_ok=True)
                with open(os.path.join(args.artifacts, "server.log"), "w") as f:
                    f.write(tail(procs["server_log"], 400) + "\n")
            except OSError:
                pass
        shutil.rmtree(tmp, ignore_errors=True)
        log("%s in %.1f s" % ("PASS" if ok else "FAIL", time.monotonic() - T0))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
