"""A TCP forwarder for network faults in tests: a real connection between a client and a real
server (etcd) that the test can cut and restore, the way a partition or a flapping link would.

`cut()` closes every forwarded connection and, until `restore()`, closes new ones as soon as
they are accepted, so the client sees resets and failed connects rather than a silent stall.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host.strip("[]"), int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))  # port 0: the kernel picks, no race
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._cut = threading.Event()
        self._closed = threading.Event()
        self._accepter = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)
        self._accepter.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._cut.set()
        self._drop_all()

    def restore(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._closed.set()
        self._drop_all()
        self._accepter.join(5)
        self._listener.close()
        for t in list(self._threads):
            t.join(5)

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._cut.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self._conns |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                t = threading.Thread(target=self._pump, args=(a, b), name="tcp-proxy-pump", daemon=True)
                self._threads.append(t)
                t.start()
            self._threads = [t for t in self._threads if t.is_alive()]

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns -= {src, dst}
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
