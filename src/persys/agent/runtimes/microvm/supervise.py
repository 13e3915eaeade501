"""Host-side plumbing shared by the hypervisor backends: supervised VMM processes, usage, files.

A VMM (QEMU or Firecracker) runs under a tiny `sh` wrapper that is the leader of its own session
and process group. The wrapper exists only to write the VMM's exit status to a file: the agent may
be restarted while the VM runs, and a later agent that adopted the VM could otherwise never tell a
guest that powered off (exit 0, "Stopped") from a crashed VMM ("Failed"). Process identity,
spawning and termination come from `runtimes/supervision.py`, shared with the process runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from persys.agent.runtimes.microvm.hypervisor import HypervisorError, VMConfig, VMHandle
from persys.agent.runtimes.supervision import (
    children_of,
    is_alive,
    proc_info,
    spawn_session,
    terminate,
    ticks_to_ns,
    wait_until,
)
from persys.agent.runtimes.workdir import mark_start, tail_text

# $1 is the exit-status file, the rest is the VMM's argv; the rename makes the status appear atomically.
_EXIT_WRAPPER = 'f=$1; shift; "$@"; c=$?; echo $c > "$f.tmp" && mv "$f.tmp" "$f"; exit $c'

# sun_path is 108 bytes including the NUL; leave room so deep state dirs still get a socket.
_MAX_SOCKET_PATH = 100


class VMMProcesses:
    """Spawns VMMs under the exit-status wrapper and answers for them by handle.

    Works the same for VMs this instance spawned and for VMs adopted from an earlier agent: every
    check goes through /proc (pid + start time), the only difference being that wrappers we
    spawned ourselves must also be reaped here.
    """

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._exit_waited: set[str] = set()  # exit files already waited for (see exit_code_after_exit)

    def _reap(self) -> None:
        for pid, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[pid]

    async def launch(
        self,
        hypervisor: str,
        cfg: VMConfig,
        argv: list[str],
        *,
        api_socket: Path,
        console_log: Path,
        vmm_log: Path,
        exit_file: Path,
        disk: Path | None,
        vmm_stdout: Path | None = None,
    ) -> VMHandle:
        """Starts `argv`; returns once the VMM process exists. stdout goes to `vmm_stdout` or the VMM log."""
        child = self._spawn(argv, cfg.workdir, exit_file, vmm_stdout or vmm_log, vmm_log)
        handle = VMHandle(
            hypervisor=hypervisor,
            vm_id=cfg.vm_id,
            workdir=str(cfg.workdir),
            wrapper_pid=child.pid,
            wrapper_start_ticks=info.start_ticks if (info := proc_info(child.pid)) else 0,
            vmm_pid=0,
            vmm_start_ticks=0,
            started_at=time.time(),
            api_socket=str(api_socket),
            console_log=str(console_log),
            vmm_log=str(vmm_log),
            disk=str(disk) if disk else "",
            exit_file=str(exit_file),
            taps=list(cfg.tap_devices),
            tap_baseline={t: list(tap_counters(t)) for t in cfg.tap_devices},
        )
        # The VMM is the wrapper's only child; it appears as soon as the shell has forked.
        deadline = time.monotonic() + 5.0
        while True:
            for kid in await asyncio.to_thread(children_of, child.pid):
                info = proc_info(kid)
                if info is not None:
                    handle.vmm_pid, handle.vmm_start_ticks = kid, info.start_ticks
                    return handle
            if child.poll() is not None or time.monotonic() >= deadline:
                raise HypervisorError(self.failure(handle, f"{Path(argv[0]).name} did not start"))
            await asyncio.sleep(0.01)

    def _spawn(
        self, argv: list[str], cwd: Path, exit_file: Path, stdout: Path, stderr: Path
    ) -> subprocess.Popen[bytes]:
        exit_file.unlink(missing_ok=True)
        try:
            wrapped = ["/bin/sh", "-c", _EXIT_WRAPPER, "persys-vmm", str(exit_file), *argv]
            child = spawn_session(wrapped, cwd=cwd, stdout=stdout, stderr=stderr)
        except OSError as exc:
            raise HypervisorError(f"spawn {argv[0]}: {exc}") from exc
        self._children[child.pid] = child
        return child

    def alive(self, handle: VMHandle) -> bool:
        self._reap()
        return is_alive(handle.vmm_pid, handle.vmm_start_ticks)

    def exit_code(self, handle: VMHandle) -> int | None:
        return read_exit_code(Path(handle.exit_file)) if handle.exit_file else None

    async def exit_code_after_exit(self, handle: VMHandle, within: float = 1.0) -> int | None:
        """The exit status of a VMM that is gone. The wrapper records it just after the VMM
        exits, so an observer can be a few milliseconds early: wait for it briefly, once per VMM
        (None if the wrapper itself died, e.g. killed with the agent)."""
        deadline = time.monotonic() + (0.0 if handle.exit_file in self._exit_waited else within)
        self._exit_waited.add(handle.exit_file)
        while True:
            code = self.exit_code(handle)
            if code is not None or not handle.exit_file or time.monotonic() >= deadline:
                return code
            await asyncio.sleep(0.02)

    def failure(self, handle: VMHandle, what: str) -> str:
        """`what` plus the VMM's last words, which usually name the real problem."""
        code = self.exit_code(handle)
        last = tail_text(Path(handle.vmm_log), 5).strip()
        return f"{what}" + (f" (exit code {code})" if code is not None else "") + (f": {last}" if last else "")

    async def wait_socket(self, handle: VMHandle, within: float) -> bool:
        """Waits until the VMM accepts connections on its API socket; False if it died first or
        time ran out. The socket file appears at bind(), a moment before listen(): on a busy host
        a connection in between is refused, so the file alone is not yet an answer."""
        deadline = time.monotonic() + within
        while True:
            if path_exists(handle.api_socket) and await _accepts(handle.api_socket):
                return True
            if not self.alive(handle) or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.02)

    def _gone(self, handle: VMHandle) -> bool:
        return not is_alive(handle.vmm_pid, handle.vmm_start_ticks) and not is_alive(
            handle.wrapper_pid, handle.wrapper_start_ticks
        )

    async def wait_exit(self, handle: VMHandle, within: float) -> bool:
        gone = await wait_until(lambda: self._gone(handle), within)
        self._reap()
        return gone

    async def kill(self, handle: VMHandle, *, grace: float) -> None:
        """SIGTERM the whole group, SIGKILL whatever is left after `grace` seconds."""

        def send(sig: signal.Signals) -> None:
            # The group id is only trusted while the VMM or the wrapper is provably ours (terminate
            # asks `_gone` first): a pgid cannot be reused while a member lives, but after that it
            # may name a stranger's group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(handle.wrapper_pid, sig)
            if self.alive(handle):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(handle.vmm_pid, sig)

        await terminate(send, lambda: self._gone(handle), grace=grace)
        self._reap()

    def usage(self, handle: VMHandle) -> tuple[int, int]:
        """(cpu ns, resident bytes) of the VMM: its RSS includes the guest memory it touched."""
        info = proc_info(handle.vmm_pid) if self.alive(handle) else None
        if info is None:
            return 0, 0
        return ticks_to_ns(info.cpu_ticks), info.rss_bytes

    def net(self, handle: VMHandle) -> tuple[int, int]:
        rx = tx = 0
        for tap in handle.taps:
            now_rx, now_tx = tap_counters(tap)
            base = handle.tap_baseline.get(tap, [0, 0])
            # A tap re-created since boot restarts from 0: count from there.
            rx += now_rx - base[0] if now_rx >= base[0] else now_rx
            tx += now_tx - base[1] if now_tx >= base[1] else now_tx
        return rx, tx

    def forget(self) -> None:
        """Drops the reaping duty for our children (agent shutdown): the VMs keep running."""
        self._children.clear()


async def _accepts(path: str) -> bool:
    try:
        _, writer = await asyncio.open_unix_connection(path)
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


def read_exit_code(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def socket_path(workdir: Path, name: str) -> Path:
    """`workdir/name`, or a short path in the temp dir when that would not fit in sun_path."""
    path = workdir / name
    if len(str(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"persys-vm-{digest}-{name}"


def guest_mac(vm_id: str, index: int) -> str:
    """A stable, locally administered unicast MAC per VM and interface."""
    d = hashlib.sha256(f"{vm_id}/{index}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in d[:5])


def path_exists(path: str | Path) -> bool:
    return os.path.exists(path)


def prepare_files(
    console_log: Path, banner: str, *, remove: tuple[Path, ...] = (), touch: tuple[Path, ...] = ()
) -> None:
    """Clears stale files (an old socket makes a VMM refuse to start), creates the ones the VMM opens
    but will not create, and marks the new boot in the console log."""
    for p in (*remove, *touch):
        p.unlink(missing_ok=True)
    for p in touch:
        p.touch()
    mark_start(console_log, banner)


def tap_counters(tap: str) -> tuple[int, int]:
    """(guest rx, guest tx) bytes of a tap: the host side's tx is what the guest received."""
    base = Path("/sys/class/net") / tap / "statistics"
    try:
        return int((base / "tx_bytes").read_text()), int((base / "rx_bytes").read_text())
    except (OSError, ValueError):
        return 0, 0


async def clone_file(src: Path, dst: Path) -> None:
    """A private copy-on-write copy where the filesystem can reflink, else a sparse full copy."""
    # --remove-destination: never write through into an old copy that may still be open elsewhere.
    proc = await asyncio.create_subprocess_exec(
        "cp", "--reflink=auto", "--sparse=always", "--remove-destination", str(src), str(dst),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise OSError(f"copy {src} -> {dst}: {err.decode(errors='replace').strip()}")
