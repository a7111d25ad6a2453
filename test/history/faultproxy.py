#!/usr/bin/python3
"""faultproxy.py LISTEN_PORT TARGET_PORT: a loopback TCP proxy that can cut.

An etcd member advertises this proxy as its peer URL, so the other members
reach it only through here.  SIGUSR1 cuts the member off: every open
connection is closed and new ones are closed at once.  SIGUSR2 heals.
(The member's own outgoing pipeline requests still leave; etcd runs with
--pre-vote, so a cut-off member cannot disrupt the others' leader.)
"""

import signal
import socket
import sys
import threading

listen_port, target_port = int(sys.argv[1]), int(sys.argv[2])
cut = threading.Event()
open_socks = set()
lock = threading.Lock()


def close_all():
    with lock:
        for s in list(open_socks):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        open_socks.clear()


def on_cut(*_):
    cut.set()
    threading.Thread(target=close_all, daemon=True).start()


signal.signal(signal.SIGUSR1, on_cut)
signal.signal(signal.SIGUSR2, lambda *_: cut.clear())


def pump(src, dst):
    try:
        while not cut.is_set():
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with lock:
        open_socks.difference_update((src, dst))
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def serve(client):
    if cut.is_set():
        client.close()
        return
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), 2)
    except OSError:
        client.close()
        return
    with lock:
        open_socks.update((client, upstream))
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
    pump(upstream, client)


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", listen_port))
server.listen(64)
while True:
    try:
        conn, _ = server.accept()
    except InterruptedError:
        continue
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
