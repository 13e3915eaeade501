"""LibvirtVMRuntime: image registry, cloud-init seeds and domain XML (pure), then real VMs under
libvirt + QEMU TCG booting the tiny guest from tests/vm_fixtures.py."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import tarfile
import time
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from persys.agent.runtimes.base import ObservedWorkload, Runtime, RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.vm import (
    DomainConfig,
    DomainMeta,
    ImageError,
    ImageRegistry,
    LibvirtVMRuntime,
    detect_accelerator,
    detect_accelerator_with_reason,
    domain_name,
    domain_xml,
    parse_meta,
)
from persys.agent.runtimes.vm.cloudinit import VOLUME_ID, build_seed, read_seed_iso
from persys.model import parse_manifests
from persys.model.vm_spec import CloudInit, VMSpec
from persys.model.workload import Resources, WorkloadSpec
from tests import vm_fixtures
from tests.agent.runtimes.console_check import check_console
from tests.vm_fixtures import BASE_MARKER, GUEST_BOOTED, GUEST_READY, GUEST_WROTE, TestGuest, VMHost, sha256_of

# Session fixtures (tests/conftest.py does not star-import vm_fixtures): found here by name.
vm_host = vm_fixtures.vm_host
test_guest = vm_fixtures.test_guest

T = TypeVar("T")
needs_qemu_img = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img is not installed")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---- image registry ---------------------------------------------------------------------------


@needs_qemu_img
def test_registry_copies_checksums_and_detects_formats(tmp_path: Path) -> None:
    reg = ImageRegistry(tmp_path / "state")
    raw = tmp_path / "disk.raw"
    raw.write_bytes(b"hello".ljust(1 << 20, b"\0"))
    qcow = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "convert", "-q", "-f", "raw", "-O", "qcow2", str(raw), str(qcow)], check=True)

    r1 = reg.register("base-raw", raw)
    assert (r1.kind, r1.format, r1.virtual_size) == ("disk", "raw", 1 << 20)
    assert r1.sha256 == sha256_bytes(raw.read_bytes())
    assert Path(r1.path).parent == reg.root / "blobs" and Path(r1.path).read_bytes() == raw.read_bytes()
    assert not os.access(r1.path, os.W_OK) or os.geteuid() == 0  # 0444 (root may write anyway)
    assert oct(Path(r1.path).stat().st_mode & 0o777) == "0o444"

    r2 = reg.register("base-qcow", qcow)
    assert (r2.format, r2.virtual_size) == ("qcow2", 1 << 20)
    assert reg.resolve("base-qcow") == r2
    assert [r.name for r in reg.list()] == ["base-qcow", "base-raw"]

    # The same content under another name shares the blob; a new content gets a new blob and
    # leaves the old one (overlays may still use it) untouched.
    assert reg.register("alias", raw).path == r1.path
    raw.write_bytes(b"v2".ljust(1 << 20, b"\0"))
    r3 = reg.register("base-raw", raw)
    assert r3.path != r1.path and Path(r1.path).exists() and reg.verify("alias") and reg.verify("base-raw")

    # A tar archive holding the image (its only regular file, or a named member).
    tgz = tmp_path / "image.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(qcow, arcname="./disk.qcow2")
    assert reg.register("from-tar", tgz).sha256 == r2.sha256
    two = tmp_path / "two.tar"
    with tarfile.open(two, "w") as tar:
        tar.add(qcow, arcname="disk.qcow2")
        tar.add(raw, arcname="other.raw")
    with pytest.raises(ImageError, match="exactly one"):
        reg.register("ambiguous", two)
    assert reg.register("member", two, member="disk.qcow2").format == "qcow2"

    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"\x7fELF kernel")
    assert reg.register("k", kernel, kind="kernel").format == "raw"
    with pytest.raises(ImageError, match="is a kernel, not a disk"):
        reg.resolve("k")
    assert reg.resolve("k", "kernel").kind == "kernel"


@needs_qemu_img
def test_registry_refuses_bad_input(tmp_path: Path) -> None:
    reg = ImageRegistry(tmp_path)
    base = tmp_path / "base.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(base), "1M"], check=True)
    overlay = tmp_path / "overlay.qcow2"
    subprocess.run(
        ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(base), str(overlay)], check=True
    )
    with pytest.raises(ImageError, match="backing file"):
        reg.register("overlay", overlay)
    with pytest.raises(ImageError, match="invalid image name"):
        reg.register("../escape", base)
    with pytest.raises(ImageError, match="not registered"):
        reg.resolve("nope")
    with pytest.raises(ImageError, match="does not exist"):
        reg.resolve("/no/such/disk.img")
    assert reg.resolve(str(base)).format == "qcow2"  # an absolute path is probed, not registered
    assert not list((reg.root / "blobs").glob(".incoming-*"))  # failed registrations leave nothing


# ---- cloud-init seed ------------------------------------------------------------------------


def test_seed_is_a_cidata_iso_with_exact_names(tmp_path: Path) -> None:
    ci = CloudInit(
        user_data="#cloud-config\nruncmd: [echo hi]\n",
        meta_data="public-keys: [ssh-ed25519 AAAA]\n",
        network_config="version: 2\nethernets: {}\n",
        vendor_data="#cloud-config\n{}\n",
    )
    iso = tmp_path / "seed.iso"
    build_seed(iso, "web.2", "abc123", ci)
    vol, files = read_seed_iso(iso)
    assert vol == VOLUME_ID == "cidata"
    assert set(files) == {"user-data", "meta-data", "network-config", "vendor-data"}
    assert files["user-data"] == ci.user_data.encode()
    meta = files["meta-data"].decode()
    assert "instance-id: web.2-abc123" in meta and "local-hostname: web-2" in meta and "public-keys" in meta

    build_seed(iso, "w", "r", CloudInit())  # NoCloud wants both files even when empty
    _vol, files = read_seed_iso(iso)
    assert set(files) == {"user-data", "meta-data"} and files["user-data"] == b""


def test_cloud_init_validation() -> None:
    with pytest.raises(ValueError, match="YAML mapping"):
        CloudInit(meta_data="- a list")
    with pytest.raises(ValueError, match="bridge:<name>"):
        VMSpec(image="x", networks=["bad name"])
    with pytest.raises(ValueError, match="need kernel"):
        VMSpec(image="x", initrd="i")


def test_example_manifest_parses() -> None:
    repo = Path(__file__).resolve().parents[3]
    [m] = parse_manifests((repo / "examples/hello-vm.yaml").read_text(), "hello-vm.yaml")
    assert m.spec.type == "vm" and m.spec.vm is not None and m.spec.vm.cloud_init is not None
    assert m.spec.vm.cloud_init.user_data.startswith("#cloud-config")


# ---- domain XML -----------------------------------------------------------------------------


def test_domain_xml(tmp_path: Path) -> None:
    meta = DomainMeta("web", "rev1", 3, 1700000000.5, {"persys.node": "n1"})
    cfg = DomainConfig(
        name=domain_name("web", {"persys.node": "n1"}),
        domain_type="qemu",
        vcpus=2,
        memory_mb=384,
        disk=tmp_path / "disk.qcow2",
        console_log=tmp_path / "console.log",
        meta=meta,
        seed=tmp_path / "seed.iso",
        kernel="/k/vmlinux",
        initrd="/k/initrd",
        cmdline="quiet",
        networks=("user", "bridge:br0", "default", "network:lab"),
    )
    xml = domain_xml(cfg)
    root = ET.fromstring(xml)
    assert root.get("type") == "qemu"
    assert root.findtext("vcpu") == "2" and root.find("memory").text == "384"  # type: ignore[union-attr]
    assert root.findtext("os/cmdline") == "quiet console=ttyS0"
    assert root.find("devices/graphics") is None  # `<graphics type='none'/>` is invalid for libvirt
    serial, console = root.find("devices/serial"), root.find("devices/console")
    assert serial is not None and console is not None
    assert serial.get("type") == console.get("type") == "pty"  # attachable (persysctl console), and logged:
    assert serial.find("log").get("file") == console.find("log").get("file") == str(cfg.console_log)  # type: ignore[union-attr]
    assert serial.find("log").get("append") == "on"  # type: ignore[union-attr]
    disks = {d.get("device"): d for d in root.findall("devices/disk")}
    assert disks["disk"].find("source").get("file") == str(cfg.disk)  # type: ignore[union-attr]
    assert disks["disk"].find("driver").get("type") == "qcow2"  # type: ignore[union-attr]
    assert disks["cdrom"].find("target").get("bus") == "ide"  # type: ignore[union-attr]
    ifaces = [
        (i.get("type"), dict(i.find("source").attrib) if i.find("source") is not None else {})
        for i in root.findall("devices/interface")
    ]
    assert ifaces == [
        ("user", {}),
        ("bridge", {"bridge": "br0"}),
        ("network", {"network": "default"}),
        ("network", {"network": "lab"}),
    ]
    assert parse_meta(xml) == meta
    assert cfg.name != domain_name("web", {}) == "persys-web"

    bare = domain_xml(
        DomainConfig(
            name="persys-x",
            domain_type="kvm",
            vcpus=1,
            memory_mb=64,
            disk=cfg.disk,
            console_log=cfg.console_log,
            meta=meta,
        )
    )
    root = ET.fromstring(bare)
    assert root.get("type") == "kvm" and root.find("os/kernel") is None and root.find("os/boot") is not None
    assert root.find("devices/interface") is None and root.find("devices/channel") is None
    assert not any(d.get("device") == "cdrom" for d in root.findall("devices/disk"))


# ---- accelerator ----------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="qemu-system-x86_64 is not installed")
def test_detect_accelerator() -> None:
    t0 = time.monotonic()
    accel, reason = detect_accelerator_with_reason()
    first = time.monotonic() - t0
    assert accel in ("kvm", "tcg") and reason
    assert first < 5
    t0 = time.monotonic()
    assert detect_accelerator() == accel
    assert time.monotonic() - t0 < 0.05  # cached
    expected = os.environ.get("PERSYS_EXPECT_ACCEL")
    if expected is None and (not Path("/dev/kvm").exists() or Path("/sys/module/kvm_pvm").exists()):
        # No KVM, or PVM's KVM (this CI host): it runs only PVM-enabled guests at speed.
        expected = "tcg"
    if expected:
        assert accel == expected, reason


# ---- real VMs -------------------------------------------------------------------------------


async def wait_for(pred: Callable[[], Awaitable[T]], within: float, what: str) -> T:
    deadline = time.monotonic() + within
    while True:
        value = await pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.25)


def qemu_pid(name: str) -> int:
    return int(Path(f"/run/libvirt/qemu/{name}.pid").read_text())


def libvirt_log(name: str) -> Path:
    return Path(f"/var/log/libvirt/qemu/{name}.log")


def qemu_img_info(path: Path) -> str:
    # -U: the running VM holds the image's write lock.
    return subprocess.run(
        ["qemu-img", "info", "-U", "--output=json", str(path)], capture_output=True, text=True, check=True
    ).stdout


def virsh(uri: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["virsh", "-c", uri, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
async def guest_images(vm_host: VMHost, test_guest: TestGuest) -> dict[str, str]:
    reg = ImageRegistry(vm_host.state_dir)
    return {
        "disk": reg.register("tiny-disk", test_guest.base_disk).sha256,
        "kernel": reg.register("tiny-kernel", test_guest.kernel, kind="kernel", link=True).sha256,
        "initrd": reg.register("tiny-initrd", test_guest.initrd, kind="initrd").sha256,
    }


@pytest.fixture
async def rt(vm_host: VMHost, guest_images: dict[str, str]) -> AsyncIterator[LibvirtVMRuntime]:
    r = LibvirtVMRuntime(
        vm_host.state_dir, uri=vm_host.uri, shutdown_timeout=1.0, extra_labels={"persys.node": f"node-{vm_host.run_id}"}
    )
    yield r
    await r.close()


def vm_workload(
    wid: str, revision: str, marker: str, *, cmdline: str = "quiet panic=-1", networks: list[str] | None = None
) -> RuntimeWorkload:
    spec = WorkloadSpec(
        type="vm",
        resources=Resources(cpu_millicores=1000, memory_mb=192),
        vm=VMSpec(
            image="tiny-disk",
            kernel="tiny-kernel",
            initrd="tiny-initrd",
            cmdline=cmdline,
            vcpus=1,
            memory_mb=192,
            networks=networks or [],
            cloud_init=CloudInit(user_data=f"#cloud-config\nmarker: {marker}\n"),
        ),
    )
    return RuntimeWorkload(workload_id=wid, revision=revision, generation=1, spec=spec)


async def ready_logs(rt: LibvirtVMRuntime, wid: str, count: int = 1, within: float = 60) -> str:
    async def ready() -> str:
        logs = await rt.logs(wid, tail=1000)
        return logs if logs.count(GUEST_READY) >= count else ""

    return await wait_for(ready, within, f"{GUEST_READY} x{count} in the console log of {wid}")


@pytest.mark.vm
async def test_vm_lifecycle(
    vm_host: VMHost, test_guest: TestGuest, guest_images: dict[str, str], rt: LibvirtVMRuntime
) -> None:
    assert isinstance(rt, Runtime)
    probe = await rt.probe()
    assert probe.available, probe.reason
    assert "cloud-init:nocloud" in probe.features and f"accel:{detect_accelerator()}" in probe.features
    base_sha = sha256_of(test_guest.base_disk)
    blob = Path(rt.images.resolve("tiny-disk").path)
    wid = vm_host.workload_id("life")
    name = domain_name(wid, {"persys.node": f"node-{vm_host.run_id}"})
    wdir = vm_host.state_dir / "vm" / wid
    marker1 = f"seed-{vm_host.run_id}-one"

    # Boot: the guest reads the cloud-init seed and sees the base image through the overlay.
    t0 = time.monotonic()
    obs = await rt.start(vm_workload(wid, "r1", marker1))
    assert obs.state is RuntimeState.RUNNING and obs.revision == "r1" and obs.runtime_id
    busy = await rt.inspect(wid)  # while the guest boots, TCG keeps a core busy
    logs = await ready_logs(rt, wid)
    boot_seconds = time.monotonic() - t0
    print(f"\nVM boot to {GUEST_READY}: {boot_seconds:.1f}s")
    assert marker1 in logs and f"instance-id: {wid}-r1" in logs and "label=cidata" in logs, logs
    assert f"PERSYS-GUEST-DISK {BASE_MARKER}" in logs and f"{GUEST_WROTE} to /dev/vda" in logs
    assert busy is not None and busy.state is RuntimeState.RUNNING
    assert busy.usage.cpu_percent > 1 and busy.usage.memory_bytes > 16 * 1024 * 1024

    await check_console(rt, wid, vm_host.run_id)

    xml = virsh(vm_host.uri, "dumpxml", name).stdout
    dom = ET.fromstring(xml)
    assert dom.get("type") == ("kvm" if detect_accelerator() == "kvm" else "qemu")
    assert dom.find("devices/graphics") is None
    info = qemu_img_info(wdir / "disk.qcow2")
    assert f'"backing-filename": "{blob}"' in info and '"backing-filename-format": "qcow2"' in info

    later = await rt.inspect(wid)
    assert later is not None and later.usage.memory_bytes > 0 and later.usage.cpu_percent >= 0
    assert later.usage.disk_read_bytes > 0 and later.usage.disk_write_bytes > 0  # the guest read the seed, wrote vda

    # Adoption: a new runtime instance (a restarted agent) keeps the running VM.
    pid = qemu_pid(name)
    rt2 = LibvirtVMRuntime(vm_host.state_dir, uri=vm_host.uri, extra_labels={"persys.node": f"node-{vm_host.run_id}"})
    try:
        adopted = await rt2.start(vm_workload(wid, "r1", marker1))
        assert (adopted.runtime_id, adopted.started_at) == (obs.runtime_id, obs.started_at)
        assert qemu_pid(name) == pid
        assert [o.workload_id for o in await rt2.list()] == [wid]
        assert (await rt2.logs(wid, tail=1000)).count(GUEST_BOOTED) == 1
    finally:
        await rt2.close()
    # Another node's scope neither sees nor touches it.
    other = LibvirtVMRuntime(vm_host.state_dir, uri=vm_host.uri, extra_labels={"persys.node": "elsewhere"})
    try:
        assert await other.list() == [] and await other.inspect(wid) is None
    finally:
        await other.close()
    # This cluster's agent, upgraded to cluster ids, adopts the domain it started before them (no
    # cluster label); a domain another cluster started under its id is never another's, even with
    # the same node name (names and labels carry the id).
    node = {"persys.node": f"node-{vm_host.run_id}"}
    upgraded = LibvirtVMRuntime(vm_host.state_dir, uri=vm_host.uri, extra_labels=node, cluster_id="c0ffee01")
    twin = LibvirtVMRuntime(vm_host.state_dir, uri=vm_host.uri, extra_labels=node, cluster_id="c0ffee02")
    try:
        assert (await upgraded.inspect(wid)).runtime_id == obs.runtime_id  # type: ignore[union-attr]
        assert [o.workload_id for o in await upgraded.list()] == [wid]
        theirs = DomainMeta(wid, "r1", 1, 0.0, {**node, "persys.cluster": "c0ffee01"})
        assert upgraded._is_ours(theirs) and not twin._is_ours(theirs) and not twin._is_ours(theirs, legacy=True)
        assert upgraded._names(wid)[0][0] != twin._names(wid)[0][0]
    finally:
        await twin.close()
        await upgraded.close()

    # Stop keeps the domain, disk and log; starting the same revision boots that same disk again.
    await rt.stop(wid)
    stopped = await rt.inspect(wid)
    assert stopped is not None and stopped.state is RuntimeState.STOPPED
    assert (wdir / "disk.qcow2").exists() and marker1 in await rt.logs(wid, tail=1000)
    again = await rt.start(vm_workload(wid, "r1", marker1))
    assert again.state is RuntimeState.RUNNING and again.runtime_id == obs.runtime_id
    logs = await ready_logs(rt, wid, count=2)
    assert f"PERSYS-GUEST-DISK {GUEST_WROTE}" in logs  # what the guest wrote survived the power cycle

    # A new revision replaces the domain: a fresh overlay, a new seed, a new domain uuid and, as
    # with a new container, a new console log. Its guest powers itself off when done, which is a
    # clean stop (exit code 0).
    marker2 = f"seed-{vm_host.run_id}-two"
    replaced = await rt.start(vm_workload(wid, "r2", marker2, cmdline="quiet persys.poweroff", networks=["user"]))
    assert replaced.revision == "r2" and replaced.runtime_id != obs.runtime_id
    logs = await ready_logs(rt, wid)
    assert logs.startswith("--- persys: starting revision r2") and logs.count(GUEST_BOOTED) == 1
    assert marker2 in logs and marker1 not in logs and f"instance-id: {wid}-r2" in logs
    assert f"PERSYS-GUEST-DISK {BASE_MARKER}" in logs
    assert "<interface type='user'>" in virsh(vm_host.uri, "dumpxml", name).stdout

    async def powered_off() -> ObservedWorkload | None:
        o = await rt.inspect(wid)
        return o if o is not None and o.state is not RuntimeState.RUNNING else None

    off = await wait_for(powered_off, 30, "the guest to power off")
    # User-mode networking: QEMU's built-in DHCP server leased the guest an address.
    assert "PERSYS-GUEST-IP 10.0.2.15" in await rt.logs(wid, tail=1000)
    assert (off.state, off.exit_code, off.message) == (RuntimeState.STOPPED, 0, "guest powered off")
    assert [(o.workload_id, o.state) for o in await rt.list()] == [(wid, RuntimeState.STOPPED)]

    # Remove leaves nothing behind, and the base image never changed.
    await rt.remove(wid)
    assert await rt.inspect(wid) is None and await rt.list() == []
    assert virsh(vm_host.uri, "dominfo", name).returncode != 0
    assert not wdir.exists()
    assert not libvirt_log(name).exists()
    assert sha256_of(test_guest.base_disk) == base_sha
    assert sha256_of(blob) == guest_images["disk"] == base_sha
    await rt.remove(wid)  # idempotent


@pytest.mark.vm
async def test_vm_start_failures_leave_nothing(vm_host: VMHost, rt: LibvirtVMRuntime) -> None:
    wid = vm_host.workload_id("bad")
    w = vm_workload(wid, "r1", "x")
    assert w.spec.vm is not None
    w.spec.vm.image = "not-registered"
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(w)
    assert err.value.code == "ImageNotFound" and err.value.terminal

    w = vm_workload(wid, "r1", "x", networks=[f"network:missing-{vm_host.run_id}"])
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(w)
    assert err.value.code == "NetworkNotFound" and err.value.terminal
    assert await rt.inspect(wid) is None
    assert not (vm_host.state_dir / "vm" / wid).exists()

    with pytest.raises(RuntimeFailure, match="not a vm"):
        await rt.start(
            RuntimeWorkload(
                wid, "r1", 1, WorkloadSpec.model_validate({"type": "process", "process": {"command": ["true"]}})
            )
        )


async def test_probe_without_daemon(tmp_path: Path) -> None:
    r = LibvirtVMRuntime(tmp_path, uri="qemu+unix:///system?socket=/nonexistent/libvirt-sock")
    p = await r.probe()
    assert not p.available and p.reason
    await r.close()


@pytest.mark.vm
@pytest.mark.skipif(
    os.environ.get("PERSYS_VM_NET_TESTS") != "1",
    reason="creates a host bridge and firewall rules: opt in with PERSYS_VM_NET_TESTS=1",
)
async def test_vm_address_from_dhcp_lease(vm_host: VMHost, rt: LibvirtVMRuntime) -> None:
    """An isolated libvirt network (DHCP on a host bridge, no forwarding): the guest's address
    reaches `message` through libvirt's lease table, and the tap device yields rx/tx counters."""
    net = f"persys-t{vm_host.run_id}"
    xml = (
        f"<network><name>{net}</name><bridge name='vbr-{vm_host.run_id}'/>"
        "<ip address='192.168.251.1' netmask='255.255.255.0'>"
        "<dhcp><range start='192.168.251.10' end='192.168.251.50'/></dhcp></ip></network>"
    )
    created = virsh(vm_host.uri, "net-create", "/dev/stdin", stdin=xml)
    if created.returncode != 0:
        pytest.skip(f"cannot create a libvirt network here: {created.stderr.strip()}")
    wid = vm_host.workload_id("dhcp")
    try:
        await rt.start(vm_workload(wid, "r1", "dhcp", networks=[f"network:{net}"]))

        async def addressed() -> ObservedWorkload | None:
            o = await rt.inspect(wid)
            return o if o is not None and "ip 192.168.251." in o.message else None

        o = await wait_for(addressed, 60, "a DHCP lease")
        assert o.usage.net_rx_bytes > 0 and o.usage.net_tx_bytes > 0
        assert "ip 192.168.251." in (await rt.list())[0].message
    finally:
        await rt.remove(wid)
        virsh(vm_host.uri, "net-destroy", net)
