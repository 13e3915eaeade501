"""Process runtime: a supervised host command (like Nomad's raw_exec), the runtime that works everywhere.

Each workload is one process started in its own session/process group, with its output in
`<state_dir>/process/<id>/stdout.log` and its identity in `meta.json` (pid, pgid and the kernel's
start time of the pid, so a recycled pid is never mistaken for ours). The process outlives the
agent on purpose: a restarted agent reads meta.json and adopts it instead of starting a duplicate.
Limits use cgroup v1 when the hierarchy is writable; otherwise the command runs unlimited.
The work directories and process supervision are the shared bases in `workdir.py` and
`supervision.py` (the microVM runtime's VMMs use the same).

Over 500 lines on purpose: one runtime class whose sections (state files, liveness, usage,
the Runtime API) share the per-instance records and the children it spawned. Cgroups,
isolation, exec and terminals, supervision, cgroup limit arithmetic and work directories are
modules of their own (process_cgroups, process_isolation, process_exec, supervision,
cgroup_limits, workdir).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import platform
import re
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
    VolumeMount,
)
from persys.agent.runtimes.cgroup_limits import agent_cgroup_name
from persys.agent.runtimes.cpu_sampler import CpuSampler
from persys.agent.runtimes.exec_output import ExecOutput
from persys.agent.runtimes.log_stream import LogQuery, file_stream
from persys.agent.runtimes.log_times import NotingTask
from persys.agent.runtimes.process_cgroups import ProcessCgroups, read_int
from persys.agent.runtimes.process_exec import Isolated, ProcessTerminal, exec_in_process, open_process_tty
from persys.agent.runtimes.process_isolation import (
    CLAIMS_DIR,
    DYNAMIC_UIDS,
    Isolation,
    UidClaims,
    env_script,
    find_init,
    namespace_argv,
    tools_missing,
)
from persys.agent.runtimes.run_as import DEFAULT_WORKLOAD_USER, RunAs, resolve_user
from persys.agent.runtimes.secret_files import remove_secret_files, secrets_root, write_secret_files
from persys.agent.runtimes.supervision import (
    descendants,
    group_members,
    is_alive,
    proc_info,
    spawn_session,
    terminate,
    ticks_to_ns,
)
from persys.agent.runtimes.workdir import WorkDirs, mark_start, tail_text

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Moves itself into the cgroups and then execs the command, so the command is limited from its
# very first instruction. A shell wrapper instead of preexec_fn: preexec_fn is unsafe in a
# threaded process (asyncio.to_thread workers), a tiny sh is not. It writes 0 (itself) to each
# cgroup's `tasks`: a thread moving itself skips the cgroup core's global lock, whose write side
# waits for an RCU grace period (a pid written to cgroup.procs: 5-11 ms of every start here,
# ~0.2 ms this way). The shell has one thread, so that moves the whole process.
_CGROUP_WRAPPER = 'while [ "$1" != "--" ]; do echo 0 > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass
class ProcessMeta:
    workload_id: str
    revision: str
    generation: int
    command: list[str]
    pid: int
    pgid: int
    start_ticks: int  # /proc/<pid>/stat field 22: defends against pid reuse
    started_at: float
    cgroups: list[str] = field(default_factory=list)
    exit_code: int | None = None
    finished_at: float = 0.0
    stopped_by_agent: bool = False
    # Isolation.to_doc() of an instance started in namespaces of its own (None: a host process,
    # as every instance before isolation was).
    isolation: dict[str, object] | None = None


class ProcessRuntime:
    """Runs `type: process` workloads as supervised host processes."""

    name = "process"

    def __init__(
        self,
        state_dir: str | Path,
        *,
        grace_seconds: float = 5.0,
        cgroup_root: str | Path = "/sys/fs/cgroup",
        cgroup_parent: str = "persys",
        use_cgroups: bool | None = None,  # None: use them when writable
        agent_id: str = "",  # the node id: cgroups are <parent>/<cluster>-<agent>/<instance>, never shared
        # The cluster's id (security.cluster_id), in cgroup and secret folder names: two clusters
        # on one host, even with nodes named alike, never meet (issue #31).
        cluster_id: str = "",
        # Who runs a process whose spec names no user: "" is a uid of its own from `uid_range`
        # where the agent isolates workloads, else DEFAULT_WORKLOAD_USER.
        workload_user: str = "",
        isolate: bool | None = None,  # own uid and namespaces; None: wherever the agent is root and can
        uid_range: tuple[int, int] = DYNAMIC_UIDS,
        uid_claims: str | Path = CLAIMS_DIR,
    ) -> None:
        self._dir = Path(state_dir) / "process"
        self._dirs = WorkDirs(self._dir, ProcessMeta)
        self._secrets = secrets_root(self._dir.parent / "process-secrets", self._dir, cluster_id)
        # Where instances started before cluster ids keep their secret files until they stop.
        self._legacy_secrets = secrets_root(self._dir.parent / "process-secrets", self._dir)
        self._workload_user = workload_user
        self._missing = tools_missing() if os.geteuid() == 0 else ["a root agent"]
        self._isolate = not self._missing if isolate is None else isolate
        if self._isolate and self._missing:
            raise RuntimeFailure(f"process isolation needs {', '.join(self._missing)}")
        self._init = find_init() or "tini"
        self._claims = UidClaims(Path(uid_claims), str(self._dir.resolve()), uid_range, cluster_id=cluster_id)
        self._grace = grace_seconds
        agent_dir = agent_cgroup_name(agent_id, str(self._dir.resolve()), cluster_id)
        self._cg = ProcessCgroups(Path(cgroup_root), f"{cgroup_parent}/{agent_dir}")
        self._cgroups = self._cg.writable() if use_cgroups is None else use_cgroups
        self._children: dict[str, subprocess.Popen[bytes]] = {}  # only the ones we spawned ourselves
        self._cpu = CpuSampler(settle=0.1)
        self._io_high: dict[str, tuple[int, int]] = {}  # per instance: disk bytes read, written (high-water)
        self._lock = asyncio.Lock()
        self._log_clock = NotingTask(lambda: [self._wdir(i) / "stdout.log" for i in self._dirs.ids()],
                                     "process output")  # when output appeared: logs --since / --timestamps

    @property
    def cgroups_enabled(self) -> bool:
        return self._cgroups

    @property
    def cgroup_parent(self) -> str:
        """This agent's cgroup directory under each controller (`persys/<cluster>-<agent>`)."""
        return self._cg.parent

    # ---- cgroups (process_cgroups) ------------------------------------------------------------

    def _meta_cg_dirs(self, meta: ProcessMeta) -> dict[str, Path]:
        return self._cg.recorded_dirs(meta.cgroups, meta.workload_id)

    def _cgroup_pids(self, meta: ProcessMeta) -> list[int]:
        return self._cg.pids(meta.cgroups, meta.workload_id)

    # ---- state files ---------------------------------------------------------------------------

    def _wdir(self, workload_id: str) -> Path:
        return self._dirs.path(workload_id)

    def _load(self, workload_id: str) -> ProcessMeta | None:
        return self._dirs.load(workload_id)

    def _save(self, meta: ProcessMeta) -> None:
        self._dirs.save(meta)
        with contextlib.suppress(OSError):  # its command line and ids: the agent's, not other workloads'
            (self._wdir(meta.workload_id) / "meta.json").chmod(0o600)

    # ---- liveness ------------------------------------------------------------------------------

    def _alive(self, meta: ProcessMeta) -> bool:
        child = self._children.get(meta.workload_id)
        if child is not None and child.pid == meta.pid:
            code = child.poll()  # reaps our own child, so its exit code is known
            if code is None:
                return True
            if meta.exit_code is None:
                meta.exit_code = code
                meta.finished_at = meta.finished_at or time.time()
                self._save(meta)
            return False
        return is_alive(meta.pid, meta.start_ticks)

    def _observe(self, meta: ProcessMeta) -> ObservedWorkload:
        obs = ObservedWorkload(
            workload_id=meta.workload_id,
            revision=meta.revision,
            generation=meta.generation,
            state=RuntimeState.RUNNING,
            runtime_id=str(meta.pid),
            started_at=meta.started_at,
        )
        if self._alive(meta):
            return obs
        obs.exit_code = meta.exit_code
        if meta.stopped_by_agent:
            obs.state = RuntimeState.STOPPED
            obs.message = "stopped by agent"
        elif meta.exit_code is None:
            # Not our child (agent restarted meanwhile): it ended on its own, code unknown.
            obs.state = RuntimeState.FAILED
            obs.message = "process exited; exit code unknown"
        elif meta.exit_code == 0:
            obs.state = RuntimeState.STOPPED
            obs.message = "exited with code 0"
        else:
            obs.state = RuntimeState.FAILED
            obs.message = (
                f"killed by signal {-meta.exit_code}" if meta.exit_code < 0 else f"exited with code {meta.exit_code}"
            )
        return obs

    # ---- usage ---------------------------------------------------------------------------------

    def _members(self, meta: ProcessMeta) -> set[int]:
        """The instance's processes found without cgroups: its process group and, isolated, what
        runs under it (the namespace's init puts the command in a process group of its own)."""
        members = set(group_members(meta.pgid))
        if meta.isolation is not None and self._alive(meta):
            members.update(descendants(meta.pid))
        return members

    def _cpu_ns(self, meta: ProcessMeta) -> int:
        dirs = self._meta_cg_dirs(meta)
        if (self._cgroups or meta.cgroups) and "cpuacct" in dirs:
            v = read_int(dirs["cpuacct"] / "cpuacct.usage")
            if v is not None:
                return v
        return ticks_to_ns(sum(info.cpu_ticks for pid in self._members(meta) if (info := proc_info(pid))))

    def _memory(self, meta: ProcessMeta) -> int:
        dirs = self._meta_cg_dirs(meta)
        if (self._cgroups or meta.cgroups) and "memory" in dirs:
            v = read_int(dirs["memory"] / "memory.usage_in_bytes")
            if v is not None:
                return v
        total = 0
        for pid in self._members(meta):
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        return total

    def _disk_io(self, meta: ProcessMeta) -> tuple[int, int]:
        """Bytes the instance's processes made the kernel read from and write to storage
        (/proc/<pid>/io, every process of its group and cgroup). A process that exits takes its
        figures with it: the high-water mark keeps the counters from going backwards. Network I/O
        is not measured: a host process shares the node's network namespace."""
        rd = wr = 0
        for pid in self._members(meta) | set(self._cgroup_pids(meta)):
            with contextlib.suppress(OSError, ValueError):
                fields = dict(line.split(": ", 1) for line in Path(f"/proc/{pid}/io").read_text().splitlines())
                rd += int(fields.get("read_bytes", 0))
                wr += int(fields.get("write_bytes", 0))
        high = self._io_high.get(meta.workload_id, (0, 0))
        high = (max(rd, high[0]), max(wr, high[1]))
        self._io_high[meta.workload_id] = high
        return high

    async def _add_usage(self, meta: ProcessMeta, obs: ObservedWorkload) -> None:
        obs.usage.memory_bytes = self._memory(meta)
        obs.usage.disk_read_bytes, obs.usage.disk_write_bytes = self._disk_io(meta)

        async def read_again() -> int:
            return self._cpu_ns(meta)

        obs.usage.cpu_percent = await self._cpu.percent(meta.workload_id, self._cpu_ns(meta), read_again)

    # ---- Runtime API ---------------------------------------------------------------------------

    async def probe(self) -> Probe:
        try:
            proc = await asyncio.to_thread(
                subprocess.run, ["/bin/sh", "-c", "exit 0"], start_new_session=True, timeout=5, check=True
            )
            del proc
            self._dir.mkdir(parents=True, exist_ok=True)
        except Exception as exc:  # probe must never raise
            return Probe(available=False, reason=f"cannot spawn processes: {exc}")
        features = ("process-group", "cgroups:v1" if self._cgroups else "cgroups:none",
                    "isolation:namespaces" if self._isolate else "isolation:none")
        return Probe(available=True, version=f"linux-{platform.release()}", features=features)

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        spec = w.spec.process
        if w.spec.type != "process" or spec is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not a process", code="InvalidSpec", terminal=True)
        wdir = self._wdir(w.workload_id)
        async with self._lock:
            meta = self._load(w.workload_id)
            if meta is not None and self._alive(meta):
                if meta.revision == w.revision:
                    return self._observe(meta)  # adopt: never restart the desired revision
                await self._stop_locked(w.workload_id)
            return self._spawn(w, wdir)

    def _env_dir(self, workload_id: str) -> Path:
        """Where an isolated instance's environment waits for its ids to read it (and an exec's):
        beside its secret files, on the same tmpfs, as private (a name no workload id has)."""
        return self._secrets / f".env-{workload_id}"

    @property
    def isolates(self) -> bool:
        return self._isolate

    def _isolation(self, w: RuntimeWorkload) -> tuple[RunAs, Isolation | None]:
        """Who the instance runs as and, isolated, with what (a terminal failure where the spec
        asks for what this node cannot give)."""
        spec = w.spec.process
        assert spec is not None
        if not self._isolate:
            if spec.network == "isolated":
                raise RuntimeFailure(f"spec.process.network: isolated needs {', '.join(self._missing)} on this "
                                     "node", code="InvalidSpec", terminal=True)
            return resolve_user(spec.user, self._workload_user or DEFAULT_WORKLOAD_USER), None
        network = spec.network or "host"
        if spec.user is None and not self._workload_user:
            old = self._load(w.workload_id)
            recorded = Isolation.from_doc(old.isolation) if old is not None else None
            uid = self._claims.claim(w.workload_id, recorded.uid if recorded and recorded.dynamic else None)
            return RunAs(uid, uid, str(uid)), Isolation(uid, uid, network, dynamic=True)
        run_as = resolve_user(spec.user, self._workload_user)
        return run_as, Isolation(run_as.uid, run_as.gid, network, dynamic=False)

    def _spawn(self, w: RuntimeWorkload, wdir: Path) -> ObservedWorkload:
        spec = w.spec.process
        assert spec is not None
        env = {"PATH": DEFAULT_PATH, **spec.env, **w.secrets.env_text()}
        self._dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        self._dir.chmod(0o711)  # others pass through to their own work/, list nothing
        wdir.mkdir(mode=0o711, exist_ok=True)
        wdir.chmod(0o711)
        run_as, iso = self._isolation(w)
        try:
            return self._spawn_as(w, wdir, env, run_as, iso)
        except BaseException:
            # A start that never got as far as a record keeps no uid: nothing would free it (the
            # agent removes only what its runtimes list). A retry picks the same one again.
            if iso is not None and iso.dynamic and self._load(w.workload_id) is None:
                self._claims.release(w.workload_id, iso.uid)
            raise

    def _spawn_as(self, w: RuntimeWorkload, wdir: Path, env: dict[str, str], run_as: RunAs,
                  iso: Isolation | None) -> ObservedWorkload:
        spec = w.spec.process
        assert spec is not None
        if w.spec.secrets is not None and w.spec.secrets.files:
            owner = (run_as.uid, run_as.gid) if run_as.switches else (None, None)
            env["PERSYS_SECRETS_DIR"] = str(write_secret_files(self._secrets / w.workload_id, w.secrets.files,
                                                               *owner))
        env.update(volume_env(w.mounts, run_as.uid if run_as.switches else None, run_as.gid))
        # The default working directory is the process's own (`work/`), never the agent's files.
        cwd = spec.working_dir or str(self._work_dir(wdir, run_as.uid, run_as.gid, run_as.switches))
        if not Path(cwd).is_dir():
            raise RuntimeFailure(f"working dir {cwd!r} does not exist", code="InvalidSpec", terminal=True)
        exe = spec.command[0]
        # Resolve here because with the cgroup wrapper a missing binary would only be an exit 127.
        resolved = shutil.which(exe, path=env["PATH"]) if "/" not in exe else exe
        if resolved is None or not os.access(Path(cwd, resolved), os.X_OK):
            raise RuntimeFailure(f"command {exe!r} not found or not executable", code="InvalidSpec", terminal=True)
        cg_tasks = self._cg.setup(w) if self._cgroups else []
        if run_as.switches and iso is None:  # the wrapper moves itself in after the switch: it needs write access
            for tasks in cg_tasks:
                os.chown(tasks, run_as.uid, run_as.gid)
                # cgroup.procs alike: what an exec goes by (_exec_cgroups), as agents before handed it over
                os.chown(Path(tasks).with_name("cgroup.procs"), run_as.uid, run_as.gid)
        if iso is None:
            argv, popen_env = list(spec.command), env
        else:
            owner = (run_as.uid, run_as.gid) if run_as.switches else (None, None)
            env_file = write_secret_files(self._env_dir(w.workload_id), {"environment": env_script(env)}, *owner)
            argv = namespace_argv(list(spec.command), iso, self._init, str(env_file / "environment"))
            popen_env = {"PATH": DEFAULT_PATH}  # the root steps' own: nothing of the workload's
        if cg_tasks:
            argv = ["/bin/sh", "-c", _CGROUP_WRAPPER, "persys-exec", *cg_tasks, "--", *argv]
        log = wdir / "stdout.log"
        mark_start(log, f"starting revision {w.revision}")
        log.chmod(0o600)  # the agent's (root's): another workload never reads it
        # Isolated: started as root (unshare needs it; it drops to the workload's ids itself).
        switch = run_as.popen_kwargs() if iso is None else {}
        try:
            child = spawn_session(argv, cwd=cwd, stdout=log, env=popen_env, **switch)
        except OSError as exc:
            raise RuntimeFailure(f"spawn {exe!r}: {exc}", code="InvalidSpec", terminal=True) from exc
        info = proc_info(child.pid)
        meta = ProcessMeta(
            workload_id=w.workload_id,
            revision=w.revision,
            generation=w.generation,
            command=list(spec.command),
            pid=child.pid,
            pgid=child.pid,
            start_ticks=info.start_ticks if info else 0,
            started_at=time.time(),
            cgroups=[str(Path(p).parent) for p in cg_tasks],
            isolation=iso.to_doc() if iso is not None else None,
        )
        self._children[w.workload_id] = child
        self._cpu.forget(w.workload_id)
        self._io_high.pop(w.workload_id, None)
        self._save(meta)
        return self._observe(meta)

    @staticmethod
    def _work_dir(wdir: Path, uid: int, gid: int, chown: bool) -> Path:
        work = wdir / "work"
        work.mkdir(mode=0o700, exist_ok=True)
        if chown:
            os.chown(work, uid, gid)
        return work

    def _signal_all(self, meta: ProcessMeta, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(meta.pgid, sig)
        # Processes that left the group (setsid) are still caught by their cgroup.
        for pid in self._cgroup_pids(meta):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def _all_gone(self, meta: ProcessMeta) -> bool:
        self._alive(meta)  # reaps our own child so it does not linger as a zombie
        return not group_members(meta.pgid) and not self._cgroup_pids(meta)

    async def _stop_locked(self, workload_id: str) -> None:
        meta = self._load(workload_id)
        if meta is None:
            return
        # The pgid is only trusted while its leader is provably ours (pid + start time).
        leader_ours = self._alive(meta)
        if leader_ours or self._cgroup_pids(meta):
            if leader_ours:
                meta.stopped_by_agent = True
                self._save(meta)
            await terminate(functools.partial(self._signal_all, meta), functools.partial(self._all_gone, meta),
                            grace=self._grace)
        child = self._children.pop(workload_id, None)
        if child is not None and child.pid == meta.pid:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = child.wait(timeout=0.5)
                meta.exit_code = meta.exit_code if meta.exit_code is not None else code
        meta.finished_at = meta.finished_at or time.time()
        self._save(meta)
        self._cg.remove(meta.cgroups, meta.workload_id)
        self._remove_secrets(workload_id)  # values live only while it runs

    def _remove_secrets(self, workload_id: str) -> None:
        """Its secret files and environment, also where an agent before cluster ids wrote them."""
        for root in dict.fromkeys((self._secrets, self._legacy_secrets)):
            remove_secret_files(root / workload_id)
            remove_secret_files(root / f".env-{workload_id}")

    async def stop(self, workload_id: str) -> None:
        async with self._lock:
            await self._stop_locked(workload_id)

    async def remove(self, workload_id: str) -> None:
        async with self._lock:
            await self._stop_locked(workload_id)
            self._remove_secrets(workload_id)
            meta = self._load(workload_id)
            iso = Isolation.from_doc(meta.isolation) if meta is not None else None
            if iso is not None and iso.dynamic:
                self._claims.release(workload_id, iso.uid)  # its files go with its directory below
            self._dirs.remove(workload_id)
            self._cpu.forget(workload_id)
            self._io_high.pop(workload_id, None)

    async def list(self) -> list[ObservedWorkload]:
        self._log_clock.ensure()  # the agent lists every pass: from the first, the clock runs
        out = []
        for workload_id in self._dirs.ids():
            meta = self._load(workload_id)
            if meta is not None:
                out.append(self._observe(meta))
        return out

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        meta = self._load(workload_id)
        if meta is None:
            return None
        obs = self._observe(meta)
        if obs.state is RuntimeState.RUNNING:
            await self._add_usage(meta, obs)
        return obs

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        return await asyncio.to_thread(tail_text, self._wdir(workload_id) / "stdout.log", tail)

    def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        return file_stream(self._wdir(workload_id) / "stdout.log", query, "a process's output", timed=True)

    async def exec(self, workload_id: str, command: Sequence[str], *, service: str, kill_after: float,
                   stdin: bytes = b"") -> ExecOutput:
        """Run `command` on the node in the running instance's environment, user and cgroups."""
        meta = self._running(workload_id, service)
        return await exec_in_process(meta.pid, self._exec_cgroups(meta), _CGROUP_WRAPPER, command, kill_after, stdin,
                                     isolated=self._entered(meta))

    async def open_terminal(self, workload_id: str, command: Sequence[str], *, service: str, cols: int,
                            rows: int) -> ProcessTerminal:
        """`command` on a TTY on the node in the running instance's environment, user and cgroups."""
        meta = self._running(workload_id, service)
        return await open_process_tty(meta.pid, self._exec_cgroups(meta), _CGROUP_WRAPPER, command, cols, rows,
                                      isolated=self._entered(meta))

    def _entered(self, meta: ProcessMeta) -> Isolated | None:
        """How an exec enters an isolated instance (None: a host process, as before isolation)."""
        iso = Isolation.from_doc(meta.isolation) if meta.isolation is not None else None
        if iso is None:
            return None
        env = self._env_dir(meta.workload_id)
        legacy = self._legacy_secrets / env.name  # an instance started before cluster ids: its own file
        if not env.exists() and legacy.exists():
            env = legacy
        return Isolated(iso.uid, iso.gid, self._init, str(env / "environment"))

    def _running(self, workload_id: str, service: str) -> ProcessMeta:
        """The meta of a running instance to exec in; RuntimeFailure saying why there is none."""
        if service:
            raise RuntimeFailure("--service names a compose service; this is a process", code="InvalidArgument")
        meta = self._load(workload_id)
        if meta is None:
            raise RuntimeFailure(f"{workload_id} has no process on this node", code="NotFound")
        if not self._alive(meta):
            raise RuntimeFailure(f"{workload_id} is not running ({self._observe(meta).message})", code="NotRunning")
        return meta

    def _exec_cgroups(self, meta: ProcessMeta) -> Sequence[str]:
        """The `tasks` files an exec'd command's wrapper writes itself to, owned as the instance's
        cgroup.procs is: an instance started by an older agent handed over only that file."""
        if not meta.cgroups:
            return []
        out = []
        for d in self._meta_cg_dirs(meta).values():
            with contextlib.suppress(OSError):  # gone or unreadable: the wrapper's write says so
                owner = (d / "cgroup.procs").stat()
                if (d / "tasks").stat().st_uid != owner.st_uid:
                    os.chown(d / "tasks", owner.st_uid, owner.st_gid)
            out.append(str(d / "tasks"))
        return out

    async def close(self) -> None:
        # Deliberately leaves processes running: they belong to the node, not to this agent process.
        self._children.clear()
        await self._log_clock.close()


def volume_env(mounts: tuple[VolumeMount, ...], uid: int | None, gid: int) -> dict[str, str]:
    """A host process has no mount namespace of its own: each mounted volume is handed over as
    PERSYS_VOLUME_<NAME> (its directory on the node), owned by the user the process runs as."""
    env = {}
    for m in mounts:
        if not m.attachment.mount_path:
            raise RuntimeFailure(f"volume {m.name}: a process needs a mounted directory, not a disk",
                                 code="InvalidSpec", terminal=True)
        if uid is not None and not m.read_only:
            os.chown(m.attachment.mount_path, uid, gid)
        env["PERSYS_VOLUME_" + re.sub(r"[^A-Za-z0-9]", "_", m.name).upper()] = m.attachment.mount_path
    return env

