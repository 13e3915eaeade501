"""VM runtime: one libvirt/QEMU domain per workload (`type: vm`).

Each VM boots a copy-on-write qcow2 overlay of a registered base image (`images.py`), never the
base itself, optionally straight from a kernel, with an optional cloud-init NoCloud seed as an IDE
cdrom (`cloudinit.py`). Its serial console goes to a file, which is what `logs()` returns.
Per-workload files live in `<state_dir>/vm/<id>/` (disk.qcow2, seed.iso, console.log).

Domains are persistent and carry a `<persys:workload>` metadata element (`domain.py`). Like
containers, they are found again through libvirt, never through memory: a restarted agent adopts
a running domain of the desired revision instead of booting a second copy. Every libvirt call
blocks, so each runs in a worker thread (`libvirt.py` holds the binding and the connection).

Hardware acceleration is chosen by `detect_accelerator()` (`runtimes/kvm.py`), which really runs a
few instructions under KVM: where /dev/kvm exists but KVM is unusable or emulated (nested
virtualisation), domains fall back to `type='qemu'` (TCG).

Over 500 lines on purpose: one class, the Runtime protocol for libvirt domains. What it builds
on has its own module (domain XML, images and their download, cloud-init, the libvirt binding,
data disks, consoles);
what remains is one domain's life (start, adopt, observe, stop, remove, logs, exec), whose steps
share the per-workload lock and the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import shutil
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.agent.runtimes.cpu_sampler import CpuSampler
from persys.agent.runtimes.kvm import Accelerator, detect_accelerator
from persys.agent.runtimes.log_stream import LogQuery, file_stream
from persys.agent.runtimes.log_times import NotingTask
from persys.agent.runtimes.node_paths import NodePaths
from persys.agent.runtimes.vm.cloudinit import SeedError, build_seed
from persys.agent.runtimes.vm.console import LibvirtConsole, open_console
from persys.agent.runtimes.vm.data_disks import data_disks, forget_secrets
from persys.agent.runtimes.vm.domain import NAME_PREFIX, DomainConfig, DomainMeta, domain_name, domain_xml, parse_meta
from persys.agent.runtimes.vm.image_download import ImageDownloader
from persys.agent.runtimes.vm.images import ImageError, ImageRecord, ImageRegistry
from persys.agent.runtimes.vm.libvirt import (
    DEFAULT_URI,
    LIBVIRT_QEMU_LOG_DIR,
    Connection,
    addresses,
    err_code,
    load_libvirt,
    lv_module,
    map_state,
    sum_indexed,
    version_str,
)
from persys.agent.runtimes.workdir import tail_text, workload_dir
from persys.model.vm_spec import VMSpec

LABEL_CLUSTER = "persys.cluster"  # the cluster's id (security.cluster_id), in new domains' labels and names


log = logging.getLogger(__name__)

T = TypeVar("T")


# ---- the runtime -----------------------------------------------------------------------------


@dataclass
class _Found:
    dom: Any  # libvirt.virDomain
    meta: DomainMeta
    xml: str


class LibvirtVMRuntime:
    """Runs `type: vm` workloads as libvirt/QEMU domains."""

    name = "vm"

    def __init__(
        self,
        state_dir: str | Path,
        *,
        uri: str = DEFAULT_URI,
        images: ImageRegistry | None = None,
        extra_labels: dict[str, str] | None = None,
        shutdown_timeout: float = 10.0,
        accelerator: Literal["auto", "kvm", "tcg"] = "auto",
        qemu_img: str | None = None,
        node_paths: NodePaths | None = None,  # the agent's re-check of absolute image paths
        cluster_id: str = "",  # in new domains' names and labels: two clusters on one host never meet
    ) -> None:
        self._cluster = cluster_id
        self._dir = Path(state_dir) / "vm"
        self._node_paths = node_paths
        self._uri = uri
        self.images = images if images is not None else ImageRegistry(state_dir)
        self.downloads = ImageDownloader(self.images)
        self._labels = dict(extra_labels or {})
        self._shutdown_timeout = shutdown_timeout
        self._accel_setting = accelerator
        self._qemu_img = qemu_img
        self._conn = Connection(uri)
        self._lock = asyncio.Lock()  # serialises start/stop/remove so adoption checks are not racy
        self._cpu = CpuSampler(settle=0.25)
        # When console output appeared (logs --since / --timestamps): libvirt writes the log itself.
        self._log_clock = NotingTask(self._console_logs, "VM consoles")

    # ---- plumbing ------------------------------------------------------------------------------

    def _connect(self) -> Any:
        return self._conn.get()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def _wdir(self, workload_id: str) -> Path:
        return workload_dir(self._dir, workload_id)

    def _accelerator(self) -> Accelerator:
        if self._accel_setting != "auto":
            return self._accel_setting
        return detect_accelerator()

    def _console_logs(self) -> list[Path]:
        try:
            return [d / "console.log" for d in self._dir.iterdir() if d.is_dir()]
        except FileNotFoundError:
            return []

    async def close(self) -> None:
        # Deliberately leaves domains running: they belong to the node, not to this agent process.
        await self._log_clock.close()
        await self.downloads.close()
        await self._run(self._conn.close)

    async def probe(self) -> Probe:
        mod, why = load_libvirt()
        if mod is None:
            return Probe(available=False, reason=why)
        try:
            return await asyncio.wait_for(self._run(self._probe_sync), timeout=30)
        except RuntimeFailure as exc:
            return Probe(available=False, reason=str(exc.args[0]))
        except Exception as exc:  # probe must never raise
            return Probe(available=False, reason=f"libvirt not usable at {self._uri}: {exc}")

    def _probe_sync(self) -> Probe:
        qemu_img = self._qemu_img or shutil.which("qemu-img")
        if qemu_img is None:
            return Probe(available=False, reason="qemu-img not found (apt-get install qemu-utils)")
        conn = self._connect()
        hv = conn.getVersion()  # fails unless the QEMU driver found a usable emulator
        accel = self._accelerator()
        features = [
            f"accel:{accel}",
            f"libvirt:{version_str(conn.getLibVersion())}",
            "disk:qcow2-overlay",
            "boot:direct-kernel",
            "console:serial-pty",
        ]
        try:
            importlib.import_module("pycdlib")
            features.append("cloud-init:nocloud")
        except ImportError:
            pass  # VMs still run; only workloads with cloudInit fail (with a clear reason)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o711)  # QEMU runs as libvirt-qemu and must pass through to each VM's files
        return Probe(available=True, version=f"qemu-{version_str(hv)}", features=tuple(features))

    # ---- reading -------------------------------------------------------------------------------

    @property
    def _scope(self) -> dict[str, str]:
        """The labels new domains carry (and whose hash their names hold): the node's, the cluster's."""
        return {**self._labels, LABEL_CLUSTER: self._cluster} if self._cluster else dict(self._labels)

    def _is_ours(self, meta: DomainMeta, legacy: bool = False) -> bool:
        """Ours by its labels; under a name of before cluster ids (`legacy`), one that carries no
        cluster label at all with this node's (another cluster's new domains never match)."""
        if legacy and LABEL_CLUSTER in meta.labels:
            return False
        return all(meta.labels.get(k) == v for k, v in (self._labels if legacy else self._scope).items())

    def _names(self, workload_id: str) -> list[tuple[str, bool]]:
        """(name, legacy) a domain of this workload may have: the current one, then the one domains
        had before cluster ids (still adopted)."""
        current = domain_name(workload_id, self._scope)
        legacy = domain_name(workload_id, self._labels)
        return [(current, False)] + ([(legacy, True)] if legacy != current else [])

    def _find_sync(self, workload_id: str, strict: bool = False) -> _Found | None:
        """Our domain of a workload. A foreign domain holding its name is None, or a terminal
        Conflict when `strict` (starting would have to take that name)."""
        lv = lv_module()
        conn = self._connect()
        for name, legacy in self._names(workload_id):
            try:
                dom = conn.lookupByName(name)
                xml = dom.XMLDesc(0)
            except lv.libvirtError as exc:
                if err_code(exc) == lv.VIR_ERR_NO_DOMAIN:
                    continue
                raise RuntimeFailure(f"look up VM {workload_id}: {exc}") from exc
            meta = parse_meta(xml)
            if legacy and (meta is None or meta.workload_id != workload_id or not self._is_ours(meta, legacy)):
                continue  # a name of before cluster ids is only ever adopted, never contested
            return self._checked(dom, xml, meta, workload_id, strict, legacy)
        return None

    def _checked(self, dom: Any, xml: str, meta: DomainMeta | None, workload_id: str, strict: bool,
                 legacy: bool) -> _Found | None:
        if meta is None or meta.workload_id != workload_id or not self._is_ours(meta, legacy):
            if not strict:
                return None
            raise RuntimeFailure(
                f"domain {dom.name()} exists but is not a persys VM of this node; remove it by hand",
                code="Conflict",
                terminal=True,
            )
        return _Found(dom, meta, xml)

    def _observe_sync(self, f: _Found, *, ask_agent: bool = False) -> ObservedWorkload:
        lv = lv_module()
        try:
            state, reason = f.dom.state()
        except lv.libvirtError as exc:
            if err_code(exc) == lv.VIR_ERR_NO_DOMAIN:  # removed between lookup and now
                return ObservedWorkload(
                    f.meta.workload_id,
                    f.meta.revision,
                    f.meta.generation,
                    RuntimeState.MISSING,
                    "",
                    message="domain disappeared",
                )
            raise RuntimeFailure(f"state of VM {f.meta.workload_id}: {exc}") from exc
        obs = ObservedWorkload(
            workload_id=f.meta.workload_id,
            revision=f.meta.revision,
            generation=f.meta.generation,
            state=RuntimeState.RUNNING,
            runtime_id=f.dom.UUIDString(),
            started_at=f.meta.started_at,
        )
        obs.state, obs.exit_code, obs.message = map_state(lv, state, reason)
        if obs.state is RuntimeState.RUNNING and "<interface" in f.xml:
            ips = addresses(lv, f.dom, ask_agent)
            if ips:
                obs.message = " ".join(x for x in (obs.message, "ip " + ",".join(ips)) if x)
        return obs

    def _stats_sync(self, f: _Found) -> tuple[int, dict[str, Any]]:
        lv = lv_module()
        flags = (
            lv.VIR_DOMAIN_STATS_CPU_TOTAL
            | lv.VIR_DOMAIN_STATS_BALLOON
            | lv.VIR_DOMAIN_STATS_BLOCK
            | lv.VIR_DOMAIN_STATS_INTERFACE
        )
        try:
            res = self._connect().domainListGetStats([f.dom], flags)
            return f.dom.ID(), dict(res[0][1]) if res else {}
        except lv.libvirtError:
            return -1, {}  # usage is best-effort; the state is what matters

    async def _add_usage(self, f: _Found, obs: ObservedWorkload) -> None:
        dom_id, st = await self._run(self._stats_sync, f)
        if not st:
            return
        # rss: what the VM costs the host; `current` (the guest's RAM size) when rss is unknown.
        u = obs.usage
        u.memory_bytes = int(st.get("balloon.rss") or st.get("balloon.current") or 0) * 1024
        u.disk_read_bytes = sum_indexed(st, "block", "rd.bytes")
        u.disk_write_bytes = sum_indexed(st, "block", "wr.bytes")
        u.net_rx_bytes = sum_indexed(st, "net", "rx.bytes")
        u.net_tx_bytes = sum_indexed(st, "net", "tx.bytes")
        used = int(st.get("cpu.time", 0))

        async def read_again() -> int:
            _, again = await self._run(self._stats_sync, f)
            return int(again.get("cpu.time", used))

        u.cpu_percent = await self._cpu.percent(obs.workload_id, used, read_again, identity=dom_id)

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        f = await self._run(self._find_sync, workload_id)
        if f is None:
            return None
        obs = await self._run(functools.partial(self._observe_sync, f, ask_agent=True))
        if obs.state is RuntimeState.RUNNING:
            await self._add_usage(f, obs)
        return obs

    def _list_sync(self) -> list[ObservedWorkload]:
        lv = lv_module()
        try:
            doms = self._connect().listAllDomains(0)
        except lv.libvirtError as exc:
            raise RuntimeFailure(f"list domains: {exc}") from exc
        out = []
        for dom in doms:
            try:
                if not dom.name().startswith(NAME_PREFIX):
                    continue
                xml = dom.XMLDesc(0)
            except lv.libvirtError:
                continue  # undefined between list and read: simply gone
            meta = parse_meta(xml)
            if meta is None or not any(dom.name() == name and self._is_ours(meta, legacy)
                                       for name, legacy in self._names(meta.workload_id)):
                continue
            obs = self._observe_sync(_Found(dom, meta, xml))
            if obs.state is not RuntimeState.MISSING:
                out.append(obs)
        return out

    async def list(self) -> list[ObservedWorkload]:
        self._log_clock.ensure()  # the agent lists every pass: from the first, the clock runs
        return await self._run(self._list_sync)

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        return await self._run(tail_text, self._wdir(workload_id) / "console.log", tail)

    async def open_console(self, workload_id: str) -> LibvirtConsole:
        """Attach to the VM's serial console (`persysctl console`): what the guest writes, and
        keystrokes to it. A domain started before consoles were ptys (its serial port writes only a
        file) has none until it is restarted."""
        found = await self._run(self._find_sync, workload_id)
        if found is None:
            raise RuntimeFailure(f"{workload_id} has no VM on this node", code="NotFound")
        if "<serial type='pty'>" not in found.xml and '<serial type="pty">' not in found.xml:
            raise RuntimeFailure(f"{workload_id} was started without an attachable console (its serial port "
                                 "writes a file only): `persysctl restart` it once", code="NotRunning")
        return await self._run(open_console, self._connect(), found.dom, found.dom.name(),
                               asyncio.get_running_loop())

    def stream_logs(self, workload_id: str, query: LogQuery) -> AsyncIterator[str]:
        return file_stream(self._wdir(workload_id) / "console.log", query, "a VM's serial console", timed=True)

    # ---- writing -------------------------------------------------------------------------------

    def _resolve(self, ref: str, kind: Literal["disk", "kernel", "initrd"]) -> ImageRecord:
        if ref.startswith("/") and self._node_paths is not None:
            ref = str(self._node_paths.check(ref, f"vm {'image' if kind == 'disk' else kind}"))  # resolved
        try:
            return self.images.resolve(ref, kind)
        except ImageError as exc:
            raise RuntimeFailure(str(exc), code="ImageNotFound", terminal=True) from exc

    def _create_overlay(self, base: ImageRecord, overlay: Path, disk_mb: int) -> None:
        qemu_img = self._qemu_img or shutil.which("qemu-img") or "qemu-img"
        # -F: the base's recorded format, so QEMU never probes (and trusts) a guest-written header.
        cmd = [qemu_img, "create", "-q", "-f", "qcow2", "-F", base.format, "-b", base.path, str(overlay)]
        if disk_mb * 1024 * 1024 > base.virtual_size:
            cmd.append(f"{disk_mb}M")  # grow the guest's disk to the requested size; never shrink
        overlay.unlink(missing_ok=True)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeFailure(f"qemu-img create: {exc}") from exc
        if proc.returncode != 0:
            raise RuntimeFailure(f"qemu-img create overlay: {proc.stderr.strip()}")

    async def _base_image(self, w: RuntimeWorkload, vm: VMSpec) -> str:
        """What `vm.image` names on this node: an http(s) URL's download (StartPending while it
        runs), else the name or path as given."""
        url = vm.image_url()
        if not url or vm.image_sha256 is None:
            return vm.image
        return (await self.downloads.ensure(w.workload_id, url, vm.image_sha256)).name

    def _prepare_sync(self, w: RuntimeWorkload, vm: VMSpec, base_ref: str, *, reuse_disk: bool) -> DomainConfig:
        base = self._resolve(base_ref, "disk")
        kernel = self._resolve(vm.kernel, "kernel").path if vm.kernel else ""
        initrd = self._resolve(vm.initrd, "initrd").path if vm.initrd else ""
        wdir = self._wdir(w.workload_id)
        wdir.mkdir(parents=True, exist_ok=True)
        for d in (self._dir, wdir):
            d.chmod(0o711)  # QEMU (user libvirt-qemu) must reach its files; nobody needs to list them
        disk, seed, console = wdir / "disk.qcow2", wdir / "seed.iso", wdir / "console.log"
        if not (reuse_disk and disk.exists()):
            self._create_overlay(base, disk, w.spec.resources.disk_mb)
        if vm.cloud_init is not None:
            try:
                build_seed(seed, w.workload_id, w.revision, vm.cloud_init)
            except SeedError as exc:
                raise RuntimeFailure(f"cloud-init seed: {exc}", code="InvalidSpec", terminal=True) from exc
        else:
            seed.unlink(missing_ok=True)
        with open(console, "a") as f:
            f.write(f"--- persys: starting revision {w.revision} at {time.ctime()} ---\n")
        return DomainConfig(
            name=domain_name(w.workload_id, self._scope),
            domain_type="kvm" if self._accelerator() == "kvm" else "qemu",
            vcpus=vm.vcpus,
            memory_mb=vm.memory_mb,
            disk=disk,
            console_log=console,
            meta=DomainMeta(w.workload_id, w.revision, w.generation, round(time.time(), 3), self._scope),
            seed=seed if vm.cloud_init is not None else None,
            kernel=kernel,
            initrd=initrd,
            cmdline=vm.cmdline,
            networks=tuple(vm.networks),
            data_disks=data_disks(self._connect(), w.mounts, self._cluster) if w.mounts else (),
        )

    def _boot_sync(self, cfg: DomainConfig) -> _Found:
        lv = lv_module()
        conn = self._connect()
        xml = domain_xml(cfg)
        try:
            dom = conn.defineXML(xml)
        except lv.libvirtError as exc:
            code = err_code(exc)
            terminal = code in (lv.VIR_ERR_XML_ERROR, lv.VIR_ERR_XML_DETAIL, lv.VIR_ERR_CONFIG_UNSUPPORTED)
            raise RuntimeFailure(
                f"define VM: {exc}", code="InvalidSpec" if terminal else "RuntimeError", terminal=terminal
            ) from exc
        try:
            dom.create()
        except lv.libvirtError as exc:
            code = err_code(exc)
            msg = str(exc)
            if "Permission denied" in msg:
                msg += " (QEMU runs as an unprivileged user: every directory above the state dir must be searchable)"
            if code == lv.VIR_ERR_NO_NETWORK:
                raise RuntimeFailure(f"start VM: {msg}", code="NetworkNotFound", terminal=True) from exc
            if code in (lv.VIR_ERR_CONFIG_UNSUPPORTED, lv.VIR_ERR_XML_DETAIL):
                raise RuntimeFailure(f"start VM: {msg}", code="InvalidSpec", terminal=True) from exc
            raise RuntimeFailure(f"start VM: {msg}") from exc
        return _Found(dom, cfg.meta, dom.XMLDesc(0))

    def _discard_sync(self, f: _Found | None, workload_id: str) -> None:
        """Destroy and undefine the domain, then delete its disk, seed and console log."""
        lv = lv_module()
        if f is not None:
            name = f.dom.name()
            try:
                if f.dom.isActive():
                    f.dom.destroy()
            except lv.libvirtError as exc:
                if err_code(exc) not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
                    raise RuntimeFailure(f"destroy VM {workload_id}: {exc}") from exc
            flags = (
                lv.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
                | lv.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
                | lv.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
                | lv.VIR_DOMAIN_UNDEFINE_NVRAM
            )
            try:
                f.dom.undefineFlags(flags)
            except lv.libvirtError as exc:
                if err_code(exc) != lv.VIR_ERR_NO_DOMAIN:
                    raise RuntimeFailure(f"undefine VM {workload_id}: {exc}") from exc
            forget_secrets(self._connect(), f.xml)
            # libvirt's own per-domain log would otherwise pile up, one file per workload ever run.
            with contextlib.suppress(OSError):
                (LIBVIRT_QEMU_LOG_DIR / f"{name}.log").unlink(missing_ok=True)
        shutil.rmtree(self._wdir(workload_id), ignore_errors=True)
        self._cpu.forget(workload_id)

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        vm = w.spec.vm
        if w.spec.type != "vm" or vm is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not a vm", code="InvalidSpec", terminal=True)
        self._wdir(w.workload_id)
        async with self._lock:
            found = await self._run(self._find_sync, w.workload_id, True)
            uuid = ""
            reuse_disk = False
            if found is not None and found.meta.revision == w.revision:
                obs = await self._run(self._observe_sync, found)
                if obs.state is RuntimeState.RUNNING:
                    return obs  # adopt: never restart a healthy VM of the desired revision
            # A download raises StartPending here: the VM of an older revision runs on meanwhile.
            base_ref = await self._base_image(w, vm)
            if found is not None:
                if found.meta.revision == w.revision:
                    # Same revision, powered off: boot it again on its own disk, as a real machine
                    # would after a power cycle (a new revision starts from a fresh overlay).
                    uuid, reuse_disk = found.dom.UUIDString(), True
                else:
                    # The old disk is discarded, so a graceful guest shutdown would buy nothing.
                    await self._run(self._discard_sync, found, w.workload_id)
            if self._accel_setting == "auto":
                await self._run(detect_accelerator)  # first call may take seconds: not on the loop
            cfg = await self._run(functools.partial(self._prepare_sync, w, vm, base_ref, reuse_disk=reuse_disk))
            if uuid:
                cfg = replace(cfg, uuid=uuid)
            try:
                booted = await self._run(self._boot_sync, cfg)
            except RuntimeFailure:
                # A new VM that never started is useless: remove it so a retry starts clean. A
                # powered-off one keeps its disk (the guest's data) and is redefined on retry.
                if not reuse_disk:
                    await self._run(self._discard_sync, await self._run(self._find_sync, w.workload_id), w.workload_id)
                raise
            self._cpu.forget(w.workload_id)
            return await self._run(self._observe_sync, booted)

    async def stop(self, workload_id: str) -> None:
        """ACPI shutdown, then power off after `shutdown_timeout`. The domain, its disk and its
        console log stay, so the state and logs remain inspectable and a start boots it again."""
        async with self._lock:
            f = await self._run(self._find_sync, workload_id)
            if f is None:
                return
            lv = lv_module()
            try:
                if not await self._run(f.dom.isActive):
                    return
                if self._shutdown_timeout > 0:
                    with contextlib.suppress(lv.libvirtError):  # no ACPI in the guest: destroy below
                        await self._run(f.dom.shutdownFlags, lv.VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN)
                    deadline = time.monotonic() + self._shutdown_timeout
                    while time.monotonic() < deadline:
                        if not await self._run(f.dom.isActive):
                            return
                        await asyncio.sleep(0.25)
                await self._run(f.dom.destroy)
            except lv.libvirtError as exc:
                if err_code(exc) not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
                    raise RuntimeFailure(f"stop VM {workload_id}: {exc}") from exc

    async def remove(self, workload_id: str) -> None:
        self.downloads.forget(workload_id)
        async with self._lock:
            f = await self._run(self._find_sync, workload_id)
            await self._run(self._discard_sync, f, workload_id)


