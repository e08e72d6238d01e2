#!/usr/bin/env python3
"""A fault-injecting HTTP proxy in front of an S3 server, for the S3 tests.

Started by tests/integration/checkpoint/s3_test_servers.h for s3_store_test.cpp and s3_checkpoint_test.cpp.

Usage: s3_fault_proxy.py --port P --upstream-port U [--verbose]
Listens on 127.0.0.1:P and forwards every request to 127.0.0.1:U (loopback only), unless a fault
is armed. Controlled over HTTP on the same port (never forwarded):

  GET /__proxy/config?mode=M&count=N[&match=S][&method=X][&status=503&code=SlowDown][&delay=2]
      arms a fault for the next N forwarded requests whose method is X (any when absent) and whose
      path-and-query contains S (any when absent), clears the counters and captures. Modes:
        pass     forward everything (the default)
        error    answer `status` with an S3 XML error `code` instead of forwarding
        slow     forward, then wait `delay` seconds before answering
        stall    forward, send the headers and half of the body, then wait `delay` seconds
        drop     forward, send the headers and half of the body, then close the connection
        hold     forward N matching requests, then hold the next one until /__proxy/release
                 (stats say "holding": true meanwhile); it is then forwarded
        capture  forward everything and record each request (method, path, headers, body SHA-256)
        bloat    forward, then stretch a LIST answer by `bytes` bytes of extra <Contents> entries
                 (for answers too large to hold), sent as they are made
      `max_keys=K` (any mode) adds max-keys=K to ListObjectsV2 requests, for small pages.
  GET /__proxy/stats     {"requests", "faults", "holding", "kinds": {kind: count}} as JSON
  GET /__proxy/captured  the captured requests as JSON
  GET /__proxy/release   lets a held request go

When the upstream refuses the connection, the client's connection is closed without an answer, as
a dead server's would be. The proxy exits on SIGTERM/SIGKILL; it has no other state.
"""
import argparse
import hashlib
import http.client
import http.server
import json
import socket
import sys
import threading
import time
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "expect"}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.reset({})

    def reset(self, params):  # REQUIRES: lock held (or construction)
        self.mode = params.get("mode", "pass")
        self.count = int(params.get("count", "0"))
        self.match = params.get("match", "")
        self.method = params.get("method", "")
        self.status = int(params.get("status", "503"))
        self.code = params.get("code", "SlowDown")
        self.delay = float(params.get("delay", "0"))
        self.max_keys = params.get("max_keys", "")
        self.bytes = int(params.get("bytes", "0"))
        self.requests = 0
        self.faults = 0
        self.holding = False
        self.kinds = {}
        self.captured = []
        self.release.clear()


STATE = State()


def kind_of(method, path):
    query = urllib.parse.urlsplit(path).query
    params = urllib.parse.parse_qs(query, keep_blank_values=True)
    if method == "POST" and "uploads" in params:
        return "create_multipart"
    if method == "PUT" and "partNumber" in params:
        return "upload_part"
    if method == "POST" and "uploadId" in params:
        return "complete_multipart"
    if method == "DELETE" and "uploadId" in params:
        return "abort_multipart"
    if method == "GET" and "list-type" in params:
        return "list"
    return method.lower()


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    verbose = False

    def log_message(self, fmt, *args):
        if self.verbose:
            sys.stderr.write("s3_fault_proxy: " + (fmt % args) + "\n")

    def _send(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length", "0") or "0")
        return self.rfile.read(length) if length > 0 else b""

    def _control(self):
        url = urllib.parse.urlsplit(self.path)
        params = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        with STATE.lock:
            if url.path == "/__proxy/config":
                STATE.reset(params)
                body = {"ok": True}
            elif url.path == "/__proxy/stats":
                body = {"requests": STATE.requests, "faults": STATE.faults, "holding": STATE.holding,
                        "kinds": dict(STATE.kinds)}
            elif url.path == "/__proxy/captured":
                body = list(STATE.captured)
            elif url.path == "/__proxy/release":
                STATE.release.set()
                body = {"ok": True}
            else:
                self._send(404, b'{"error": "unknown control path"}')
                return
        self._send(200, json.dumps(body).encode())

    def _drop(self):
        self.close_connection = True
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _forward(self, path, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        try:
            conn.putrequest(self.command, path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():
                if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                    conn.putheader(name, value)
            if body or self.command in ("PUT", "POST"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body if body else None)
            resp = conn.getresponse()
            data = b"" if self.command == "HEAD" else resp.read()
            return resp.status, resp.reason, resp.getheaders(), data
        finally:
            conn.close()

    def _handle(self):
        if self.path.startswith("/__proxy/"):
            self._control()
            return
        body = self._read_body()
        method = self.command
        path = self.path
        kind = kind_of(method, path)
        hold = False
        with STATE.lock:
            STATE.requests += 1
            STATE.kinds[kind] = STATE.kinds.get(kind, 0) + 1
            mode = STATE.mode
            matches = (not STATE.method or STATE.method == method) and (STATE.match in path)
            fault = None
            if mode == "capture":
                STATE.captured.append({"method": method, "path": path, "headers": list(self.headers.items()),
                                       "body_sha256": hashlib.sha256(body).hexdigest(), "body_bytes": len(body)})
            elif mode == "hold" and matches:
                if STATE.count > 0:
                    STATE.count -= 1
                elif not STATE.holding and not STATE.release.is_set():
                    STATE.holding = True
                    STATE.faults += 1
                    hold = True
            elif mode != "pass" and matches and STATE.count > 0:
                STATE.count -= 1
                STATE.faults += 1
                fault = mode
            status, code, delay, max_keys, extra = STATE.status, STATE.code, STATE.delay, STATE.max_keys, STATE.bytes
        if hold:
            STATE.release.wait(timeout=60)
            with STATE.lock:
                STATE.holding = False
        if max_keys and kind == "list":
            url = urllib.parse.urlsplit(path)
            params = [(k, v) for k, v in urllib.parse.parse_qsl(url.query, keep_blank_values=True) if k != "max-keys"]
            params.append(("max-keys", max_keys))
            path = url.path + "?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote, safe="-_.~")
        if fault == "error":
            xml = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code><Message>injected by "
                   "s3_fault_proxy</Message><RequestId>fault-%d</RequestId></Error>" % (code, STATE.faults))
            self._send(status, xml.encode(), "application/xml")
            return
        try:
            up_status, up_reason, up_headers, data = self._forward(path, body)
        except (ConnectionError, OSError, http.client.HTTPException):
            self._drop()  # like a dead server (or one that broke off its answer)
            return
        if fault == "slow":
            time.sleep(delay)
        if fault == "bloat" and kind == "list":
            self._send_bloated(up_status, up_reason, up_headers, data, extra)
            return
        self.send_response_only(up_status, up_reason)
        for name, value in up_headers:
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        if self.command != "HEAD" and not any(n.lower() == "content-length" for n, _ in up_headers):
            self.send_header("Content-Length", str(len(data)))  # the upstream sent it chunked
        self.end_headers()
        if fault in ("drop", "stall"):
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            if fault == "stall":
                time.sleep(delay)
            self._drop()
            return
        self.wfile.write(data)

    def _send_bloated(self, status, reason, headers, data, extra):
        entry = b"<Contents><Key>bloat/" + b"x" * 200 + b"</Key><Size>1</Size></Contents>"
        at = data.rfind(b"</ListBucketResult>")
        at = len(data) if at < 0 else at
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data) + extra))
        self.end_headers()
        try:
            self.wfile.write(data[:at])
            block = entry * (65536 // len(entry))
            left = extra
            while left > 0:
                piece = block[:left] if left < len(block) else block
                self.wfile.write(piece)
                left -= len(piece)
            self.wfile.write(data[at:])
        except OSError:
            self.close_connection = True  # the client gave up on it

    def handle_one_request(self):
        try:
            super().handle_one_request()
        except (ConnectionError, socket.timeout):
            self.close_connection = True

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    Handler.verbose = args.verbose
    server = Server(("127.0.0.1", args.port), Handler)
    server.upstream_port = args.upstream_port
    server.serve_forever()


if __name__ == "__main__":
    main()
