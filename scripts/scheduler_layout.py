"""Move persys.scheduler's flat modules into role packages (issue #32, item 3) and rewrite every
reference to them: `git mv` (so history follows), then the import lines, dotted names (logger
names, strings), `scheduler/<module>.py` paths and, in Markdown, `scheduler.<module>` names, across
src/, tests/, bench/, scripts/, docs/, README.md and pyproject.toml. No re-exporting shims.

Idempotent: a second run finds nothing to move and rewrites only references still in the old
layout, so it can be run again after merging a branch written against the flat layout:

    .venv/bin/python scripts/scheduler_layout.py [PACKAGE ...]   # default: every package

then `.venv/bin/ruff check --fix --select I src tests bench scripts` sorts the rewritten imports.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCHED = ROOT / "src" / "persys" / "scheduler"

# old flat module -> new dotted name under persys.scheduler
MOVES: dict[str, str] = {
    "drift": "decide.drift", "liveness": "decide.liveness", "reconcile": "decide.reconcile",
    "shards": "decide.shards",
    "state": "mirror.follower", "mirror_health": "mirror.health", "keys": "mirror.keys",
    "reports": "mirror.reports", "load_window": "mirror.load_window", "quarantine": "mirror.quarantine",
    "group_commit": "interpret.group_commit",
    "volume_rules": "rules.volumes", "volume_steps": "rules.volume_steps", "bucket_rules": "rules.buckets",
    "revisions": "rules.revisions", "failures": "rules.failures",
    "placement_service": "placing.engine_adapter", "whatif_api": "placing.whatif",
    "placement_tracing": "placing.tracing", "queueing_hints": "placing.queueing_hints",
    "views": "views.documents", "view_models": "views.models", "pages": "views.pages",
    "object_changes": "views.changes", "event_trace": "views.event_trace",
    "ha": "ha.election", "takeover": "ha.takeover", "membership": "ha.membership", "mode_guard": "ha.mode_guard",
    "admission": "access.admission", "audit": "access.audit", "token_store": "access.tokens",
    "token_pepper": "access.token_pepper", "join_token_store": "access.join_tokens",
    "cert_registry": "access.certificates", "node_revocations": "access.revocations",
    "node_admission": "access.node_admission", "revoke_rules": "access.revoke_rules",
    "refusal_budget": "access.refusal_budget", "call_budget": "access.call_budget",
    "secret_admission": "access.secret_admission", "workload_policy": "access.workload_policy",
    "shell": "work.shell", "delivery": "work.delivery", "telemetry": "work.telemetry",
    "replica_metrics": "work.metrics", "reconcile_worker": "work.reconcile_worker",
    "node_monitor": "work.node_monitor", "volume_controller": "work.volume_controller",
    "taint_eviction": "work.taint_eviction", "report_queue": "work.report_queue",
    "worker_watch": "work.worker_watch", "placement_commits": "work.placer",
    "preemption_commits": "work.preemption", "instance_move": "work.instance_move",
    "workload_api": "api.workloads", "node_api": "api.nodes", "volume_api": "api.volumes",
    "bucket_api": "api.buckets", "bucket_watch": "api.bucket_watch", "automation_api": "api.automation",
    "automation_lease": "api.automation_lease", "agent_api": "api.agents", "node_volumes": "api.node_volumes",
    "backup": "api.backup", "replay": "api.replay",
    "replica": "replica.assembly", "replica_health": "replica.health", "backends": "replica.backends",
    "backend_probe": "replica.backend_probe", "dependency_probe": "replica.dependency_probe",
    "heap": "replica.heap", "stalls": "replica.stalls",
    "agent_control": "rpc.agent_control", "secret_service": "rpc.secrets",
    "auth_service": "rpc.client.auth", "automation_service": "rpc.client.automation",
    "bucket_service": "rpc.client.buckets", "node_access_service": "rpc.client.node_access",
    "policy_service": "rpc.client.policy", "volume_service": "rpc.client.volumes",
    "watch_service": "rpc.client.watch", "node_certificates": "rpc.node.certificates",
    "join_server": "rpc.node.join_server", "authorization": "rpc.authorization",
    "grpc_status": "rpc.status", "server": "rpc.server", "meter_host": "rpc.meter_host",
}
# Flat modules that only re-exported decide/'s names: removed, their importers point at decide/.
REMOVED = {"drift", "liveness", "reconcile"}
# new package -> its __init__ docstring (what it owns)
PACKAGES: dict[str, str] = {
    "rules": "Decisions outside the step: pure functions over documents and the mirror for volumes (and the\n"
             "steps their records go through), buckets, revision history and failure statuses. Some still\n"
             "answer in store operations (a volume's inline records, a revision's record), for the client and\n"
             "operator writes that do not go through `decide/` yet (issue #32).",
    "placing": "Placement's edge to the model: the adapter between the durable documents and the pure engine\n"
               "(`engine_adapter.PlacementService`: requests from workloads, the base snapshot and the\n"
               "reservation ledger), what-if questions over the current cluster (`whatif`), queueing hints (which\n"
               "Pending instances a node change could help) and the decisions' trace spans. The placer that\n"
               "commits decisions is `work.placer`.",
    "views": "What a replica shows: documents built from the mirror (pure), their typed shapes, pages,\n"
             "which objects a change touches (the watch feed) and which trace an event joins.",
    "ha": "High availability: the elected active replica (store lease), fast takeover after a crash,\n"
          "active-active membership (who serves which node) and the mode guard that freezes the\n"
          "control plane when the store cannot be trusted.",
    "access": "Who may do what, apart from gRPC: API tokens and their pepper, node join tokens, the audit\n"
              "log, issued certificates, node revocations, node admission (what a node may say about\n"
              "itself), input size limits, secret and workload-policy admission, per-node call budgets.\n"
              "The gRPC interceptor that applies them is `rpc.authorization`.",
    "work": "The replica's loops and what they share: the reconcile worker, the placer (with preemption\n"
            "and instance moves, which it finishes), the node monitor, desired-state delivery, the volume\n"
            "controller, taint eviction, the report queue, telemetry and the loops' metrics. `shell` is the\n"
            "narrow protocol the replica lends them and `api/` (so they never import the replica).",
    "api": "What each call does behind the servicers: clients' and operators' changes and reads\n"
           "(workloads, nodes, volumes, buckets, automation policies and the automation lease, backup,\n"
           "replay) and agents' calls (registration, heartbeats, reports, their volumes' attachments and\n"
           "steps). The bucket watch, a loop over the bucket API, sits beside it. Only `node_volumes`\n"
           "touches protobuf: it builds the agents' VolumeTask messages.",
    "replica": "One scheduler replica: its assembly (`assembly.Scheduler`, the shell around the pure step that\n"
               "builds and starts the components), its health document and dependency probes, the backends it\n"
               "opens (and whether they take clients that prove nothing), the heap guard and the event-loop\n"
               "stall watchdog.",
    "rpc": "Every gRPC servicer, by audience (`client/`: persysctl, the gateway, automation; `node/`: nodes\n"
           "joining and renewing their certificate), the authorization interceptor, the mapping of errors to\n"
           "status codes, the meter a scheduler process may host (`meter_host`) and the server that serves\n"
           "them all (`server`). `agent_control` and `secrets` serve both audiences. Only this package (and\n"
           "a few named edges) imports grpc and persys._pb (an import contract in pyproject.toml).",
    "rpc.client": "The servicers clients call (persysctl, the gateway, automation): auth, automation, buckets,\n"
                  "node access, policy, volumes, watch.",
    "rpc.node": "The servicers nodes call before they hold a certificate or to renew it: the join listener,\n"
                "Join and Renew.",
}

TEXT_GLOBS = ("src/**/*.py", "tests/**/*.py", "bench/**/*.py", "scripts/**/*.py", "scripts/*.sh",
              "docs/**/*.md", "README.md", "pyproject.toml", "tests/**/*.txt")


def selected(packages: list[str]) -> dict[str, str]:
    if not packages:
        return dict(MOVES)
    return {old: new for old, new in MOVES.items() if new.split(".")[0] in packages}


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def move_files(moves: dict[str, str]) -> int:
    moved = 0
    for old, new in moves.items():
        src = SCHED / f"{old}.py"
        if not src.exists():
            continue
        moved += 1
        if old in REMOVED:
            git("rm", "-q", str(src.relative_to(ROOT)))
            continue
        dst = SCHED.joinpath(*new.split(".")).with_suffix(".py")
        for depth in range(1, len(new.split("."))):
            pkg = SCHED.joinpath(*new.split(".")[:depth])
            init = pkg / "__init__.py"
            if not init.exists():
                pkg.mkdir(parents=True, exist_ok=True)
                name = ".".join(new.split(".")[:depth])
                init.write_text(f'"""{PACKAGES[name]}"""\n')
                git("add", str(init.relative_to(ROOT)))
        git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)))
    return moved


def _leaves(prefix: str) -> set[str]:
    return {new[len(prefix) + 1:].split(".")[0] for new in MOVES.values() if new.startswith(prefix + ".")}


def _name_pattern(moves: dict[str, str], end: str = r"(?![\w])") -> str:
    """Old module names; an old name that is now a package's name must not match the new layout
    (`persys.scheduler.replica.health` stays, `persys.scheduler.replica.Scheduler` is rewritten;
    a bare `persys.scheduler.replica` is the package and stays)."""
    parts = []
    for old in sorted(moves, key=len, reverse=True):
        guard = ""
        leaves = _leaves(old) if end else set()
        if leaves:
            alt = "|".join(sorted(leaves))
            guard = r"(?!\.(?:" + alt + r")\b)(?![ \t]+import[ \t]+\(?\s*(?:" + alt + r")\b)"
            # the bare name is the package now (a contract's list, a logger name): only an
            # attribute of the old module or an import from it is rewritten
            guard += r"(?=\.\w|[ \t]+import\b)"
        parts.append(re.escape(old) + end + guard)
    return "(" + "|".join(parts) + ")"


FROM_PKG = re.compile(r"^(?P<indent>[ \t]*)from persys\.scheduler import (?P<names>\([^)]*\)|[^\n]+?)"
                      r"(?P<comment>[ \t]*#[^\n]*)?$", re.M)


def _rewrite_from_package(text: str, moves: dict[str, str]) -> str:
    """`from persys.scheduler import a, b as c`: each moved name from its new package (aliased to
    the name the module's body uses), the rest as they were."""
    def one(m: re.Match[str]) -> str:
        indent = m["indent"]
        names = [n.strip() for n in m["names"].strip("()").replace("\n", " ").split(",") if n.strip()]
        kept, lines = [], []
        for n in names:
            mod, _, alias = n.partition(" as ")
            mod, alias = mod.strip(), alias.strip()
            if mod not in moves:
                kept.append(n)
                continue
            parent, _, leaf = moves[mod].rpartition(".")
            target = f"persys.scheduler.{parent}" if parent else "persys.scheduler"
            used = alias or mod
            lines.append(f"{indent}from {target} import {leaf}" + (f" as {used}" if used != leaf else ""))
        if not lines:
            return m.group(0)
        if kept:
            lines.insert(0, f"{indent}from persys.scheduler import {', '.join(kept)}")
        if m["comment"]:
            lines[0] += m["comment"]
        return "\n".join(lines)
    return FROM_PKG.sub(one, text)


def rewrite(path: Path, moves: dict[str, str]) -> bool:
    text = path.read_text()
    names = _name_pattern(moves)
    new = text
    new = re.sub(r"persys\.scheduler\." + names, lambda m: "persys.scheduler." + moves[m[1]], new)
    if path.suffix == ".py":
        new = _rewrite_from_package(new, moves)
    new = re.sub(r"scheduler/" + _name_pattern(moves, "") + r"\.py\b",
                 lambda m: "scheduler/" + moves[m[1]].replace(".", "/") + ".py", new)
    if path.suffix == ".md":
        new = re.sub(r"(?<![\w./])scheduler\." + names, lambda m: "scheduler." + moves[m[1]], new)
    if new != text:
        path.write_text(new)
        return True
    return False


def main(argv: list[str]) -> int:
    moves = selected(argv)
    moved = move_files(moves)
    changed = 0
    me = Path(__file__).resolve()
    for pattern in TEXT_GLOBS:
        for path in sorted(ROOT.glob(pattern)):
            if path.resolve() == me or "_pb" in path.parts or not path.is_file():
                continue
            changed += rewrite(path, moves)
    print(f"moved {moved} module(s); rewrote references in {changed} file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
