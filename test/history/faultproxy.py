#!/usr/bin/python3
"""faultproxy.py CONTROL_FILE LISTEN:TARGET...: loopback TCP proxies for the
peer links of an etcd cluster, able to cut one member off.

Each member advertises a LISTEN port here as its peer URL, so all raft
traffic between members passes through this process.  A member both
receives on connections to its own proxy and sends on connections it
opens to the others' proxies (etcd's stream readers and pipelines), so
cutting it means dropping both.  The sender of a connection is known from
the header etcd puts on every peer request (X-Server-From: member id), and
each proxy learns its own member's id from X-Raft-To.

SIGUSR1 cuts off member N (0-based, the N-th LISTEN:TARGET pair), N read
from CONTROL_FILE: its open connections are closed and new ones refused.
SIGUSR2 heals.
"""

import re
import signal
import socket
import sys
import threading

control = sys.argv[1]
pairs = [tuple(int(p) for p in a.split(":")) for a in sys.argv[2:]]
member_id = {}          # proxy index -> etcd member id, learned from X-Raft-To
conns = {}              # (client socket, upstream socket) -> (proxy index, sender id)
lock = threading.Lock()
cut = None              # the proxy index of the member cut off, or None


def is_cut(index, sender):
    return cut is not None and (index == cut or sender == member_id.get(cut))


def close(*socks):
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def on_cut(*_):
    global cut
    with open(control) as f:
        cut = int(f.read())
    with lock:
        doomed = [pair for pair, (i, sender) in conns.items() if is_cut(i, sender)]
    for pair in doomed:
        close(*pair)


def on_heal(*_):
    global cut
    cut = None


signal.signal(signal.SIGUSR1, on_cut)
signal.signal(signal.SIGUSR2, on_heal)


def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    close(src, dst)


def serve(index, client, target):
    # read the request headers to learn who is talking to whom
    head = b""
    try:
        while b"\r\n\r\n" not in head and len(head) < 16384:
            data = client.recv(4096)
            if not data:
                break
            head += data
    except OSError:
        client.close()
        return
    sender = re.search(rb"(?im)^x-server-from:\s*(\w+)", head)
    sender = sender.group(1).decode() if sender else None
    to = re.search(rb"(?im)^x-raft-to:\s*(\w+)", head)
    if to:
        member_id.setdefault(index, to.group(1).decode())
    if is_cut(index, sender):
        client.close()
        return
    try:
        upstream = socket.create_connection(("127.0.0.1", target), 2)
        upstream.sendall(head)
    except OSError:
        client.close()
        return
    with lock:
        conns[(client, upstream)] = (index, sender)
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    pump(upstream, client)
    with lock:
        conns.pop((client, upstream), None)


def listen(index, port, target):
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(64)
    while True:
        client, _ = server.accept()
        threading.Thread(target=serve, args=(index, client, target), daemon=True).start()


for i, (port, target) in enumerate(pairs):
    threading.Thread(target=listen, args=(i, port, target), daemon=True).start()
while True:
    signal.pause()
