"""`persys automation`: the automation loop as a process of its own (docs/automation.md), a client
of the scheduler with its own certificate: a user identity in persys:operators, e.g.

    persys certs issue --ca-dir /etc/persys/ca --role user --name persys-automation \\
        --group persys:operators --out /etc/persys/automation
    persys automation --scheduler sched1:7443,sched2:7443 --tls-dir /etc/persys/automation

Every action it takes is authorized and audited as that identity. `persys dev` runs it in-process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from persys.cli.servers.common import run_main, setup_logging, until_signalled
from persys.cli.servers.errors import ServerError
from persys.tlsfiles import TLSFiles

# The rights the automation acts with (docs/automation.md): an operator's.
NEEDED = (("list", "automation-policies"), ("record", "automation-decisions"), ("list", "automation-decisions"),
          ("apply", "workloads"), ("control", "workloads"), ("move", "workloads"), ("cordon", "nodes"),
          ("get", "telemetry"), ("list", "nodes"), ("lead", "automation"))


def automation(
    scheduler_addr: str = typer.Option(..., "--scheduler", help="Scheduler gRPC address(es) host:port[,host:port]."),
    tls_dir: Path = typer.Option(..., "--tls-dir", help="Directory with ca.crt and the automation's certificate "
                                 "(--name NAME: NAME.crt, NAME.key)."),
    name: str = typer.Option("persys-automation", "--name", help="File name of the certificate and key in --tls-dir."),
    tick: float = typer.Option(1.0, "--tick", min=0.1, max=60, help="Seconds between passes (each policy is "
                               "evaluated at its own intervalSeconds)."),
    lease_ttl: float = typer.Option(10.0, "--lease-ttl", min=2, max=300, help="Seconds the leader lease lasts "
                                    "unrenewed: how long a dead leader holds back the standby."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run the automation: evaluate every policy (kind: Policy) at its interval, act through the
    API as this identity, record every decision (persysctl automation log).

    One automation per cluster acts: each process asks the scheduler for the automation's leader
    lease every tick (a store lease of --lease-ttl seconds); the others stand by, decide and
    record nothing, and one of them takes over once the leader stops renewing (killed, frozen,
    cut off). Run two for availability."""
    setup_logging(verbose)
    tls = TLSFiles(tls_dir / "ca.crt", tls_dir / f"{name}.crt", tls_dir / f"{name}.key")
    for f in (tls.ca, tls.cert, tls.key):
        if not f.is_file():
            raise ServerError(f"--tls-dir: {f} not found")

    async def main() -> None:
        from persys.automation.disk_forecasts import NodeDiskForecasts
        from persys.automation.leadership import Leadership
        from persys.automation.loop import AutomationLoop
        from persys.client import SchedulerClient, SchedulerError

        client = SchedulerClient(scheduler_addr, tls)
        stop = asyncio.Event()
        tasks: list[asyncio.Task[None]] = []

        async def started() -> None:
            leadership = Leadership(client, ttl=lease_ttl)
            # Disk forecasts by Intelligence's model over the meter, read as this identity (remediate).
            loop = AutomationLoop(client, tick=tick, leadership=leadership, disk=NodeDiskForecasts(client))
            try:
                # What it will do, asked now: a missing right is one line at start, not a failed action later.
                missing = [f"{verb} {resource}" for verb, resource in NEEDED
                           if not (await client.can_i(verb, resource))["allowed"]]
                if missing:
                    raise ServerError(f"automation cannot run: PERMISSION_DENIED: this identity may not "
                                      f"{', '.join(missing)} (give it a certificate in persys:operators)")
                await loop.run_once()
            except SchedulerError as err:
                raise ServerError(f"automation cannot run: {err.code}: {err.message}") from None
            tasks.append(asyncio.create_task(loop.run(stop)))
            role = "leading" if leadership.leading else f"standing by, {leadership.holder_seen} leads"
            print(f"automation ready (scheduler {scheduler_addr}; {leadership.holder}: {role})", flush=True)

        async def stopped() -> None:
            stop.set()
            for t in tasks:
                await t
            await client.close()

        await until_signalled(started, stopped)

    run_main(main)
