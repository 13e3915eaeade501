"""VM runtime: one libvirt/QEMU domain per workload (`type: vm`).

Each VM boots a copy-on-write qcow2 overlay of a registered base image (`images.py`), never the
base itself, optionally straight from a kernel, with an optional cloud-init NoCloud seed as an IDE
cdrom. Its serial console goes to a file, which is what `logs()` returns. Per-workload files live
in `<state_dir>/vm/<id>/` (disk.qcow2, seed.iso, console.log).

Domains are persistent and carry a `<persys:workload>` metadata element (id, revision,
generation, node scope labels). Like containers, they are found again through libvirt, never
through memory: a restarted agent adopts a running domain of the desired revision instead of
booting a second copy. Every libvirt call blocks, so each runs in a worker thread.

Hardware acceleration is chosen by `detect_accelerator()`, which really runs a few instructions
under KVM: where /dev/kvm exists but KVM is unusable or emulated (nested virtualisation), domains
fall back to `type='qemu'` (TCG).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from persys.agent.runtimes.base import (
    ObservedWorkload,
    Probe,
    RuntimeFailure,
    RuntimeState,
    RuntimeWorkload,
)
from persys.agent.runtimes.cloudinit import SeedError, build_seed
from persys.agent.runtimes.images import ImageError, ImageRecord, ImageRegistry
from persys.agent.runtimes.node_paths import NodePaths
from persys.model.workload import VMSpec

log = logging.getLogger(__name__)

Accelerator = Literal["kvm", "tcg"]
NS = "https://persys.dev/xmlns/libvirt-vm/v1"
NAME_PREFIX = "persys-"
DEFAULT_URI = "qemu:///system"
LIBVIRT_QEMU_LOG_DIR = Path("/var/log/libvirt/qemu")

ET.register_namespace("persys", NS)
T = TypeVar("T")


# ---- libvirt binding -------------------------------------------------------------------------


@functools.cache
def _load_libvirt() -> tuple[Any, str]:
    """(module, "") or (None, why). Imported lazily so the agent runs on nodes without libvirt."""
    try:
        mod = importlib.import_module("libvirt")
    except ImportError as exc:
        return None, f"python binding not installed (pip install libvirt-python): {exc}"
    # libvirt's default handler prints every error to stderr; they arrive as exceptions anyway.
    mod.registerErrorHandler(lambda _ctx, _err: None, None)
    return mod, ""


def _lv() -> Any:
    mod, why = _load_libvirt()
    if mod is None:
        raise RuntimeFailure(why, code="RuntimeUnavailable")
    return mod


def _err_code(exc: BaseException) -> int:
    get = getattr(exc, "get_error_code", None)
    return int(get() or 0) if get is not None else 0


def _version_str(v: int) -> str:
    return f"{v // 1_000_000}.{v // 1000 % 1000}.{v % 1000}"


# ---- accelerator detection -------------------------------------------------------------------

# A 64 KiB "BIOS" whose reset vector (F000:FFF0) runs ~10M iterations of `dec ecx; jnz` and then
# writes to the isa-debug-exit port, making QEMU exit with status (0x2a << 1) | 1 = 85.
# Real KVM finishes in milliseconds; emulated/nested KVM (about 1000x slower here) times out,
# and KVM that cannot even set up the vCPU fails at once. No SeaBIOS, no kernel, no disk.
_RESET_VECTOR = bytes.fromhex(
    "66b900009800"  # mov ecx, 0x980000
    "6649"  # dec ecx
    "75fc"  # jnz -4 (back to dec)
    "b02a"  # mov al, 0x2a
    "e6f4"  # out 0xf4, al
    "f4"  # hlt
)
_PROBE_EXIT = 85
_accel_cache: dict[str, tuple[Accelerator, str]] = {}
_accel_lock = threading.Lock()


def _probe_bios() -> bytes:
    image = bytearray(b"\xf4" * 65536)  # hlt everywhere else
    image[0xFFF0 : 0xFFF0 + len(_RESET_VECTOR)] = _RESET_VECTOR
    return bytes(image)


def _try_kvm(qemu: str, timeout: float) -> tuple[Accelerator, str]:
    if not qemu:
        return "tcg", "qemu-system-x86_64 not found"
    if not os.path.exists("/dev/kvm"):
        return "tcg", "/dev/kvm does not exist"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "tcg", "/dev/kvm is not accessible"
    with tempfile.NamedTemporaryFile(prefix="persys-kvm-probe-", suffix=".bin") as bios:
        bios.write(_probe_bios())
        bios.flush()
        # The default CPU model: the same one libvirt gives a domain without a <cpu> element.
        cmd = [
            qemu, "-accel", "kvm", "-machine", "pc", "-nodefaults", "-no-user-config",
            "-display", "none", "-serial", "none", "-monitor", "none", "-m", "16",
            "-bios", bios.name, "-device", "isa-debug-exit,iobase=0xf4,iosize=0x04",
        ]  # fmt: skip
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return "tcg", f"a 10M-instruction KVM guest did not finish within {timeout:g}s (emulated/nested KVM)"
        except OSError as exc:
            return "tcg", f"cannot run {qemu}: {exc}"
    if proc.returncode == _PROBE_EXIT:
        return "kvm", "KVM ran the probe guest"
    last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return "tcg", f"KVM probe failed: {last}"


def detect_accelerator(qemu: str | None = None, *, timeout: float = 2.0) -> Accelerator:
    """ "kvm" when KVM really runs guest code at hardware speed, else "tcg". Cached per binary;
    takes well under a second where KVM works or fails outright, at most `timeout` otherwise."""
    return detect_accelerator_with_reason(qemu, timeout=timeout)[0]


def detect_accelerator_with_reason(qemu: str | None = None, *, timeout: float = 2.0) -> tuple[Accelerator, str]:
    exe = qemu or shutil.which("qemu-system-x86_64") or ""
    with _accel_lock:
        if exe not in _accel_cache:
            _accel_cache[exe] = _try_kvm(exe, timeout)
            log.info("VM accelerator: %s (%s)", *_accel_cache[exe])
        return _accel_cache[exe]


# ---- domain XML ------------------------------------------------------------------------------


@dataclass
class DomainMeta:
    workload_id: str
    revision: str
    generation: int
    started_at: float
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DomainConfig:
    name: str
    domain_type: Literal["kvm", "qemu"]
    vcpus: int
    memory_mb: int
    disk: Path
    console_log: Path
    meta: DomainMeta
    uuid: str = ""
    seed: Path | None = None
    kernel: str = ""
    initrd: str = ""
    cmdline: str = ""
    networks: tuple[str, ...] = ()


def _sub(parent: ET.Element, tag: str, text: str | None = None, **attrib: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrib)
    if text is not None:
        el.text = text
    return el


def _interface(devices: ET.Element, net: str) -> None:
    if net == "user":
        iface = _sub(devices, "interface", type="user")  # QEMU's own NAT: no bridge, no firewall rules
    elif net.startswith("bridge:"):
        iface = _sub(devices, "interface", type="bridge")
        _sub(iface, "source", bridge=net.removeprefix("bridge:"))
    else:
        iface = _sub(devices, "interface", type="network")
        _sub(iface, "source", network=net.removeprefix("network:"))
    _sub(iface, "model", type="virtio")


def domain_xml(cfg: DomainConfig) -> str:
    dom = ET.Element("domain", type=cfg.domain_type)
    _sub(dom, "name", cfg.name)
    if cfg.uuid:
        _sub(dom, "uuid", cfg.uuid)  # redefining an existing name must keep its uuid
    md = ET.SubElement(_sub(dom, "metadata"), f"{{{NS}}}workload")
    _sub(md, f"{{{NS}}}id", cfg.meta.workload_id)
    _sub(md, f"{{{NS}}}revision", cfg.meta.revision)
    _sub(md, f"{{{NS}}}generation", str(cfg.meta.generation))
    _sub(md, f"{{{NS}}}startedAt", f"{cfg.meta.started_at:.3f}")
    for k, v in sorted(cfg.meta.labels.items()):
        _sub(md, f"{{{NS}}}label", key=k, value=v)
    _sub(dom, "memory", str(cfg.memory_mb), unit="MiB")
    _sub(dom, "currentMemory", str(cfg.memory_mb), unit="MiB")
    _sub(dom, "vcpu", str(cfg.vcpus), placement="static")
    os_el = _sub(dom, "os")
    # i440fx: the only x86 machine with an IDE bus, which is where NoCloud seeds conventionally go.
    _sub(os_el, "type", "hvm", arch="x86_64", machine="pc")
    if cfg.kernel:
        _sub(os_el, "kernel", cfg.kernel)
        if cfg.initrd:
            _sub(os_el, "initrd", cfg.initrd)
        cmdline = cfg.cmdline
        if "console=" not in cmdline:
            cmdline = f"{cmdline} console=ttyS0".strip()  # logs() reads the serial console
        _sub(os_el, "cmdline", cmdline)
    else:
        _sub(os_el, "boot", dev="hd")
    features = _sub(dom, "features")
    _sub(features, "acpi")  # shutdown() presses the ACPI power button
    _sub(features, "apic")
    _sub(dom, "on_poweroff", "destroy")
    _sub(dom, "on_reboot", "restart")
    _sub(dom, "on_crash", "destroy")  # a crashed guest is a failed workload; the agent's policy restarts it
    devices = _sub(dom, "devices")
    disk = _sub(devices, "disk", type="file", device="disk")
    _sub(disk, "driver", name="qemu", type="qcow2", discard="unmap")
    _sub(disk, "source", file=str(cfg.disk))
    _sub(disk, "target", dev="vda", bus="virtio")
    if cfg.seed is not None:
        cd = _sub(devices, "disk", type="file", device="cdrom")
        _sub(cd, "driver", name="qemu", type="raw")
        _sub(cd, "source", file=str(cfg.seed))
        _sub(cd, "target", dev="hdc", bus="ide")
        _sub(cd, "readonly")
    for net in cfg.networks:
        _interface(devices, net)
    if cfg.networks:
        # Lets `inspect` ask a guest agent for addresses that no DHCP lease table knows.
        chan = _sub(devices, "channel", type="unix")
        _sub(chan, "target", type="virtio", name="org.qemu.guest_agent.0")
    # The serial port writes to a file (appending across restarts); the console is the same port.
    # No <graphics>: none is the default, and `<graphics type='none'/>` is not valid XML for libvirt.
    serial = _sub(devices, "serial", type="file")
    _sub(serial, "source", path=str(cfg.console_log), append="on")
    _sub(serial, "target", port="0")
    console = _sub(devices, "console", type="file")
    _sub(console, "source", path=str(cfg.console_log), append="on")
    _sub(console, "target", type="serial", port="0")
    _sub(devices, "controller", type="usb", model="none")
    balloon = _sub(devices, "memballoon", model="virtio")
    _sub(balloon, "stats", period="5")  # guest-side memory figures when the guest has the driver
    rng = _sub(devices, "rng", model="virtio")
    _sub(rng, "backend", "/dev/urandom", model="random")  # cloud images block on entropy otherwise
    return ET.tostring(dom, encoding="unicode")


def parse_meta(xml_desc: str) -> DomainMeta | None:
    """The persys metadata of a domain's XML, or None for domains persys does not manage."""
    try:
        root = ET.fromstring(xml_desc)
    except ET.ParseError:
        return None
    el = root.find(f"metadata/{{{NS}}}workload")
    if el is None:
        return None
    wid = el.findtext(f"{{{NS}}}id") or ""
    if not wid:
        return None
    try:
        generation = int(el.findtext(f"{{{NS}}}generation") or 0)
        started_at = float(el.findtext(f"{{{NS}}}startedAt") or 0)
    except ValueError:
        generation, started_at = 0, 0.0
    labels = {lab.get("key", ""): lab.get("value", "") for lab in el.findall(f"{{{NS}}}label")}
    return DomainMeta(wid, el.findtext(f"{{{NS}}}revision") or "", generation, started_at, labels)


def domain_name(workload_id: str, scope: Mapping[str, str]) -> str:
    """`persys-<id>`, plus a hash of the node scope when there is one, so agents of several nodes
    on one host (dev clusters, tests) never collide on a name or touch each other's domains."""
    if not scope:
        return f"{NAME_PREFIX}{workload_id}"
    digest = hashlib.sha256(json.dumps(sorted(scope.items())).encode()).hexdigest()[:8]
    return f"{NAME_PREFIX}{digest}-{workload_id}"


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
    ) -> None:
        self._dir = Path(state_dir) / "vm"
        self._node_paths = node_paths
        self._uri = uri
        self.images = images if images is not None else ImageRegistry(state_dir)
        self._labels = dict(extra_labels or {})
        self._shutdown_timeout = shutdown_timeout
        self._accel_setting = accelerator
        self._qemu_img = qemu_img
        self._conn: Any = None
        self._conn_lock = threading.Lock()  # worker threads share one connection
        self._lock = asyncio.Lock()  # serialises start/stop/remove so adoption checks are not racy
        self._cpu_samples: dict[str, tuple[float, int, int]] = {}  # id -> (monotonic, cpu ns, domain id)

    # ---- plumbing ------------------------------------------------------------------------------

    def _connect(self) -> Any:
        lv = _lv()
        with self._conn_lock:
            if self._conn is not None:
                try:
                    if self._conn.isAlive():
                        return self._conn
                except lv.libvirtError:
                    pass
                with contextlib.suppress(lv.libvirtError):
                    self._conn.close()
                self._conn = None
            try:
                self._conn = lv.open(self._uri)
            except lv.libvirtError as exc:
                raise RuntimeFailure(f"libvirt not reachable at {self._uri}: {exc}") from exc
            return self._conn

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(fn, *args)

    def _wdir(self, workload_id: str) -> Path:
        if not workload_id or "/" in workload_id or workload_id in (".", ".."):
            raise RuntimeFailure(f"invalid workload id {workload_id!r}", code="InvalidSpec", terminal=True)
        return self._dir / workload_id

    def _accelerator(self) -> Accelerator:
        if self._accel_setting != "auto":
            return self._accel_setting
        return detect_accelerator()

    async def close(self) -> None:
        # Deliberately leaves domains running: they belong to the node, not to this agent process.
        def _close() -> None:
            with self._conn_lock:
                if self._conn is not None:
                    with contextlib.suppress(Exception):
                        self._conn.close()
                    self._conn = None

        await self._run(_close)

    async def probe(self) -> Probe:
        mod, why = _load_libvirt()
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
            f"libvirt:{_version_str(conn.getLibVersion())}",
            "disk:qcow2-overlay",
            "boot:direct-kernel",
            "console:serial-file",
        ]
        try:
            importlib.import_module("pycdlib")
            features.append("cloud-init:nocloud")
        except ImportError:
            pass  # VMs still run; only workloads with cloudInit fail (with a clear reason)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o711)  # QEMU runs as libvirt-qemu and must pass through to each VM's files
        return Probe(available=True, version=f"qemu-{_version_str(hv)}", features=tuple(features))

    # ---- reading -------------------------------------------------------------------------------

    def _is_ours(self, meta: DomainMeta) -> bool:
        return all(meta.labels.get(k) == v for k, v in self._labels.items())

    def _find_sync(self, workload_id: str, strict: bool = False) -> _Found | None:
        """Our domain of a workload. A foreign domain holding its name is None, or a terminal
        Conflict when `strict` (starting would have to take that name)."""
        lv = _lv()
        conn = self._connect()
        try:
            dom = conn.lookupByName(domain_name(workload_id, self._labels))
            xml = dom.XMLDesc(0)
        except lv.libvirtError as exc:
            if _err_code(exc) == lv.VIR_ERR_NO_DOMAIN:
                return None
            raise RuntimeFailure(f"look up VM {workload_id}: {exc}") from exc
        meta = parse_meta(xml)
        if meta is None or meta.workload_id != workload_id or not self._is_ours(meta):
            if not strict:
                return None
            raise RuntimeFailure(
                f"domain {dom.name()} exists but is not a persys VM of this node; remove it by hand",
                code="Conflict",
                terminal=True,
            )
        return _Found(dom, meta, xml)

    def _observe_sync(self, f: _Found, *, ask_agent: bool = False) -> ObservedWorkload:
        lv = _lv()
        try:
            state, reason = f.dom.state()
        except lv.libvirtError as exc:
            if _err_code(exc) == lv.VIR_ERR_NO_DOMAIN:  # removed between lookup and now
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
        obs.state, obs.exit_code, obs.message = _map_state(lv, state, reason)
        if obs.state is RuntimeState.RUNNING and "<interface" in f.xml:
            ips = _addresses(lv, f.dom, ask_agent)
            if ips:
                obs.message = " ".join(x for x in (obs.message, "ip " + ",".join(ips)) if x)
        return obs

    def _stats_sync(self, f: _Found) -> tuple[int, dict[str, Any]]:
        lv = _lv()
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
        obs.memory_bytes = int(st.get("balloon.rss") or st.get("balloon.current") or 0) * 1024
        obs.disk_read_bytes = _sum_indexed(st, "block", "rd.bytes")
        obs.disk_write_bytes = _sum_indexed(st, "block", "wr.bytes")
        obs.net_rx_bytes = _sum_indexed(st, "net", "rx.bytes")
        obs.net_tx_bytes = _sum_indexed(st, "net", "tx.bytes")
        now, used = time.monotonic(), int(st.get("cpu.time", 0))
        prev = self._cpu_samples.get(obs.workload_id)
        if prev is None or prev[2] != dom_id or not 0.2 <= now - prev[0] <= 60:
            # No recent sample of this QEMU process to compare with: take a short second one.
            prev = (now, used, dom_id)
            await asyncio.sleep(0.25)
            dom_id, st2 = await self._run(self._stats_sync, f)
            now, used = time.monotonic(), int(st2.get("cpu.time", used))
        self._cpu_samples[obs.workload_id] = (now, used, dom_id)
        # 100% = one full host core, the same convention as `docker stats`.
        obs.cpu_percent = round(max(0, used - prev[1]) / ((now - prev[0]) * 1e9) * 100, 3)

    async def inspect(self, workload_id: str) -> ObservedWorkload | None:
        f = await self._run(self._find_sync, workload_id)
        if f is None:
            return None
        obs = await self._run(functools.partial(self._observe_sync, f, ask_agent=True))
        if obs.state is RuntimeState.RUNNING:
            await self._add_usage(f, obs)
        return obs

    def _list_sync(self) -> list[ObservedWorkload]:
        lv = _lv()
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
            if meta is None or not self._is_ours(meta) or dom.name() != domain_name(meta.workload_id, self._labels):
                continue
            obs = self._observe_sync(_Found(dom, meta, xml))
            if obs.state is not RuntimeState.MISSING:
                out.append(obs)
        return out

    async def list(self) -> list[ObservedWorkload]:
        return await self._run(self._list_sync)

    async def logs(self, workload_id: str, tail: int = 100) -> str:
        return await self._run(_tail, self._wdir(workload_id) / "console.log", tail)

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

    def _prepare_sync(self, w: RuntimeWorkload, vm: VMSpec, *, reuse_disk: bool) -> DomainConfig:
        base = self._resolve(vm.image, "disk")
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
            name=domain_name(w.workload_id, self._labels),
            domain_type="kvm" if self._accelerator() == "kvm" else "qemu",
            vcpus=vm.vcpus,
            memory_mb=vm.memory_mb,
            disk=disk,
            console_log=console,
            meta=DomainMeta(w.workload_id, w.revision, w.generation, round(time.time(), 3), dict(self._labels)),
            seed=seed if vm.cloud_init is not None else None,
            kernel=kernel,
            initrd=initrd,
            cmdline=vm.cmdline,
            networks=tuple(vm.networks),
        )

    def _boot_sync(self, cfg: DomainConfig) -> _Found:
        lv = _lv()
        conn = self._connect()
        xml = domain_xml(cfg)
        try:
            dom = conn.defineXML(xml)
        except lv.libvirtError as exc:
            code = _err_code(exc)
            terminal = code in (lv.VIR_ERR_XML_ERROR, lv.VIR_ERR_XML_DETAIL, lv.VIR_ERR_CONFIG_UNSUPPORTED)
            raise RuntimeFailure(
                f"define VM: {exc}", code="InvalidSpec" if terminal else "RuntimeError", terminal=terminal
            ) from exc
        try:
            dom.create()
        except lv.libvirtError as exc:
            code = _err_code(exc)
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
        lv = _lv()
        if f is not None:
            name = f.dom.name()
            try:
                if f.dom.isActive():
                    f.dom.destroy()
            except lv.libvirtError as exc:
                if _err_code(exc) not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
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
                if _err_code(exc) != lv.VIR_ERR_NO_DOMAIN:
                    raise RuntimeFailure(f"undefine VM {workload_id}: {exc}") from exc
            # libvirt's own per-domain log would otherwise pile up, one file per workload ever run.
            with contextlib.suppress(OSError):
                (LIBVIRT_QEMU_LOG_DIR / f"{name}.log").unlink(missing_ok=True)
        shutil.rmtree(self._wdir(workload_id), ignore_errors=True)
        self._cpu_samples.pop(workload_id, None)

    async def start(self, w: RuntimeWorkload) -> ObservedWorkload:
        vm = w.spec.vm
        if w.spec.type != "vm" or vm is None:
            raise RuntimeFailure(f"workload type {w.spec.type!r} is not a vm", code="InvalidSpec", terminal=True)
        self._wdir(w.workload_id)
        async with self._lock:
            found = await self._run(self._find_sync, w.workload_id, True)
            uuid = ""
            reuse_disk = False
            if found is not None:
                obs = await self._run(self._observe_sync, found)
                if found.meta.revision == w.revision:
                    if obs.state is RuntimeState.RUNNING:
                        return obs  # adopt: never restart a healthy VM of the desired revision
                    # Same revision, powered off: boot it again on its own disk, as a real machine
                    # would after a power cycle (a new revision starts from a fresh overlay).
                    uuid, reuse_disk = found.dom.UUIDString(), True
                else:
                    # The old disk is discarded, so a graceful guest shutdown would buy nothing.
                    await self._run(self._discard_sync, found, w.workload_id)
            if self._accel_setting == "auto":
                await self._run(detect_accelerator)  # first call may take seconds: not on the loop
            cfg = await self._run(functools.partial(self._prepare_sync, w, vm, reuse_disk=reuse_disk))
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
            self._cpu_samples.pop(w.workload_id, None)
            return await self._run(self._observe_sync, booted)

    async def stop(self, workload_id: str) -> None:
        """ACPI shutdown, then power off after `shutdown_timeout`. The domain, its disk and its
        console log stay, so the state and logs remain inspectable and a start boots it again."""
        async with self._lock:
            f = await self._run(self._find_sync, workload_id)
            if f is None:
                return
            lv = _lv()
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
                if _err_code(exc) not in (lv.VIR_ERR_NO_DOMAIN, lv.VIR_ERR_OPERATION_INVALID):
                    raise RuntimeFailure(f"stop VM {workload_id}: {exc}") from exc

    async def remove(self, workload_id: str) -> None:
        async with self._lock:
            f = await self._run(self._find_sync, workload_id)
            await self._run(self._discard_sync, f, workload_id)


# ---- helpers ---------------------------------------------------------------------------------


def _map_state(lv: Any, state: int, reason: int) -> tuple[RuntimeState, int | None, str]:
    """libvirt (state, reason) -> (state, exit code, message). A guest that powered itself off
    counts as exit code 0, so `OnFailure` does not restart it."""
    if state in (lv.VIR_DOMAIN_RUNNING, lv.VIR_DOMAIN_BLOCKED):
        return RuntimeState.RUNNING, None, ""
    if state == lv.VIR_DOMAIN_PAUSED:
        return RuntimeState.RUNNING, None, "paused"
    if state == lv.VIR_DOMAIN_PMSUSPENDED:
        return RuntimeState.RUNNING, None, "suspended by the guest"
    if state == lv.VIR_DOMAIN_SHUTDOWN:
        return RuntimeState.RUNNING, None, "shutting down"
    if state == lv.VIR_DOMAIN_CRASHED:
        return RuntimeState.FAILED, None, "guest crashed"
    if state == lv.VIR_DOMAIN_SHUTOFF:
        if reason == lv.VIR_DOMAIN_SHUTOFF_SHUTDOWN:
            return RuntimeState.STOPPED, 0, "guest powered off"
        if reason == lv.VIR_DOMAIN_SHUTOFF_DESTROYED:
            return RuntimeState.STOPPED, None, "powered off from the host"
        if reason == lv.VIR_DOMAIN_SHUTOFF_CRASHED:
            return RuntimeState.FAILED, None, "guest crashed"
        if reason == lv.VIR_DOMAIN_SHUTOFF_FAILED:
            return RuntimeState.FAILED, None, "QEMU failed to start the VM"
        if reason == getattr(lv, "VIR_DOMAIN_SHUTOFF_DAEMON", -1):
            return RuntimeState.FAILED, None, "QEMU ended while libvirtd was down"
        return RuntimeState.STOPPED, None, "not running"
    return RuntimeState.FAILED, None, f"unknown domain state {state}/{reason}"


def _sum_indexed(stats: Mapping[str, Any], group: str, key: str) -> int:
    count = int(stats.get(f"{group}.count", 0) or 0)
    return sum(int(stats.get(f"{group}.{i}.{key}", 0) or 0) for i in range(count))


def _addresses(lv: Any, dom: Any, ask_agent: bool) -> list[str]:
    """Best effort, cheapest first: libvirt's DHCP leases, the host's ARP table, and (only when
    asked: a round trip into the guest, which can wait on a busy agent) the guest agent."""
    sources = [lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_LEASE, lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_ARP]
    if ask_agent:
        sources.append(lv.VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT)
    for src in sources:
        try:
            ifaces = dom.interfaceAddresses(src)
        except lv.libvirtError:
            continue
        ips = [
            a["addr"]
            for name, iface in sorted((ifaces or {}).items())
            if name != "lo"
            for a in (iface.get("addrs") or [])
            if a.get("addr") and not str(a["addr"]).startswith(("127.", "::1", "fe80:"))
        ]
        if ips:
            return ips
    return []


def _tail(path: Path, lines: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - (1 << 20)))  # the last 1 MiB is plenty and bounds memory
            data = f.read()
    except FileNotFoundError:
        return ""
    kept = data.decode(errors="replace").splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept)
