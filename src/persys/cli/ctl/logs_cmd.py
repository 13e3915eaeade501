"""`persysctl logs`: a workload's output, once or followed (`-f`) as the gateway streams it (SSE,
gateway/routes/logs.py).

Following ends when the instance goes away (exit 0, the reason on stderr) or on Ctrl-C (exit 0).
A dropped connection is reopened with a one-line notice, asking only for new output: what was
written while the link was down may be missing (logs have no event ids to resume after).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx
import typer

from persys.cli.ctl.api import Api, ServerOpt, err_console, fail
from persys.cli.ctl.follow import MAX_BACKOFF, StreamRefused, frames

HELP = """Show a workload's output: container logs, compose services, a VM's serial console, a process.

Examples:

  persysctl logs web                        the last 100 lines

  persysctl logs -f web                     then new output as it is written, until Ctrl-C or the workload goes away

  persysctl logs web --since 10m --tail 0   everything of the last 10 minutes

  persysctl logs app --service db           one compose service (without it, each line starts with its service)

A process's output and a VM's or microVM's serial console carry no time per line: their times are
when the agent saw the output appear (it looks every second; never earlier than the line was
written)."""


def _write(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
    sys.stdout.flush()


def _follow(api: Api, path: str, params: dict[str, Any]) -> None:
    backoff = 0.5
    try:
        while True:
            try:
                for frame in frames(api, path, params):
                    backoff = 0.5
                    body = json.loads("\n".join(frame.data)) if frame.data else {}
                    if frame.event == "end":
                        err_console.print(body.get("reason", "the stream ended"), markup=False, highlight=False)
                        return
                    if frame.event == "error":
                        raise httpx.ReadError(body.get("error", "the stream broke"))
                    if "text" in body:
                        _write(body["text"])
                return  # the server closed without `end`: nothing more will come
            except StreamRefused as err:
                fail(str(err))
            except httpx.HTTPError as err:
                err_console.print(f"connection to {api.base} lost ({err or type(err).__name__}); following again "
                                  "(lines written meanwhile may be missing)", markup=False, highlight=False)
                params = {**params, "tail": 0, "since": ""}
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
    except KeyboardInterrupt:
        return


def logs_command(
    name: str = typer.Argument(..., help="Workload name."),
    instance: str = typer.Option("", "--instance", help="Replica instance (default: the first), e.g. web.1."),
    tail: int = typer.Option(100, "--tail", "-n", min=0, max=10_000,
                             help="Lines of history first (0: none; with --since, all since then)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Then stream new output until Ctrl-C or until the "
                                "workload goes away."),
    since: str = typer.Option("", "--since", help="Only output after this: 10m, 2h, 1d or an RFC 3339 time "
                              "(container and compose workloads)."),
    service: str = typer.Option("", "--service", help="Compose: only this service's output."),
    timestamps: bool = typer.Option(False, "--timestamps", help="Prefix each line with its time (container "
                                    "and compose workloads)."),
    server: str | None = ServerOpt,
) -> None:
    params: dict[str, Any] = {"instance": instance, "tail": tail, "since": since, "service": service,
                              "timestamps": str(timestamps).lower()}
    path = f"/v1/workloads/{name}/logs"
    api = Api(server)
    if follow:
        _follow(api, path, {**params, "follow": "true"})
        return
    _write(api.request("GET", path, params=params)["text"])
