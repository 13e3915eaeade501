"""Where a compose workload's compose file comes from: inline YAML written to its directory, a
directory or file on the node used in place, or a fresh clone of a git repository at a ref."""

from __future__ import annotations

import shutil
from pathlib import Path

from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.compose.cli import ComposeCLI, clip
from persys.agent.runtimes.node_paths import NodePaths
from persys.model.workload import ComposeSpec
from persys.policy.paths import git_source_problem

COMPOSE_FILE_NAMES = ("compose.yaml", "compose.yml", "docker-compose.yml", "docker-compose.yaml")


def find_file(directory: Path, name: str, what: str) -> Path:
    if name:
        f = directory / name
        if not f.is_file():
            raise RuntimeFailure(f"{what}: compose file {name!r} not found", code="InvalidSpec", terminal=True)
        return f
    for n in COMPOSE_FILE_NAMES:
        if (directory / n).is_file():
            return directory / n
    raise RuntimeFailure(
        f"{what}: no compose file ({', '.join(COMPOSE_FILE_NAMES)})", code="InvalidSpec", terminal=True
    )


def path_source(path: str, file: str) -> Path:
    p = Path(path)
    if not p.is_absolute():
        raise RuntimeFailure(f"path {path!r} must be absolute", code="InvalidSpec", terminal=True)
    if p.is_dir():
        # Used in place: relative bind mounts, env_file and include resolve against its directory.
        return find_file(p, file, f"path {p}")
    if not p.is_file():
        raise RuntimeFailure(f"path {p} does not exist on this node", code="InvalidSpec", terminal=True)
    if file:
        raise RuntimeFailure(f"path {p} is a file; file applies to a directory", code="InvalidSpec", terminal=True)
    return p


async def git(cli: ComposeCLI, *args: str, cwd: Path) -> str:
    git = shutil.which("git")
    if git is None:
        raise RuntimeFailure("git is not installed on this node")
    rc, out, err = await cli.run([git, *args], cwd=cwd, limit_s=cli.command_timeout)
    if rc != 0:
        raise RuntimeFailure(f"git {args[0]}: {clip(err or out, 500)}")
    return out.strip()


async def checkout(cli: ComposeCLI, spec: ComposeSpec, wdir: Path) -> tuple[Path, str]:
    """A fresh clone of gitRepo at gitRef in `<wdir>/src`; returns (checkout, commit)."""
    assert spec.git_repo
    dest, tmp = wdir / "src", wdir / "src.new"
    shutil.rmtree(tmp, ignore_errors=True)
    # Clone failures are retryable: a git server or the network may come back.
    await git(cli, "clone", "--quiet", "--no-checkout", "--", spec.git_repo, str(tmp), cwd=wdir)
    commit = ""
    # A branch exists only as origin/<ref> after a clone; tags, commits and HEAD resolve as given.
    for cand in (f"origin/{spec.git_ref}", spec.git_ref):
        try:
            commit = await git(cli, "rev-parse", "--verify", "--quiet", f"{cand}^{{commit}}", cwd=tmp)
            break
        except RuntimeFailure:
            continue
    if not commit:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeFailure(
            f"gitRef {spec.git_ref!r} not found in {spec.git_repo}", code="InvalidSpec", terminal=True
        )
    await git(cli, "checkout", "--quiet", "--detach", commit, cwd=tmp)
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return dest, commit


async def materialize(cli: ComposeCLI, spec: ComposeSpec, wdir: Path,
                      node_paths: NodePaths | None = None) -> tuple[Path, str]:
    """The compose file to use (written, found in place, or cloned) and the git commit, if any.

    With `node_paths`, the agent re-checks a `path` and a local git source against the node
    paths it serves, whatever the scheduler admitted."""
    if spec.inline is not None:
        f = wdir / "compose.yaml"
        f.write_text(spec.inline)
        return f, ""
    if spec.path:
        # The resolved path from here on: a symbolic link swapped after the check changes nothing.
        path = str(node_paths.check(spec.path, "compose path")) if node_paths else spec.path
        return path_source(path, spec.file), ""
    assert spec.git_repo
    if node_paths is not None and git_source_problem(spec.git_repo):
        local = spec.git_repo.removeprefix("file://")
        if not local.startswith("/"):  # a transport helper (ext::, fd::) or a relative path
            raise RuntimeFailure(f"gitRepo: {git_source_problem(spec.git_repo)}", code="PolicyViolation",
                                 terminal=True)
        node_paths.check(local, "gitRepo")
    cloned, commit = await checkout(cli, spec, wdir)
    return find_file(cloned, spec.file, f"gitRepo {spec.git_repo}@{spec.git_ref}"), commit
