"""A TCP proxy a test can cut, to partition one process from another while both keep running.

`cut()` is a silent partition: connections stay open but every byte is dropped, and new
connections are accepted and then ignored, as when a network path black-holes packets (no reset
reaches either side). `heal()` closes what the cut left behind (as a partition ends with
connections dead on their timeouts) and forwards new connections again. Binds port 0.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class TcpProxy:
    def __init__(self, upstream: tuple[str, int], host: str = "127.0.0.1") -> None:
        self.upstream = upstream
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self._cut = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()  # every socket a connection holds
        self._closed = False
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()

    def cut(self) -> None:
        self._cut = True

    def heal(self) -> None:
        with self._lock:
            self._cut = False
            doomed, self._sockets = self._sockets, set()
        for s in doomed:
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.heal()

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._cut:  # accepted, then silence
                self._track(client)
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            self._track(client, server)
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if dst is not None and not self._cut:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
