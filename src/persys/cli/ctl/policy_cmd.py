"""`persysctl policy get|set`: the cluster's workload policy (see docs/security.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from persys.cli.ctl import api as ctl

policy_app = typer.Typer(help="Show or replace the workload policy (what workloads may do to nodes); replay an "
                         "automation policy (kind: Policy) over past meter data.", no_args_is_help=True)


@policy_app.command("replay")
def policy_replay(
    name: str = typer.Argument(..., help="An autoscale policy (persysctl get policies)."),
    since: str = typer.Option("7d", "--since", help="How far back: 1h, 1d, 7d (at most 30d)."),
    start_replicas: int = typer.Option(0, "--start-replicas", min=0, max=10_000,
                                       help="Replicas at the start (default: the workload's current count)."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    server: str | None = typer.Option(None, "--server", help="Gateway URL, overriding the configuration file."),
) -> None:
    """Run the policy's decision over its workload's meter history, as if it had been enabled:
    actions per hour, flaps, time over target, each action it would have taken. Nothing is done."""
    from persys.cli.ctl.automation_cmds import replay_cmd

    replay_cmd(name, since, start_replicas, output, server)


@policy_app.command("get")
def policy_get(
    output: str = typer.Option("yaml", "--output", "-o", help="yaml or json."),
    server: str | None = typer.Option(None, "--server", help="Gateway URL, overriding the configuration file."),
) -> None:
    """Print the policy in force (the defaults when none is stored)."""
    doc = ctl.Api(server).request("GET", "/v1/policy")
    if not doc.get("stored"):
        ctl.err_console.print("no policy is stored: the defaults hold", highlight=False)
    ctl.emit(doc["policy"], output)


@policy_app.command("set")
def policy_set(
    file: Path = typer.Option(..., "--filename", "-f", help="A policy document (YAML or JSON); '-' reads stdin."),
    server: str | None = typer.Option(None, "--server", help="Gateway URL, overriding the configuration file."),
) -> None:
    """Replace the policy (admins only). Fields left out take their safe defaults."""
    from pydantic import ValidationError

    from persys.model.documents import DocumentError, parse_document
    from persys.model.manifest import format_validation_error
    from persys.policy import WorkloadPolicy

    try:
        raw = typer.get_text_stream("stdin").read() if str(file) == "-" else file.read_text()
        doc = parse_document(raw) if raw.strip() else {}
        policy = WorkloadPolicy.model_validate(doc)
    except OSError as err:
        ctl.fail(f"{file}: {err.strerror}")
    except DocumentError as err:
        ctl.fail(f"{file}: {err}")
    except ValidationError as err:
        ctl.fail(f"{file}: " + "; ".join(format_validation_error(err)))
    answer = ctl.Api(server).request("PUT", "/v1/policy", json=policy.model_dump(mode="json", by_alias=True))
    ctl.err_console.print("workload policy replaced", highlight=False)
    ctl.emit(answer["policy"], "yaml")
