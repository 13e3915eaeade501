"""QEMU `microvm` machine backend: the microVM backend for hosts without Firecracker.

    qemu-system-x86_64 -M microvm -accel tcg|kvm -nodefaults -no-user-config -nographic -no-reboot
        -kernel vmlinux -append CMDLINE [-initrd FILE] -m MB -smp N
        -chardev file,...,append=on -serial chardev:console      (serial console -> console.log)
        -drive if=none,file=rootfs.qcow2 -device virtio-blk-device (qcow2 overlay on the base image)
        -netdev tap,... -device virtio-net-device                  (per tap device)
        -qmp unix:qmp.sock,server=on,wait=off                     (status, stop, block stats)

`-no-reboot` makes a guest reboot end the VMM, as in Firecracker, so "the guest went away" always
shows as an exited process. The base rootfs is only ever a read-only qcow2 backing file.

The accelerator is KVM only if a KVM guest really runs at native speed (the shared probe in
`runtimes/kvm.py`, on the `microvm` machine with the CPU model guests get). The verdict is worked
out once per boot, QEMU version and host kernel for every agent on the host (`host_verdicts`).

Under TCG a guest's TSC is the host's TSC (QEMU's rdtsc returns host ticks), but the guest kernel
must calibrate it against the PIT, and that fails whenever the host is busy: the kernel then marks
the TSC unstable and hangs before init (3 of 3 boots hung with both host cores loaded, none with the
fix). So TCG guests get `tsc_early_khz=<host TSC rate>` on their command line, measured once here.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import mmap
import os
import platform
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import Probe
from persys.agent.runtimes.host_verdicts import shared_verdict
from persys.agent.runtimes.kvm import KVM_DEADLINE, Accelerator, firmware_runs, kvm_device_problem, write_firmware
from persys.agent.runtimes.microvm.hypervisor import HypervisorError, VMConfig, VMHandle, VMMetrics, VMStatus
from persys.agent.runtimes.microvm.supervise import VMMProcesses, guest_mac, prepare_files, socket_path
from persys.model.status import WorkloadUsage

QCOW2_MAGIC = b"QFI\xfb"

_ACCEL_CACHE_VERSION = 4
_RDTSC = bytes.fromhex("0f31" "48c1e220" "4809d0" "c3")  # rdtsc; shl rdx,32; or rax,rdx; ret


@dataclass(frozen=True)
class Accel:
    accel: str  # "kvm" | "tcg"
    cpu: str = ""  # -cpu model; "" = QEMU's default
    tsc_khz: int = 0  # TCG: the host TSC rate handed to the guest kernel (0: unknown)
    kvm_rejected: bool = False  # /dev/kvm opens, but a KVM guest failed the speed check


def _cpuinfo_khz() -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return round(float(line.split(":")[1]) * 1000)
    return 0


def _tsc_sample(rdtsc: Callable[[], int]) -> tuple[int, int]:
    """(monotonic ns, TSC) read back to back, retried until no preemption fell between the reads."""
    best = (0, 0, 1 << 62)
    for _ in range(20):
        t0, c, t1 = time.perf_counter_ns(), rdtsc(), time.perf_counter_ns()
        if t1 - t0 < best[2]:
            best = ((t0 + t1) // 2, c, t1 - t0)
        if t1 - t0 < 20_000:
            break
    return best[0], best[1]


def host_tsc_khz() -> int:
    """The host's TSC rate in kHz, measured against CLOCK_MONOTONIC over 100 ms.

    /proc/cpuinfo's "cpu MHz" is the current core clock on hosts with frequency scaling, not the
    TSC rate, so it is only the fallback when executable memory is refused (e.g. SELinux execmem).
    """
    if platform.machine() not in ("x86_64", "AMD64"):
        return 0
    try:
        buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError):
        return _cpuinfo_khz()
    try:
        buf.write(_RDTSC)
        cell = ctypes.c_char.from_buffer(buf)
        rdtsc = ctypes.CFUNCTYPE(ctypes.c_uint64)(ctypes.addressof(cell))
        ta, ca = _tsc_sample(rdtsc)
        time.sleep(0.1)
        tb, cb = _tsc_sample(rdtsc)
        del rdtsc, cell  # release the buffer export so the mapping can be closed
        return round((cb - ca) * 1_000_000 / (tb - ta)) if tb > ta and cb > ca else _cpuinfo_khz()
    finally:
        with contextlib.suppress(BufferError):
            buf.close()


def _opt(path: Path) -> str:
    """A path as a QEMU option value: commas separate options there, so they are doubled."""
    return str(path).replace(",", ",,")


def _image_format(path: Path) -> str:
    with open(path, "rb") as f:
        return "qcow2" if f.read(4) == QCOW2_MAGIC else "raw"


class QMPError(Exception):
    pass


class QMPClient:
    """One QMP conversation per call: nothing to keep alive, and any agent instance can talk to any VM.

    QEMU's QMP socket serves one client at a time, so calls to one VM are serialized by a lock.
    """

    def __init__(self, path: Path, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout
        self._lock = asyncio.Lock()

    async def execute(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        async with self._lock:
            return await asyncio.wait_for(self._execute(command, arguments), self.timeout)

    async def _execute(self, command: str, arguments: dict[str, Any] | None) -> Any:
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path))
        except OSError as exc:
            raise QMPError(f"connect {self.path}: {exc}") from exc
        try:
            greeting = await self._read(reader)
            if "QMP" not in greeting:
                raise QMPError(f"unexpected QMP greeting {greeting!r}")
            await self._call(reader, writer, "qmp_capabilities", None)
            return await self._call(reader, writer, command, arguments)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _call(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, command: str, arguments: dict[str, Any] | None
    ) -> Any:
        msg: dict[str, Any] = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        writer.write(json.dumps(msg).encode() + b"\n")
        await writer.drain()
        while True:
            reply = await self._read(reader)
            if "return" in reply:
                return reply["return"]
            if "error" in reply:
                err = reply["error"]
                raise QMPError(f"{command}: {err.get('class')}: {err.get('desc')}")
            # Anything else is an asynchronous event (e.g. POWERDOWN): not our answer.

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> dict[str, Any]:
        line = await reader.readline()
        if not line:
            raise QMPError("QMP connection closed")
        doc = json.loads(line)
        if not isinstance(doc, dict):
            raise QMPError(f"unexpected QMP message {doc!r}")
        return doc


class QemuHypervisor:
    """Boots microVMs with `qemu-system-x86_64 -M microvm`; the backend that needs no Firecracker."""

    name = "qemu"

    def __init__(
        self,
        cache_dir: str | Path,
        *,
        binary: str = "qemu-system-x86_64",
        qemu_img: str = "qemu-img",
        accel: str | None = None,  # "kvm" or "tcg" to skip detection
        start_timeout: float = 10.0,
        qmp_timeout: float = 5.0,
        verdicts: Path | None = None,  # the host's shared probe verdicts (default: host_verdicts.HOST_DIR)
    ) -> None:
        self._cache = Path(cache_dir)
        self._verdicts = verdicts
        self._binary = binary
        self._qemu_img = qemu_img
        self._forced_accel = accel
        self._start_timeout = start_timeout
        self._qmp_timeout = qmp_timeout
        self._procs = VMMProcesses()
        self._qmp: dict[str, QMPClient] = {}
        self._accel: Accel | None = None
        self._version = ""

    # ---- probe ---------------------------------------------------------------------------------

    def _resolve(self, exe: str) -> str | None:
        return shutil.which(exe) if "/" not in exe else (exe if os.access(exe, os.X_OK) else None)

    async def _run(self, *argv: str, limit: float = 10.0) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), limit)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return -1, "timed out"
        return proc.returncode or 0, out.decode(errors="replace")

    async def version(self) -> str:
        if not self._version:
            exe = self._resolve(self._binary)
            if exe is None:
                raise HypervisorError(f"{self._binary} not found")
            rc, out = await self._run(exe, "--version")
            m = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
            if rc != 0 or m is None:
                raise HypervisorError(f"{self._binary} --version failed: {out.strip()[:200]}")
            self._version = m.group(1)
        return self._version

    def _firmware_runs(self, exe: str, accel: Accelerator, cpu: str | None, deadline: float) -> tuple[bool, str]:
        """Boots the shared KVM probe firmware on the microvm machine (see `runtimes/kvm.py`)."""
        fw = write_firmware(self._cache / "accel-probe.bin")
        return firmware_runs(exe, fw, machine="microvm", accel=accel, cpu=cpu, deadline=deadline)

    def _decide(self, exe: str, kvm_usable: bool) -> dict[str, Any]:
        """The accelerator this host's microVMs get, probed (seconds on a nested host). Blocks."""
        if kvm_usable:
            for cpu in ("host", "max"):
                ok, why = self._firmware_runs(exe, "kvm", cpu, KVM_DEADLINE)
                if ok:
                    return asdict(Accel("kvm", cpu))
                if "did not finish" in why:
                    break  # the guest ran, too slowly: nested KVM, whatever the CPU model
        if not self._firmware_runs(exe, "tcg", None, 10.0)[0]:
            raise HypervisorError("qemu cannot run a microvm guest even under TCG")
        return asdict(Accel("tcg", "", host_tsc_khz(), kvm_rejected=kvm_usable))

    async def accelerator(self) -> Accel:
        """KVM when it really works, else TCG (with the host TSC rate). Worked out once per boot
        for every agent on the host (`host_verdicts`)."""
        if self._accel is not None:
            return self._accel
        if self._forced_accel == "kvm":
            self._accel = Accel("kvm", "host")
            return self._accel
        exe = self._resolve(self._binary)
        if exe is None:
            raise HypervisorError(f"{self._binary} not found")
        kvm_usable = not kvm_device_problem() and self._forced_accel != "tcg"
        key = {"v": _ACCEL_CACHE_VERSION, "qemu": exe, "version": await self.version(), "host": platform.release(),
               "kvm": kvm_usable}
        doc = await asyncio.to_thread(shared_verdict, "microvm-accel", key,
                                      functools.partial(self._decide, exe, kvm_usable), self._verdicts)
        try:
            self._accel = Accel(str(doc["accel"]), str(doc["cpu"]), int(doc["tsc_khz"]), bool(doc["kvm_rejected"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise HypervisorError(f"unreadable accelerator verdict {doc!r}: {exc}") from exc
        return self._accel

    async def probe(self) -> Probe:
        try:
            if self._resolve(self._binary) is None:
                return Probe(available=False, reason=f"{self._binary} not found on PATH")
            if self._resolve(self._qemu_img) is None:
                return Probe(available=False, reason=f"{self._qemu_img} not found on PATH (qemu-utils)")
            version = await self.version()
            accel = await self.accelerator()
        except Exception as exc:  # probe must never raise
            return Probe(available=False, reason=f"qemu: {exc}")
        features = (f"qemu:{version}", f"accel:{accel.accel}", *(("kvm:unusable",) if accel.kvm_rejected else ()))
        return Probe(available=True, version=version, features=features)

    # ---- lifecycle -----------------------------------------------------------------------------

    def _paths(self, workdir: Path) -> dict[str, Path]:
        return {
            "disk": workdir / "rootfs.qcow2",
            "console": workdir / "console.log",
            "vmm_log": workdir / "qemu.log",
            "exit": workdir / "exit_code",
            "qmp": socket_path(workdir, "qmp.sock"),
            "console_sock": socket_path(workdir, "console.sock"),
        }

    async def _make_overlay(self, base: Path, overlay: Path) -> None:
        fmt, backing = _image_format(base), str(base)  # absolute: the runtime checked it
        exe = self._resolve(self._qemu_img) or self._qemu_img
        # Over any earlier overlay: qemu-img create replaces the file.
        rc, out = await self._run(exe, "create", "-q", "-f", "qcow2", "-F", fmt, "-b", backing, str(overlay))
        if rc != 0:
            raise HypervisorError(f"qemu-img create overlay on {base}: {out.strip()}")

    def argv(self, cfg: VMConfig, accel: Accel, paths: dict[str, Path]) -> list[str]:
        exe = self._resolve(self._binary) or self._binary
        cmdline = cfg.cmdline
        if accel.accel == "tcg" and accel.tsc_khz and not re.search(r"(^|\s)(tsc_early_khz=|notsc\b)", cmdline):
            cmdline = f"{cmdline} tsc_early_khz={accel.tsc_khz}".strip()
        argv = [
            exe, "-name", f"persys-{cfg.vm_id}",
            "-M", "microvm", "-accel", accel.accel, *(["-cpu", accel.cpu] if accel.cpu else []),
            "-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
            "-m", str(cfg.memory_mb), "-smp", str(cfg.vcpus),
            "-kernel", str(cfg.kernel), "-append", cmdline,
            # The serial port is a socket `persysctl console` attaches to (output nobody reads is
            # dropped there), and everything the guest writes is logged; logappend: a restarted VM
            # adds to the console log instead of wiping the previous boot.
            "-chardev", f"socket,id=console,path={_opt(paths['console_sock'])},server=on,wait=off,"
                        f"logfile={_opt(paths['console'])},logappend=on", "-serial", "chardev:console",
            "-qmp", f"unix:{_opt(paths['qmp'])},server=on,wait=off",
        ]
        if cfg.initrd is not None:
            argv += ["-initrd", str(cfg.initrd)]
        if cfg.rootfs is not None:
            argv += ["-drive", f"id=rootfs,file={_opt(paths['disk'])},format=qcow2,if=none,discard=unmap",
                     "-device", "virtio-blk-device,drive=rootfs"]
        for i, tap in enumerate(cfg.tap_devices):
            argv += ["-netdev", f"tap,id=net{i},ifname={tap},script=no,downscript=no",
                     "-device", f"virtio-net-device,netdev=net{i},mac={guest_mac(cfg.vm_id, i)}"]
        return argv

    async def start(self, cfg: VMConfig) -> VMHandle:
        accel = await self.accelerator()
        paths = self._paths(cfg.workdir)
        if cfg.rootfs is not None and (cfg.fresh_disk or not paths["disk"].exists()):
            await self._make_overlay(cfg.rootfs, paths["disk"])
        prepare_files(paths["console"], f"booting {cfg.vm_id} with qemu/{accel.accel}",
                      remove=(paths["qmp"], paths["console_sock"]))
        handle = await self._procs.launch(
            self.name, cfg, self.argv(cfg, accel, paths), api_socket=paths["qmp"], console_log=paths["console"],
            vmm_log=paths["vmm_log"], exit_file=paths["exit"], disk=paths["disk"] if cfg.rootfs else None,
        )
        handle.detail["accel"] = accel.accel
        try:
            if not await self._procs.wait_socket(handle, self._start_timeout):
                raise HypervisorError(self._procs.failure(handle, "QEMU exited before its QMP socket appeared"))
            status = await self._client(handle).execute("query-status")
            if status.get("status") != "running":
                raise HypervisorError(f"QEMU is {status.get('status')!r} instead of running")
        except HypervisorError:
            await self._procs.kill(handle, grace=0.5)
            raise
        except (QMPError, TimeoutError, OSError) as exc:
            await self._procs.kill(handle, grace=0.5)
            raise HypervisorError(self._procs.failure(handle, f"QMP: {exc!r}")) from exc
        return handle

    def _client(self, handle: VMHandle) -> QMPClient:
        client = self._qmp.get(handle.api_socket)
        if client is None:
            client = self._qmp[handle.api_socket] = QMPClient(Path(handle.api_socket), self._qmp_timeout)
        return client

    async def stop(self, handle: VMHandle, grace: float) -> None:
        if not self._procs.alive(handle):
            await self._procs.kill(handle, grace=0.5)  # stray members of the group, if any
            return
        # ACPI power button first (a guest with acpid/systemd shuts down cleanly), then QEMU's own
        # quit (flushes the qcow2 overlay), then signals.
        with contextlib.suppress(QMPError, TimeoutError, OSError):
            await self._client(handle).execute("system_powerdown")
            if await self._procs.wait_exit(handle, grace):
                return
        with contextlib.suppress(QMPError, TimeoutError, OSError):
            await self._client(handle).execute("quit")
            if await self._procs.wait_exit(handle, 2.0):
                return
        await self._procs.kill(handle, grace=1.0)

    async def inspect(self, handle: VMHandle) -> VMStatus:
        if not self._procs.alive(handle):
            return VMStatus(running=False, exit_code=await self._procs.exit_code_after_exit(handle))
        try:
            status = await self._client(handle).execute("query-status")
            return VMStatus(running=True, detail=str(status.get("status", "")))
        except (QMPError, TimeoutError, OSError) as exc:
            return VMStatus(running=True, detail=f"QMP unavailable: {exc}")

    async def metrics(self, handle: VMHandle) -> VMMetrics:
        cpu_ns, rss = self._procs.usage(handle)
        rd = wr = 0
        with contextlib.suppress(QMPError, TimeoutError, OSError):
            for dev in await self._client(handle).execute("query-blockstats"):
                stats = dev.get("stats", {})
                rd += int(stats.get("rd_bytes", 0))
                wr += int(stats.get("wr_bytes", 0))
        rx, tx = self._procs.net(handle)
        return VMMetrics(cpu_ns, WorkloadUsage(
            memory_bytes=rss, disk_read_bytes=rd, disk_write_bytes=wr, net_rx_bytes=rx, net_tx_bytes=tx))

    def console_log(self, handle: VMHandle) -> Path:
        return Path(handle.console_log)

    def console_socket(self, handle: VMHandle) -> Path:
        return socket_path(Path(handle.console_log).parent, "console.sock")  # as _paths names it

    def files(self, handle: VMHandle) -> list[Path]:
        self._qmp.pop(handle.api_socket, None)
        return [Path(handle.api_socket), self.console_socket(handle)]

    async def close(self) -> None:
        self._procs.forget()  # the VMs keep running; a later agent adopts them

