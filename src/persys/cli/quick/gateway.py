"""The quick path's transport (`cli.quick.entry`, `cli.quick.verbs`): one kept-alive mutual-TLS
HTTP/1.1 connection to the gateway with the standard library, and the full client's error lines."""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any, NoReturn, Protocol

TIMEOUT = 30.0  # seconds, as the full client's
GLOBAL = ("--token", "--context", "--server")  # persysctl's options before a command (`get` has a --server too)


def option_value(argv: list[str], i: int, eq: str, value: str) -> tuple[int, str | None]:
    """The value of the option at argv[i]: after its `=` (`eq` set), else the next word (the
    index moves past it); None when the command line ends first. Pure."""
    if eq:
        return i, value
    if i + 1 >= len(argv):
        return i, None
    return i + 1, argv[i + 1]


class QuickError(Exception):
    """One line for the user; exit code 1 (as the full client's CtlError)."""


class Target(Protocol):
    """Which gateway a command talks to, and as whom (its global options)."""

    server: str | None
    context: str | None
    token: str | None


class Gateway:
    """One kept-alive HTTPS connection to the gateway, its certificate checked against the
    cluster CA and the gateway role's name (as the full client's transport does)."""

    def __init__(self, cmd: Target) -> None:
        import http.client
        import ssl
        from urllib.parse import urlsplit

        from persys.cli.config import ConfigError, load_client_config
        from persys.security import peer_names

        try:
            cfg = load_client_config(server=cmd.server, token=cmd.token, context=cmd.context)
        except ConfigError as e:
            raise QuickError(str(e)) from None
        self.base = cfg.server.rstrip("/")
        url = urlsplit(self.base)
        if url.scheme != "https" or not url.hostname:
            raise FullClient
        ctx = ssl.create_default_context(cafile=str(cfg.ca))
        if cfg.cert is not None and cfg.key is not None:
            ctx.load_cert_chain(str(cfg.cert), str(cfg.key))
        host, port, sni = url.hostname, url.port or 443, peer_names.GATEWAY

        class Connection(http.client.HTTPSConnection):
            def connect(self) -> None:  # the TLS name is the gateway role's, whatever host we dial
                raw = socket.create_connection((host, port), TIMEOUT)
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.sock = ctx.wrap_socket(raw, server_hostname=sni)

        self.http_error = http.client.HTTPException
        self.conn = Connection(host, port, timeout=TIMEOUT, context=ctx)
        self.prefix = url.path.rstrip("/")
        self.headers = {"accept": "application/json"}
        if cfg.token:
            self.headers["authorization"] = f"Bearer {cfg.token}"

    def get(self, path: str, query: dict[str, str]) -> Any:
        return self.request("GET", path, query)

    def request(self, method: str, path: str, query: dict[str, str] | None = None, body: Any = None,
                refused: tuple[int, ...] = ()) -> Any:
        """The JSON answer; QuickError with the full client's line for an error or a refusal,
        Refused for a status in `refused` (the caller hands over to the full client)."""
        from urllib.parse import urlencode

        if self.conn.sock is None:  # (again, after the server closed a kept-alive connection)
            try:
                self.conn.connect()
            except TimeoutError:
                raise QuickError(f"the Persys gateway at {self.base} did not answer in time") from None
            except OSError:  # refused, no such host, the TLS handshake failed: as the full client says
                raise QuickError(f"cannot reach the Persys gateway at {self.base} (is the cluster running?)") from None
        try:
            url = f"{self.prefix}{path}" + (f"?{urlencode(query)}" if query else "")
            headers = self.headers if body is None else {**self.headers, "content-type": "application/json"}
            data = None if body is None else json.dumps(body).encode()
            self.conn.request(method, url, body=data, headers=headers)
            resp = self.conn.getresponse()
            answer = resp.read()
        except TimeoutError:
            raise QuickError(f"the Persys gateway at {self.base} did not answer in time") from None
        except (OSError, self.http_error) as e:  # connection reset, a broken answer
            raise QuickError(f"request to {self.base} failed: {e}") from None
        if resp.status in refused:
            raise Refused(resp.status)
        if resp.status >= 400:
            from persys.cli.output.refusal import refusal_text

            raise QuickError(refusal_text(answer, resp.reason))
        return json.loads(answer)


class Refused(Exception):
    """A refusal the caller asked to see as such (its status code in args[0])."""


class FullClient(Exception):
    """This command is the full client's after all (a plain-HTTP server, say)."""


# --------------------------------------------------------------------------- errors


def fail(message: str) -> NoReturn:
    from persys.cli.output.safe_text import printable

    sys.stderr.write(f"error: {printable(message)}\n")
    sys.exit(1)


def terminal_width() -> int | None:
    """The width rich would draw in: the terminal's (or $COLUMNS) on a terminal, 250 when piped
    (as `cli.ctl.api.out`); None when it is unclear (the full client draws then)."""
    if not sys.stdout.isatty():
        return 250
    try:
        width = os.get_terminal_size(sys.stdout.fileno()).columns
    except OSError:
        return None
    env = os.environ.get("COLUMNS", "")
    return min(width, int(env)) if env.isdigit() else width
