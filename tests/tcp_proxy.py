"""A TCP forwarder for network faults in tests: real connections between a real client and a
real server (etcd, a scheduler) that the test can break the way networks break.

- `cut()` is a partition: open connections stay open but carry nothing, and new ones are
  accepted and then ignored (no reset reaches either side), so calls hang until their own
  deadlines, as when a path black-holes packets.
- `reset()` is a refusal: every forwarded connection is closed, and new ones are closed as soon
  as they are accepted, so the client sees resets and failed connects.
- `heal()` ends either: what the fault left behind is closed (the clients reconnect, as after a
  partition connections die on their timeouts) and new connections are forwarded again.
- `hold()` delays instead: every byte is kept (connections stay open) and delivered at
  `release()`, as from a peer that is only very slow: late answers, not lost ones.

The listener binds port 0 (the kernel picks the port: no race with other tests).
"""

from __future__ import annotations

import contextlib
import socket
import threading

FORWARD, SILENT, REFUSE = "forward", "silent", "refuse"


class TcpProxy:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host.strip("[]"), int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._mode = FORWARD
        self._flowing = threading.Event()  # cleared while held
        self._flowing.set()
        self._closed = threading.Event()
        self._accepter = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)
        self._accepter.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def hold(self) -> None:
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def cut(self) -> None:
        self._mode = SILENT

    def reset(self) -> None:
        self._mode = REFUSE
        self._drop_all()

    def heal(self) -> None:
        self._drop_all()
        self._mode = FORWARD

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._drop_all()
        self._accepter.join(5)
        self._listener.close()

    def _drop_all(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns), set()
        for s in conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _start(self, src: socket.socket, dst: socket.socket | None) -> None:
        threading.Thread(target=self._pump, args=(src, dst), name="tcp-proxy-pump", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            if self._mode == REFUSE:
                client.close()
                continue
            if self._mode == SILENT:  # accepted, then silence
                with self._lock:
                    self._conns.add(client)
                self._start(client, None)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns |= {client, upstream}
            self._start(client, upstream)
            self._start(upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        try:
            while data := src.recv(65536):
                self._flowing.wait()  # held: delivered late, in order
                if dst is not None and self._mode == FORWARD:
                    dst.sendall(data)  # while cut, bytes are dropped on the floor
        except OSError:
            pass
        finally:
            with self._lock:
                self._conns -= {src, dst} if dst is not None else {src}
            for s in (src, dst):
                if s is not None:
                    with contextlib.suppress(OSError):
                        s.shutdown(socket.SHUT_RDWR)
                    s.close()
