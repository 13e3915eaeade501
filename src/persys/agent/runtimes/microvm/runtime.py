"""MicroVM runtime: `type: microvm` workloads as lightweight VMs behind a hypervisor backend.

Each workload has `<state_dir>/microvm/<id>/` holding meta.json (revision, backend, VMHandle), the
private disk copy, the console log and the VMM's sockets and logs. Like the process runtime, VMs
outlive the agent on purpose: a restarted agent reads meta.json and adopts the running VMM.
Shared caches (unpacked kernels, the accelerator probe) live in `<state_dir>/microvm-cache/`,
outside the per-workload directories, so no workload name can collide with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from persys.agent.runtimes.base import ObservedWorkload, Probe, RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.cpu_sampler import CpuSampler
from persys.agent.runtimes.log_stream import LogQuery, file_stream
from persys.agent.runtimes.log_times import NotingTask
from persys.agent.runtimes.microvm.console import ConsoleSockets, SocketConsole
from persys.agent.runtimes.microvm.firecracker import FirecrackerHypervisor
from persys.agent.runtimes.microvm.hypervisor import Hypervisor, HypervisorError, VMConfig, VMHandle
from persys.agent.runtimes.microvm.kernel import KernelFormatError, ensure_elf_kernel
from persys.agent.runtimes.microvm.qemu import QemuHypervisor
from persys.agent.runtimes.node_paths import NodePaths
from persys.agent.runtimes.workdir import WorkDirs, tail_text
from persys.model.vm_spec import MicroVMSpec
from persys.security.private_files import private_dir

# Preference order for `hypervisor: auto`: Firecracker whenever it is installed.
AUTO_ORDER = ("firecracker", "qemu")


@dataclass
class MicroVMMeta:
    workload_id: str
    revision: str
    generation: int
    hypervisor: str
    handle: dict[str, Any]
    stopped_by_agent: bool = False
    exit_code: int | None = None
    finished_at: float = 0.0


class MicroVMRuntime:
    """Runs `type: microvm` workloads with Firecracker or QEMU's `microvm` machine."""

    name = "microvm"

    def __init__(
        self,
        state_dir: str | Path,
        *,
        grace_seconds: float = 10.0,
        hypervisors: Mapping[str, Hypervisor] | None = None,
        node_paths: NodePaths | None = None,  # the agent's re-check of kernel, initrd and rootfs paths
    ) -> None:
        self._dir = Path(state_dir) / "microvm"
        self._dirs = WorkDirs(self._dir, MicroVMMeta)
        self._node_paths = node_paths
        self._cache = Path(state_dir) / "microvm-cache"
        self._grace = grace_seconds
        self._hv: dict[str, Hypervisor] = dict(hypervisors) if hypervisors is not None else {
            "firecracker": FirecrackerHypervisor(),
            "qemu": QemuHypervisor(self._cache),
        }
        self._probes: dict[str, Probe] = {}
        self._cpu = CpuSampler(settle=0.1)
        self._lock = asyncio.Lock()
        self._consoles = ConsoleSockets()
        # When console output appeared (logs --since / --timestamps): the VMM writes the log itself.
        self._log_clock = NotingTask(lambda: [self._wdir(i) / "console.log" for i in self._dirs.ids()],
                                     "microVM consoles")

    # ---- state files ---------------------------------------------------------------------------

    def _wdir(self, workload_id: str) -> Path:
        return self._dirs.path(workload_id)

    def _load(self, workload_id: str) -> MicroVMMeta | None:
        meta = self._dirs.load(workload_id)
        try:
            if meta is not None:
                VMHandle(**meta.handle)  # a meta whose handle does not parse is as good as none
        except (ValueError, TypeError):
            return None
        return meta

    def _save(self, meta: MicroVMMeta) -> None:
        self._dirs.save(meta)

    def _backend(self, meta: MicroVMMeta) -> Hypervisor:
        hv = self._hv.get(meta.hypervisor)
        if hv is None:
            raise RuntimeFailure(f"{meta.workload_id} runs on unknown hypervisor {meta.hypervisor!r}")
        return hv

    # ---- backend selection ---------------------------------------------------------------------

    async def _probe_backends(self) -> dict[str, Probe]:
        if not self._probes:
            for name, hv in self._hv.items():
                self._probes[name] = await hv.probe()
            fc, qemu = self._probes.get("firecracker"), self._probes.get("qemu")
            # Firecracker is KVM-only. QEMU's accelerator check boots a guest under KVM and times it;
            # when that failed although /dev/kvm opens, KVM only emulates (nested/PVM hosts, ~1000x
            # slower than TCG) and Firecracker would not really work either.
            if fc is not None and fc.available and qemu is not None and "kvm:unusable" in qemu.features:
                self._probes["firecracker"] = Probe(
                    available=False, version=fc.version,
                    reason="KVM does not run guests at native speed here (QEMU's accelerator check failed)",
                )
        return self._probes

    async def _choose(self, wanted: str) -> str:
        probes = await self._probe_backends()
        if wanted != "auto":
            p = probes.get(wanted)
            if p is None or not p.available:
                why = p.reason if p is not None else "not configured"
                raise RuntimeFailure(f"hypervisor {wanted} unavailable: {why}", code="HypervisorUnavailable",
                                     terminal=True)
            return wanted
        for name in AUTO_ORDER:
            if name in probes and probes[name].available:
                return name
        reasons = "; ".join(f"{n}: {p.reason}" for n, p in probes.items())
        raise RuntimeFailure(f"no working hypervisor ({reasons})", code="HypervisorUnavailable", terminal=True)

    # ---- observation ---------------------------------------------------------------------------

    async def _observe(self, meta: MicroVMMeta) -> ObservedWorkload:
        handle = VMHandle(**meta.handle)
        obs = ObservedWorkload(
            workload_id=meta.workload_id,
            revision=meta.revision,
            generation=meta.generation,
            state=RuntimeState.RUNNING,
            runtime_id=str(handle.vmm_pid),
            started_at=handle.started_at,
        )
        hv = self._hv.get(meta.hypervisor)
        if hv is None:  # list() and inspect() must not raise, whatever meta.json holds
            obs.state, obs.message = RuntimeState.FAILED, f"unknown hypervisor {meta.hypervisor!r}"
            return obs
        status = await hv.inspect(handle)
        if status.running:
            obs.message = f"{meta.hypervisor}: {status.detail}" if status.detail else meta.hypervisor
            return obs
        if meta.exit_code is None and status.exit_code is not None:
            meta.exit_code = status.exit_code
            meta.finished_at = meta.finished_at or time.time()
            self._save(meta)
        obs.exit_code = meta.exit_code
        if meta.stopped_by_agent:
            obs.state, obs.message = RuntimeState.STOPPED, "stopped by agent"
        elif meta.exit_code == 0:
            # Firecracker and QEMU (-no-reboot) exit 0 when the guest powers off or reboots.
            obs.state, obs.message = RuntimeState.STOPPED, "guest shut down"
        elif meta.exit_code is None:
            obs.state, obs.message = RuntimeState.FAILED, f"{meta.hypervisor} exited; exit status unknown"
        else:
            obs.state = RuntimeState.FAILED
            last = tail_text(Path(handle.vmm_log), 3).strip()
            obs.message = f"{meta.hypervisor} exited with code {meta.exit_code}" + (f": {last}" if last else "")
        return obs

    async def _add_usage(self, meta: MicroVMMeta, obs: ObservedWorkload) -> None:
        hv, handle = self._backend(meta), VMHandle(**meta.handle)
        m = await hv.metrics(handle)

        async def read_again() -> int:
            nonlocal m
            m = await hv.metrics(handle)
            return m.cpu_ns

        cpu_percent = await self._cpu.percent(meta.workload_id, m.cpu_ns, read_again)
        obs.usage = m.usage.model_copy(update={"cpu_percent": cpu_percent})

    # ---- Runtime API ---------------------------------------------------------------------------

    async def probe(self) -> Probe:
        self._probes.clear()  # a probe is a fresh look: binaries may have been installed since
        probes = await self._probe_backends()
        working = [(n, p) for n, p in probes.items() if p.available]
        if not working:
            return Probe(available=False, reason="; ".join(f"{n}: {p.reason}" for n, p in probes.items()))
        try:
            self._dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return Probe(available=False, reason=f"state dir {self._dir}: {exc}")
        features: list[str] = []
        for n, p in working:
            features += [f"hypervisor:{n}", *p.features]
        return Probe(available=True, version=",".join(f"{n}-{p.version}" for n, p in working),
                     features=tuple(features))

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        spec = w.spec.microvm
        if w.spec.type != "microvm" or spec is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not a microvm", code="InvalidSpec", terminal=True)
        wdir = self._wdir(w.workload_id)
        async with self._lock:
            meta = self._load(w.workload_id)
            fresh_disk = True
            if meta is not None:
                obs = await self._observe(meta)
                if obs.state is RuntimeState.RUNNING and meta.revision == w.revision:
                    return obs  # adopt: never restart the desired revision
                if obs.state is RuntimeState.RUNNING:
                    await self._stop_locked(w.workload_id)
                # A restart of the same revision keeps its disk, as a rebooted VM would.
                fresh_disk = meta.revision != w.revision
            return await self._boot(w, wdir, fresh_disk)

    def _check_host_side(self, spec: MicroVMSpec, wdir: Path) -> tuple[Path, Path | None, Path | None]:
        """(kernel, initrd, rootfs) after checking that they and the tap devices exist; makes `wdir`."""

        def existing(value: str, what: str) -> Path | None:
            if not value:
                return None
            p = Path(value)
            if not p.is_absolute():
                raise RuntimeFailure(f"{what} path {value!r} must be absolute", code="InvalidSpec", terminal=True)
            if self._node_paths is not None:
                p = self._node_paths.check(value, what)  # resolved: used as checked
            if not p.is_file():
                # The same code as a VM's missing image: the spec is fine, the node lacks the file.
                raise RuntimeFailure(f"{what} {value!r} does not exist on this node", code="ImageNotFound",
                                     terminal=True)
            return p

        kernel = existing(spec.kernel, "kernel")
        assert kernel is not None  # the model requires a kernel
        for tap in spec.tap_devices:
            if not Path("/sys/class/net", tap).exists():
                # Not terminal: whatever sets up the host network may create the tap later.
                raise RuntimeFailure(f"tap device {tap!r} does not exist", code="NetworkUnavailable")
        private_dir(wdir)  # its disk copy, console log and sockets: the agent's and its VMM's (root) only
        return kernel, existing(spec.initrd, "initrd"), existing(spec.rootfs, "rootfs")

    async def _boot(self, w: RuntimeWorkload, wdir: Path, fresh_disk: bool) -> ObservedWorkload:
        spec = w.spec.microvm
        assert spec is not None
        kernel, initrd, rootfs = self._check_host_side(spec, wdir)
        backend_name = await self._choose(spec.hypervisor)
        try:
            elf = await asyncio.to_thread(ensure_elf_kernel, kernel, self._cache / "kernels")
        except (KernelFormatError, OSError) as exc:
            raise RuntimeFailure(f"kernel {spec.kernel}: {exc}", code="InvalidSpec", terminal=True) from exc
        cfg = VMConfig(
            vm_id=w.workload_id,
            workdir=wdir,
            kernel=elf,
            cmdline=spec.cmdline,
            vcpus=spec.vcpus,
            memory_mb=spec.memory_mb,
            initrd=initrd,
            rootfs=rootfs,
            tap_devices=tuple(spec.tap_devices),
            fresh_disk=fresh_disk,
        )
        try:
            handle = await self._hv[backend_name].start(cfg)
        except HypervisorError as exc:
            raise RuntimeFailure(f"{backend_name}: {exc}", code="VMStartFailed", terminal=exc.spec_error) from exc
        except OSError as exc:
            raise RuntimeFailure(f"{backend_name}: {exc}", code="VMStartFailed") from exc
        meta = MicroVMMeta(w.workload_id, w.revision, w.generation, backend_name, asdict(handle))
        self._cpu.forget(w.workload_id)
        self._save(meta)
        return await self._observe(meta)

    async def _stop_locked(self, workload_id: str) -> None:
        meta = self._load(workload_id)
        if meta is None:
            return
        handle = VMHandle(**meta.handle)
        hv = self._backend(meta)
        if (await hv.inspect(handle)).running:
            meta.stopped_by_agent = True
            self._save(meta)
        await hv.stop(handle, self._grace)
        status = await hv.inspect(handle)
        meta.exit_code = meta.exit_code if meta.exit_code is not None else status.exit_code
        meta.finished_at = meta.finished_at or time.time()
        self._save(meta)

    async def stop(self, workload_id: str) -> None:
        async with self._lock:
            await self._stop_locked(workload_id)

    async def remove(self, workload_id: str) -> None:
        async with self._lock:
            meta = self._load(workload_id)
            await self._stop_locked(workload_id)
            if meta is not None:
                for f in self._backend(meta).files(VMHandle(**meta.handle)):
                    with contextlib.suppress(OSError):
                        f.unlink()
            self._dirs.remove(workload_id)
            self._cpu.forget(workload_id)

    async def list(self) -> list[ObservedWorkload]:
        self._log_clock.ensure()  # the agent lists every pass: from the first, the clock runs
        out = []
        for workload_id in self._dirs.ids():
            meta = self._load(workload_id)
            if meta is not None:
                out.append(await self._observe(meta))
        return out

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        meta = self._load(workload_id)
        if meta is None:
            return None
        obs = await self._observe(meta)
        if obs.state is RuntimeState.RUNNING:
            await self._add_usage(meta, obs)
        return obs

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        """The tail of the guest's serial console."""
        meta = self._load(workload_id)
        path = (self._backend(meta).console_log(VMHandle(**meta.handle)) if meta is not None
                else self._wdir(workload_id) / "console.log")
        return await asyncio.to_thread(tail_text, path, tail)

    async def open_console(self, workload_id: str) -> SocketConsole:
        """Attach to the microVM's serial console (`persysctl console`), one client at a time."""
        meta = self._load(workload_id)
        if meta is None:
            raise RuntimeFailure(f"{workload_id} has no microVM on this node", code="NotFound")
        if (await self._observe(meta)).state is not RuntimeState.RUNNING:
            raise RuntimeFailure(f"{workload_id} is not running", code="NotRunning")
        socket = self._backend(meta).console_socket(VMHandle(**meta.handle))
        if socket is None:
            raise RuntimeFailure(f"{workload_id} runs on {meta.hypervisor}, whose serial console is only logged "
                                 f"(`persysctl logs {workload_id}`)", code="NotRunning")
        return await self._consoles.open(workload_id, socket, f"persys-{workload_id}")

    def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        meta = self._load(workload_id)
        path = (self._backend(meta).console_log(VMHandle(**meta.handle)) if meta is not None
                else self._wdir(workload_id) / "console.log")
        return file_stream(path, query, "a microVM's serial console", timed=True)

    async def close(self) -> None:
        # Deliberately leaves VMs running: they belong to the node, not to this agent process.
        await self._log_clock.close()
        for hv in self._hv.values():
            await hv.close()
