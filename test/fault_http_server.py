#!/usr/bin/python3
"""fault_http_server.py - inject malformed and slow etcd replies, for tests only.

A small HTTP/1.1 server (Python standard library only) that sits between
lockfence and a REAL etcd member.  Every request is forwarded unchanged to
the upstream etcd and its reply is passed back, except for requests whose
path matches a fault rule: those get a broken reply instead (or the real
reply, altered).  So the lock protocol runs against real etcd state, and
only the one step under test misbehaves.

Usage:
    /usr/bin/python3 fault_http_server.py --upstream http://127.0.0.1:2379 \
        --port-file /tmp/x/port [--port 0]

Control API (on the same port, never forwarded):
    POST /_fault/set    {"path": "/v3/lock/lock", "mode": "...", "times": N, ...}
                        add a rule (times: how many matching requests it
                        applies to; default unlimited)
    POST /_fault/clear  remove every rule
    GET  /_fault/hits   {"<path>": count, ...} requests seen per path,
                        and "faults": number of faulty replies sent

Modes:
    invalid_json     200, a body that is not JSON
    truncated        200, Content-Length larger than the body, then close
    oversized        200, a valid JSON body of "size" bytes (default 4 MiB)
                     with a correct Content-Length
    oversized_chunked  the same without Content-Length (chunked encoding)
    status           reply with "status" (default 500) and "body" (default an
                     etcd-style error JSON, code 2), after "delay" seconds
                     (default 0)
    mutate           forward, then alter the JSON reply with "ops": a list
                     of {"op": "set"|"del", "path": [k, 0, ...], "value": v}
    nested           reply with "status" (default 200) and a JSON object
                     nesting arrays "depth" levels deep (default 100000)
    desync           forward, reply, then after "delay" seconds (default 0.3)
                     send one more complete HTTP response, unasked, on the
                     same kept-alive connection: "extra" (a JSON document or
                     a string; default: the real reply again), as a server
                     out of step with its client would
    slow             200, Content-Length 1 MB, then one byte per second:
                     the reply never ends
    hang             read the request, send nothing
    transient        one of the answers etcd's JSON gateway gives while a
                     member restarts, an election runs or it is overloaded,
                     exactly as etcd 3.4 sends it; "kind" is one of
                     closing          408, code 1 "grpc: the client
                                      connection is closing" (a restart)
                     leader_changed   503, code 14 "etcdserver: leader changed"
                     no_leader        503, code 14 "etcdserver: no leader"
                     too_many_requests  429, code 8 "etcdserver: too many
                                      requests"
                     timed_out        503, code 14 "etcdserver: request
                                      timed out"
                     With "times": N, N such answers, then the request is
                     relayed to etcd as usual.
    reset            read the request, then reset the connection (RST, no
                     reply), as a member that is killed mid-request does
    applied_hang     forward the request (etcd applies it), then send
                     nothing, as "hang": an answer lost on the way back
    lines            200, chunked: each string of "lines" as one chunk
                     (a watch stream's messages), then keep the stream open
                     for "seconds" (default 600) unless "close" is true

Watches (/v3/watch) without a rule are relayed as streams, chunk by chunk,
for as long as both sides keep them open.
"""

import argparse
import http.client
import json
import os
import socket
import struct
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RULES = []
HITS = {}
FAULTS = [0]
LOCK = threading.Lock()
UPSTREAM = None


def take_rule(path):
    """Return the first rule for path that has uses left, consuming one."""
    with LOCK:
        HITS[path] = HITS.get(path, 0) + 1
        for rule in RULES:
            if rule["path"] != path:
                continue
            times = rule.get("times")
            if times is not None:
                if times <= 0:
                    continue
                rule["times"] = times - 1
            FAULTS[0] += 1
            return rule
    return None


# The gateway's transient answers (mode "transient"): HTTP status, gRPC
# code, message, as etcd 3.4 sends them.
TRANSIENT = {
    "closing": (408, 1, "grpc: the client connection is closing"),
    "leader_changed": (503, 14, "etcdserver: leader changed"),
    "no_leader": (503, 14, "etcdserver: no leader"),
    "too_many_requests": (429, 8, "etcdserver: too many requests"),
    "timed_out": (503, 14, "etcdserver: request timed out"),
}


def apply_ops(doc, ops):
    """Alter a decoded JSON document in place as the mutate rule says."""
    for op in ops:
        path = op["path"]
        parent = doc
        try:
            for k in path[:-1]:
                parent = parent[k]
            last = path[-1]
            if op["op"] == "set":
                parent[last] = op.get("value")
            elif op["op"] == "del":
                del parent[last]
        except (KeyError, IndexError, TypeError):
            pass
    return doc


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lockfence-fault/1"

    def log_message(self, fmt, *args):
        if os.environ.get("FAULT_SERVER_VERBOSE"):
            sys.stderr.write("fault: " + (fmt % args) + "\n")

    def read_body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def reply(self, status, body, ctype="application/json", close=False):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        if self.path == "/_fault/hits":
            with LOCK:
                doc = dict(HITS)
                doc["faults"] = FAULTS[0]
            self.reply(200, json.dumps(doc).encode())
        else:
            self.forward(b"")

    def do_POST(self):
        body = self.read_body()
        if self.path == "/_fault/set":
            rule = json.loads(body)
            with LOCK:
                RULES.append(rule)
            self.reply(200, b'{"ok":true}')
            return
        if self.path == "/_fault/clear":
            with LOCK:
                RULES.clear()
            self.reply(200, b'{"ok":true}')
            return

        rule = take_rule(self.path)
        if rule is None and self.path == "/v3/watch":
            self.forward_stream(body)
        elif rule is None:
            self.forward(body)
        else:
            self.fault(rule, body)

    def open_upstream(self, body, timeout=None):
        """Send the request on to the real etcd, with the client's
        Authorization header; return the connection and its response."""
        u = UPSTREAM
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        try:
            hdrs = {"Content-Type": "application/json"}
            if self.headers.get("Authorization"):
                hdrs["Authorization"] = self.headers["Authorization"]
            conn.request(self.command, self.path, body=body, headers=hdrs)
            return conn, conn.getresponse()
        except BaseException:
            conn.close()
            raise

    def upstream(self, body):
        """Send the request to the real etcd; return (status, headers, body)."""
        conn, r = self.open_upstream(body, timeout=120)
        try:
            return r.status, r.getheader("Content-Type") or "application/json", r.read()
        finally:
            conn.close()

    def forward_stream(self, body):
        """Relay a streaming reply (a watch) chunk by chunk."""
        self.close_connection = True
        try:
            conn, r = self.open_upstream(body)
        except OSError:
            return
        try:
            self.send_response(r.status)
            self.send_header("Content-Type", r.getheader("Content-Type") or "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            while True:
                data = r.read1(65536)
                if not data:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        finally:
            conn.close()

    def forward(self, body):
        try:
            status, ctype, data = self.upstream(body)
        except OSError as e:
            self.reply(502, json.dumps({"error": str(e)}).encode(), close=True)
            return
        self.reply(status, data, ctype)

    def fault(self, rule, body):
        mode = rule["mode"]
        if mode == "invalid_json":
            self.reply(200, b'{"header":{"revision":"7"}, this is not json')
        elif mode == "truncated":
            data = b'{"header":{"cluster_id":"1","member_id":"2","revision":"7"},"ID":"12'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data) + 200))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
        elif mode in ("oversized", "oversized_chunked"):
            size = int(rule.get("size", 4 * 1024 * 1024))
            pad = b"A" * size
            data = b'{"header":{"revision":"7"},"pad":"' + pad + b'","ID":"1"}'
            if mode == "oversized":
                self.reply(200, data)
            else:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                try:
                    for i in range(0, len(data), 65536):
                        chunk = data[i:i + 65536]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    self.close_connection = True
        elif mode == "status":
            time.sleep(float(rule.get("delay", 0)))
            status = int(rule.get("status", 500))
            doc = rule.get("body")
            if doc is None:
                doc = {"error": "etcdserver: injected failure",
                       "message": "etcdserver: injected failure", "code": 2}
            data = doc.encode() if isinstance(doc, str) else json.dumps(doc).encode()
            self.reply(status, data)
        elif mode == "transient":
            status, code, msg = TRANSIENT[rule["kind"]]
            self.reply(status, json.dumps({"error": msg, "message": msg,
                                           "code": code}).encode())
        elif mode == "reset":
            self.close_connection = True
            try:
                # SO_LINGER with a zero timeout: close() sends a RST
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                           struct.pack("ii", 1, 0))
                self.connection.close()
            except OSError:
                pass
        elif mode == "mutate":
            try:
                status, ctype, data = self.upstream(body)
            except OSError as e:
                self.reply(502, json.dumps({"error": str(e)}).encode(), close=True)
                return
            try:
                doc = apply_ops(json.loads(data), rule.get("ops", []))
                data = json.dumps(doc).encode()
            except ValueError:
                pass
            self.reply(status, data, ctype)
        elif mode == "nested":
            depth = int(rule.get("depth", 100000))
            data = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
            self.reply(int(rule.get("status", 200)), data)
        elif mode == "desync":
            try:
                status, ctype, data = self.upstream(body)
            except OSError as e:
                self.reply(502, json.dumps({"error": str(e)}).encode(), close=True)
                return
            self.reply(status, data, ctype)
            extra = rule.get("extra")
            if extra is None:
                extra = data
            elif not isinstance(extra, str):
                extra = json.dumps(extra)
            if isinstance(extra, str):
                extra = extra.encode()
            time.sleep(float(rule.get("delay", 0.3)))
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(extra), extra))
                self.wfile.flush()
            except OSError:
                self.close_connection = True
        elif mode == "slow":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.close_connection = True
            try:
                self.wfile.write(b'{"header":{"revision":"7"},"pad":"')
                self.wfile.flush()
                end = time.time() + float(rule.get("seconds", 600))
                while time.time() < end:
                    self.wfile.write(b"A")
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                pass
        elif mode in ("hang", "applied_hang"):
            if mode == "applied_hang":
                try:
                    self.upstream(body)
                except OSError:
                    pass
            self.close_connection = True
            end = time.time() + float(rule.get("seconds", 600))
            try:
                self.connection.settimeout(1)
                while time.time() < end:
                    try:
                        if self.connection.recv(1) == b"":
                            break
                    except socket.timeout:
                        pass
            except OSError:
                pass
        elif mode == "lines":
            self.close_connection = True
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for line in rule.get("lines", []):
                    data = line.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                if not rule.get("close"):
                    self.connection.settimeout(1)
                    end = time.time() + float(rule.get("seconds", 600))
                    while time.time() < end:
                        try:
                            if self.connection.recv(1) == b"":
                                break
                        except socket.timeout:
                            pass
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
        else:
            self.reply(400, json.dumps({"error": "unknown fault mode " + mode}).encode())


def main():
    global UPSTREAM
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", required=True, help="URL of a real etcd member (http)")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", help="write the chosen port here once listening")
    args = ap.parse_args()
    UPSTREAM = urllib.parse.urlsplit(args.upstream)

    srv = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    srv.daemon_threads = True
    port = srv.server_address[1]
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write("%d\n" % port)
        os.rename(tmp, args.port_file)
    sys.stdout.write("listening on 127.0.0.1:%d\n" % port)
    sys.stdout.flush()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
