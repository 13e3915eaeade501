"""Isolation of process workloads, after Nomad's `exec` driver: a user id of its own per workload
and its own PID, IPC and mount namespaces (a private /proc), optionally its own network namespace.

User ids: systemd's DynamicUser is the model. Each workload gets a uid (and the gid of the same
number) from a configured range (systemd's 61184-65519 by default), picked deterministically
from its id (a hash, then the next free one) and recorded twice: in its meta.json, so an agent
restart and adoption keep it, and as a claim file `/run/persys/uids/<uid>` naming the owner
(`cluster-<id>:<agent state>:<workload>`), so two agents on one host, of one cluster or of two,
never hand out the same uid: a uid is the host's, so the claim is keyed by it alone and names the
cluster that holds it (security.cluster_id). Ids the host's user or group tables know are never
taken. Removing the workload releases the claim. A claim written before cluster ids
(`<agent state>:<workload>`) is its workload's still: adopted (rewritten with the cluster) when
that workload claims its uid again.

Namespaces: util-linux `unshare` (PID, IPC, mount with /proc mounted again inside, and network
for `isolated`) starts `tini` as the namespace's init, which runs the command: the init of a PID
namespace ignores every signal it has no handler for (SIGTERM included), tini forwards them, as
Docker's `--init` does. `unshare` itself stays outside, the process the agent supervises
(meta.pid); it exits with the command's status (tini: 128+n for a signal). The agent's start
path does not wait for any of this: the Popen that starts the wrapper returns as before.

The pure parts (allocation, the command line) are functions of their inputs; the claim files
and user tables are the edge (`UidClaims`).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import hashlib
import os
import pwd
import re
import shlex
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from persys.agent.runtimes.base import RuntimeFailure

DYNAMIC_UIDS = (61184, 65519)  # systemd's DynamicUser range (0xEF00-0xFFEF)
CLAIMS_DIR = Path("/run/persys/uids")
Network = Literal["host", "isolated"]
# Brings the loopback up in a fresh network namespace (it starts down), then drops to the
# workload's ids: `unshare --setuid` would do that before the `ip` call, which needs root.
_LO_UP = ('"$1" link set lo up || { echo "persys: cannot bring up the loopback" >&2; exit 125; }; '
          'u=$3 g=$4 setpriv=$2; shift 4; exec "$setpriv" --reuid="$u" --regid="$g" --clear-groups -- "$@"')
# Run as the workload's ids: its environment from the file (env_script), then the command.
_LOAD_ENV = '. "$1" || exit 125; shift; exec "$@"'
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True, slots=True)
class Isolation:
    """What an isolated instance was started with (kept in its meta.json)."""

    uid: int
    gid: int
    network: Network = "host"
    dynamic: bool = True  # the uid is a claim from the range, released on remove

    def to_doc(self) -> dict[str, object]:
        return {"uid": self.uid, "gid": self.gid, "network": self.network, "dynamic": self.dynamic}

    @classmethod
    def from_doc(cls, doc: object) -> Isolation | None:
        if not isinstance(doc, dict):
            return None
        try:
            net = doc.get("network", "host")
            return cls(int(doc["uid"]), int(doc["gid"]), "isolated" if net == "isolated" else "host",
                       bool(doc.get("dynamic", True)))
        except (KeyError, TypeError, ValueError):
            return None


def parse_uid_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (inclusive), both in 1..2^32-2, FIRST <= LAST."""
    first, sep, last = text.partition("-")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit():
        raise ValueError(f"{text!r} is not FIRST-LAST (e.g. 61184-65519)")
    lo, hi = int(first), int(last)
    if not 1 <= lo <= hi <= 2**32 - 2:
        raise ValueError(f"{text!r}: need 1 <= FIRST <= LAST <= {2**32 - 2}")
    return lo, hi


def pick_uid(workload_id: str, uid_range: tuple[int, int], taken: Callable[[int], bool]) -> int | None:
    """The uid for `workload_id`: its hash's place in the range, else the next one `taken` says
    is free (wrapping); None when every id of the range is taken."""
    lo, hi = uid_range
    size = hi - lo + 1
    start = int.from_bytes(hashlib.sha256(workload_id.encode()).digest()[:8], "big") % size
    for i in range(size):
        uid = lo + (start + i) % size
        if not taken(uid):
            return uid
    return None


@functools.cache
def tool(name: str) -> str:
    """An absolute path for `name` (the workload's own PATH, which the command line is started
    with, must not decide which `unshare` runs as root)."""
    for d in ("/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"):
        if os.access(f"{d}/{name}", os.X_OK):
            return f"{d}/{name}"
    return name


def env_script(env: dict[str, str]) -> bytes:
    """The workload's environment as the shell lines `_LOAD_ENV` reads (values quoted: the text
    is data, never code). A name the shell cannot export is refused."""
    lines = []
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise RuntimeFailure(f"spec.process.env: {name[:64]!r} is no environment variable name an isolated "
                                 "process can be given (letters, digits and '_', not starting with a digit)",
                                 code="InvalidSpec", terminal=True)
        if "\0" in value:
            raise RuntimeFailure(f"spec.process.env: the value of {name} holds a NUL byte", code="InvalidSpec",
                                 terminal=True)
        lines.append(f"export {name}={shlex.quote(value)}\n")
    return "".join(lines).encode()


def namespace_argv(command: list[str], iso: Isolation, init: str, env_file: str) -> list[str]:
    """The command line that runs `command` in its own namespaces as iso.uid/iso.gid, with the
    environment in `env_file` (env_script): every step before it runs as root and is started
    with a bare environment, so nothing of the workload's (LD_PRELOAD, GCONV_PATH, ...) ever
    reaches a root process; the workload's ids read it in."""
    base = [tool("unshare"), "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--propagation", "private"]
    # -g: signals go to the command's whole process group
    run = ["/bin/sh", "-c", _LOAD_ENV, "persys-env", env_file, init, "-g", "--", *command]
    if iso.network == "isolated":
        return [*base, "--net", "--", "/bin/sh", "-c", _LO_UP, "persys-net", tool("ip"), tool("setpriv"),
                str(iso.uid), str(iso.gid), *run]
    return [*base, f"--setgid={iso.gid}", f"--setuid={iso.uid}", "--", *run]


def enter_argv(target: int, uid: int, gid: int, command: list[str], env_file: str) -> list[str]:
    """The command line that runs `command` inside the namespaces of `target` (the instance's
    init, a host pid) as uid/gid, in its root and working directory (`--root --wd`: taken from
    the target, so they are its mount namespace's, not ours): `persysctl exec` in an isolated
    process workload."""
    return [tool("nsenter"), f"--target={target}", "--pid", "--mount", "--ipc", "--net", "--root", "--wd",
            f"--setgid={gid}", f"--setuid={uid}", "--", "/bin/sh", "-c", _LOAD_ENV, "persys-env", env_file, *command]


def find_init() -> str | None:
    """A namespace init that forwards signals: tini (Debian's `tini`; Docker ships it as docker-init)."""
    for name in ("tini", "docker-init"):
        path = shutil.which(name)
        if path:
            return path
    return None


def tools_missing() -> list[str]:
    """What isolation needs and this node lacks (empty: it can isolate)."""
    missing = [t for t in ("unshare", "nsenter", "setpriv", "ip") if shutil.which(t) is None]
    return [*missing, *([] if find_init() else ["tini"])]


def _host_knows(uid: int) -> bool:
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except (KeyError, OverflowError):
            pass
    return False


@dataclass(frozen=True, slots=True)
class ClaimHolder:
    """Who a claim file names: the cluster ("" for a claim from before cluster ids), the agent's
    state folder (absolute) and the workload."""

    cluster: str
    state: str
    workload: str

    @classmethod
    def parse(cls, text: str) -> ClaimHolder | None:
        head, sep, workload = text.rpartition(":")
        if not sep or not workload:
            return None
        if head.startswith("/"):  # before cluster ids: `<state>:<workload>`
            return cls("", head, workload)
        scope, sep, state = head.partition(":")
        if not sep or not scope.startswith("cluster-") or not state.startswith("/"):
            return None
        return cls(scope.removeprefix("cluster-"), state, workload)


def claim_text(cluster: str, state: str, workload_id: str) -> str:
    """A claim file's content; without a cluster id, the form from before them."""
    return f"cluster-{cluster}:{state}:{workload_id}" if cluster else f"{state}:{workload_id}"


class UidClaims:
    """Claim files, one per uid handed out on this host: `<dir>/<uid>` holding the owner
    (`cluster-<id>:<agent state>:<workload id>`), created exclusively, so agents sharing a host,
    whatever their cluster, never give one uid to two workloads."""

    def __init__(self, directory: Path, owner_prefix: str, uid_range: tuple[int, int],
                 host_knows: Callable[[int], bool] = _host_knows, cluster_id: str = "") -> None:
        self.dir = directory
        self._prefix = owner_prefix
        self.range = uid_range
        self._host_knows = host_knows
        self.cluster_id = cluster_id

    def _owner(self, workload_id: str) -> str:
        return claim_text(self.cluster_id, self._prefix, workload_id)

    def _legacy_owner(self, workload_id: str) -> str | None:
        """What this workload's claim said before cluster ids (adopted: it is the same agent state
        folder, which one cluster alone may use: agent.state_claim)."""
        return claim_text("", self._prefix, workload_id) if self.cluster_id else None

    def held(self) -> dict[int, ClaimHolder]:
        """Every claim on this host, by uid (a claim file that names no owner is left out)."""
        out: dict[int, ClaimHolder] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in self.dir.iterdir():
                holder = ClaimHolder.parse(self._holder(int(entry.name)) or "") if entry.name.isdigit() else None
                if holder is not None:
                    out[int(entry.name)] = holder
        return out

    def _holder(self, uid: int) -> str | None:
        try:
            return (self.dir / str(uid)).read_text()
        except OSError:
            return None

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One claimant at a time on this host (agents share the folder): a look and a take, or a
        stale claim's removal, are never interleaved with another agent's."""
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def claim(self, workload_id: str, recorded: int | None = None) -> int:
        """The workload's uid: the one it recorded when still (or again) its own, else a new one.
        The workload's directory must exist (a claim without one counts as abandoned)."""
        with self._locked():
            return self._claim(workload_id, recorded)

    def _claim(self, workload_id: str, recorded: int | None) -> int:
        owner = self._owner(workload_id)
        if recorded is not None and (self._holder(recorded) == owner or self._adopt(recorded, workload_id)
                                     or self._take(recorded, owner)):
            return recorded

        mine = {owner, self._legacy_owner(workload_id)}

        def taken(uid: int) -> bool:
            holder = self._holder(uid)
            if holder is not None and holder not in mine and self._abandoned(uid, holder):
                holder = None
            return (holder is not None and holder not in mine) or (holder is None and self._host_knows(uid))

        uid = pick_uid(workload_id, self.range, taken)
        if uid is not None and (self._holder(uid) == owner or self._adopt(uid, workload_id) or self._take(uid, owner)):
            return uid
        raise RuntimeFailure(f"no free uid left in {self.range[0]}-{self.range[1]} for {workload_id} "
                             "(persys agent --process-uids)", code="NoCapacity")

    def _adopt(self, uid: int, workload_id: str) -> bool:
        """This workload's claim from before cluster ids, rewritten to name the cluster."""
        legacy = self._legacy_owner(workload_id)
        if legacy is None or self._holder(uid) != legacy:
            return False
        work = self.dir / f".{uid}.tmp"
        work.write_text(self._owner(workload_id))
        work.chmod(0o600)
        work.replace(self.dir / str(uid))  # under the lock: no claimant sees it missing
        return True

    def _abandoned(self, uid: int, holder: str) -> bool:
        """A claim whose workload directory is gone (its agent's state removed without a remove of
        the workload) frees its uid: nothing of that workload is left to share it with."""
        parsed = ClaimHolder.parse(holder)
        if parsed is None or Path(parsed.state, parsed.workload).exists():
            return False
        with contextlib.suppress(OSError):
            (self.dir / str(uid)).unlink()
        return True

    def _take(self, uid: int, owner: str) -> bool:
        if self._host_knows(uid):
            return False
        try:
            fd = os.open(self.dir / str(uid), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(owner)
        return True

    def release(self, workload_id: str, uid: int) -> None:
        with self._locked():
            if self._holder(uid) in (self._owner(workload_id), self._legacy_owner(workload_id)):
                with contextlib.suppress(OSError):
                    (self.dir / str(uid)).unlink()
