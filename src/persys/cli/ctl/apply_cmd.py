"""`persysctl apply -f FILE|DIR`: manifests read (every kind, directories expanded, views read
back), sent in bulk or one by one, with --wait and --dry-run."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from persys.cli.ctl import (
    apply_wait,
    automation_cmds,
    bucket_cmds,
    secret_cmds,
    volume_cmds,
)
from persys.cli.ctl import tracing as ctl_tracing
from persys.cli.ctl.api import (
    Api,
    ServerOpt,
    emit,
    err_console,
    fail,
    out,
)
from persys.cli.ctl.views import as_manifests
from persys.model.limits import BATCH_MAX_BYTES, MANIFEST_MAX_BYTES, human_bytes

if TYPE_CHECKING:  # the models load only for the commands that read manifests (startup time)
    from persys.model.automation import PolicyManifest
    from persys.model.bucket import BucketManifest
    from persys.model.secret import SecretManifest
    from persys.model.volume import VolumeManifest


def read_manifest_files(files: list[Path]) -> list[tuple[str, dict[str, Any]]]:
    return read_files(files).docs


def _expand_dirs(files: list[Path]) -> list[Path]:
    """A folder stands for its manifests (*.yaml, *.yml, *.json, not recursive, in name order), as
    with kubectl; an empty one is an error rather than a silent no-op."""
    out: list[Path] = []
    for f in files:
        if str(f) != "-" and f.is_dir():
            found = sorted(p for p in f.iterdir() if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
            if not found:
                fail(f"{f}: a folder with no *.yaml, *.yml or *.json manifest")
            out += found
        else:
            out.append(f)
    return out


@dataclass
class _Files:
    docs: list[tuple[str, dict[str, Any]]]  # workload manifests, as documents to send
    secrets: list[SecretManifest]
    volumes: list[VolumeManifest]
    buckets: list[BucketManifest]
    policies: list[PolicyManifest] = field(default_factory=list)


def read_files(files: list[Path]) -> _Files:
    """Workload manifests and the `kind: Secret` and `kind: Volume` documents of the files."""
    from persys.model.kinds import parse_documents
    from persys.model.manifest import ManifestError, load_documents

    docs: list[tuple[str, dict[str, Any]]] = []
    secrets: list[SecretManifest] = []
    volumes: list[VolumeManifest] = []
    buckets: list[BucketManifest] = []
    policies: list[PolicyManifest] = []
    for f in _expand_dirs(files):
        if str(f) == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            if not f.exists():
                fail(f"{f}: no such file")
            # A file of many manifests may be larger than one; each is checked after parsing.
            if f.stat().st_size > BATCH_MAX_BYTES:
                fail(f"{f}: larger than {human_bytes(BATCH_MAX_BYTES)}, the most one apply may send")
            text, source = f.read_text(), str(f)
        try:
            # Validate locally first: the whole set is refused before anything is written.
            # What `get -o yaml|json` printed reads as the manifests it shows (persys.cli.ctl.views).
            found = parse_documents(as_manifests(load_documents(text, source)), source)
            secrets += found.secrets
            volumes += found.volumes
            buckets += found.buckets
            policies += found.policies
            for m in found.workloads:
                doc = m.model_dump(mode="json", by_alias=True, exclude_unset=True)
                if len(json.dumps(doc)) > MANIFEST_MAX_BYTES:
                    fail(f"{source}: manifest {m.metadata.name} is larger than {human_bytes(MANIFEST_MAX_BYTES)}")
                docs.append((source, doc))
        except ManifestError as e:
            fail(f"{source}: invalid manifest: " + "; ".join(e.problems))
    return _Files(docs, secrets, volumes, buckets, policies)


APPLY_BATCH = 500  # manifests per bulk request (and at most half the gateway's batch byte limit)


def _batches(docs: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = [[]]
    size = 0
    for d in docs:
        n = len(json.dumps(d)) + 2
        if out[-1] and (len(out[-1]) >= APPLY_BATCH or size + n > BATCH_MAX_BYTES // 2):
            out.append([])
            size = 0
        out[-1].append(d)
        size += n
    return out


def apply(
    files: list[Path] = typer.Option(..., "--filename", "-f", help="Manifest file (YAML or JSON; - for stdin) "
                                      "or a folder of them (repeatable)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and show what would change; write nothing."),
    output: str = typer.Option("text", "--output", "-o", help="text, json or yaml."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the trace id of the apply (on stderr "
                                 "with -o json/yaml): find its spans in your tracing backend, and its events with "
                                 "`persysctl events -o json` (fields.traceId). Needs a gateway run with "
                                 "--otlp-endpoint."),
    wait: bool = typer.Option(False, "--wait", help="Then wait until every applied workload is Running (all "
                              "replicas), printing progress on stderr; exit 1 with one line per workload that is "
                              "not (its phase and reason) when one fails for good or at --timeout."),
    timeout: float = typer.Option(120, "--timeout", min=1, help="Seconds --wait waits at most."),
    settle: float = typer.Option(apply_wait.SETTLE_S, "--settle", min=0, max=3600,
                                 help="With --wait: seconds every replica must stay Running with no restart "
                                 "(a crash loop is Running between exits)."),
    server: str | None = ServerOpt,
) -> None:
    """Create or update workloads, secrets, volumes and buckets (`kind: Secret`, `kind: Volume` and
    `kind: Bucket`, applied first, so workloads can use them) from manifests. Idempotent: applying
    twice changes nothing. With --wait, returns once they run (CI: `apply -f app.yaml --wait`)."""
    found = read_files(files)
    docs = found.docs
    api = Api(server)
    secret_results = secret_cmds.apply_secrets(api, found.secrets, dry_run) if found.secrets else []
    secret_results += volume_cmds.apply_volumes(api, found.volumes, dry_run) if found.volumes else []
    secret_results += bucket_cmds.apply_buckets(api, found.buckets, dry_run) if found.buckets else []
    secret_results += automation_cmds.apply_policies(api, found.policies, dry_run) if found.policies else []
    results: list[dict[str, Any]] = []
    if len(docs) > 1 and not dry_run:  # one request; the scheduler writes new workloads in bulk
        for batch in _batches([d for _, d in docs]):
            results += api.request("POST", "/v1/workloads:batch", json=batch)["items"]
    else:
        results = [api.request("POST", "/v1/workloads", params={"dryRun": str(dry_run).lower()}, json=doc)
                   for _source, doc in docs]
    if output == "text":
        for r in results:
            verb = "created" if r["created"] else ("configured" if r["changed"] else "unchanged")
            out.print(f"workload/{r['id']} {verb}{' (dry run)' if dry_run else ''}", highlight=False)
    if output != "text":
        emit(secret_results + results, output)
    if verbose:
        _print_trace(api.trace_id or ctl_tracing.trace_id(), output)
    if wait and not dry_run and results:
        not_running = apply_wait.wait_running(api, [r["id"] for r in results], timeout, settle)
        for line in not_running:
            err_console.print(line, markup=False, highlight=False)
        if not_running:
            raise typer.Exit(1)


def _print_trace(trace_id: str, output: str) -> None:
    line = f"trace {trace_id}" if trace_id else "trace: none (the gateway does not trace: see --otlp-endpoint)"
    (out if output == "text" else err_console).print(line, markup=False, highlight=False)
