"""MicroVM runtime on real QEMU (`-M microvm`, TCG here): boot, adoption, replacement, removal, usage.

The guest (tests/microvm_fixtures.py) is Debian's kernel plus a busybox initramfs that prints a
marker taken from the kernel command line, mounts the ext4 rootfs from /dev/vda, prints a file from
it and writes one to it. Each boot takes about 2-3 s under TCG.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, RuntimeState, RuntimeWorkload
from persys.agent.runtimes.microvm import FirecrackerHypervisor, MicroVMRuntime, QemuHypervisor
from persys.agent.runtimes.microvm.kernel import ensure_elf_kernel
from persys.agent.runtimes.microvm.supervise import socket_path
from persys.agent.runtimes.supervision import proc_info
from persys.model.manifest import parse_manifests
from persys.model.workload import WorkloadSpec
from tests.agent.runtimes.console_check import check_console
from tests.microvm_fixtures import (  # noqa: F401
    BOOT_MARKER,
    PERSISTED_MARKER,
    POWEROFF_MARKER,
    READY_MARKER,
    ROOTFS_MARKER,
    ROOTFS_TEXT,
    GuestImages,
    microvm_guest,
    qemu_available,
)

pytestmark = pytest.mark.skipif(not qemu_available(), reason="qemu-system-x86_64 is not installed")

BOOT_TIMEOUT = 60.0  # generous: TCG on a loaded CI host


def _spec(guest: GuestImages, marker: str, *, rootfs: bool = True, kernel: Path | None = None,
          extra: str = "", hypervisor: str = "qemu") -> WorkloadSpec:
    return WorkloadSpec.model_validate({"type": "microvm", "microvm": {
        "kernel": str(kernel or guest.kernel),
        "initrd": str(guest.initrd),
        **({"rootfs": str(guest.rootfs)} if rootfs else {}),
        # quiet: only the markers and errors on the console; pci=off: microvm has no PCI bus.
        "cmdline": f"console=ttyS0 quiet pci=off persys.marker={marker} {extra}".strip(),
        "memoryMb": 128,
        "hypervisor": hypervisor,
    }})


def _workload(wid: str, spec: WorkloadSpec) -> RuntimeWorkload:
    return RuntimeWorkload(wid, spec.spec_revision(), 1, spec)


def _runtime(state: Path) -> MicroVMRuntime:
    # Short grace: the test guest has no ACPI power-button handler, so a stop always escalates.
    return MicroVMRuntime(state, grace_seconds=0.5)


@pytest.fixture(autouse=True)
async def _no_vm_left_behind(tmp_path: Path) -> AsyncIterator[None]:
    """Removes whatever a test left in its state dir, so a failed test never leaks a running QEMU."""
    yield
    rt = _runtime(tmp_path)
    for obs in await rt.list():
        await rt.remove(obs.workload_id)


async def _wait_log(rt: MicroVMRuntime, wid: str, needle: str, after: str = "", within: float = BOOT_TIMEOUT) -> str:
    """The console log (from the first `after` on) once `needle` appears in it; fails after `within` s."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        log = await rt.logs(wid, tail=200)
        part = log.split(after, 1)[1] if after and after in log else (log if not after else "")
        if needle in part:
            return part
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{needle!r} not in the console of {wid} after {within} s:\n{log[-3000:]}")
        await asyncio.sleep(0.1)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _qemu_pids_for(wdir: Path) -> list[int]:
    out = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"qemu-system" in cmd and str(wdir).encode() in cmd:
                info = proc_info(int(entry.name))
                if info is not None and info.state != "Z":
                    out.append(int(entry.name))
    return out


async def test_probe_advertises_working_qemu(tmp_path: Path) -> None:
    verdicts = tmp_path / "verdicts"
    qemu = QemuHypervisor(tmp_path / "cache", verdicts=verdicts)
    rt = MicroVMRuntime(tmp_path, hypervisors={"firecracker": FirecrackerHypervisor(binary="/nonexistent/firecracker"),
                                               "qemu": qemu})
    probe = await rt.probe()
    assert probe.available, probe.reason
    assert "hypervisor:qemu" in probe.features
    accel = [f for f in probe.features if f.startswith("accel:")]
    assert accel in (["accel:tcg"], ["accel:kvm"])
    assert re.match(r"^(firecracker-\S+,)?qemu-\d+\.\d+", probe.version)
    # The accelerator verdict is kept for the host's other agents and the next start.
    assert len(list(verdicts.glob("microvm-accel-*.json"))) == 1
    again = QemuHypervisor(tmp_path / "other-cache", verdicts=verdicts)
    assert await again.accelerator() == await qemu.accelerator()


async def test_firecracker_not_advertised_where_kvm_fails_the_speed_check(tmp_path: Path) -> None:
    qemu_probe = await QemuHypervisor(tmp_path / "cache").probe()
    if "kvm:unusable" not in qemu_probe.features:
        pytest.skip("KVM passes QEMU's speed check here, or /dev/kvm is not accessible at all")
    firecracker = tmp_path / "firecracker"  # only --version is asked of it
    firecracker.write_text('#!/bin/sh\necho "Firecracker v1.17.0"\n')
    firecracker.chmod(0o755)
    rt = MicroVMRuntime(tmp_path, hypervisors={
        "firecracker": FirecrackerHypervisor(binary=str(firecracker)),
        "qemu": QemuHypervisor(tmp_path / "cache"),
    })
    probe = await rt.probe()
    assert probe.available and "hypervisor:qemu" in probe.features
    assert "hypervisor:firecracker" not in probe.features


async def test_probe_unavailable_without_any_hypervisor(tmp_path: Path) -> None:
    rt = MicroVMRuntime(tmp_path, hypervisors={
        "firecracker": FirecrackerHypervisor(binary="/nonexistent/firecracker"),
        "qemu": QemuHypervisor(tmp_path / "cache", binary="/nonexistent/qemu-system-x86_64"),
    })
    probe = await rt.probe()
    assert not probe.available
    assert "firecracker" in probe.reason and "qemu" in probe.reason


async def test_firecracker_requested_but_missing_is_terminal(microvm_guest: GuestImages, tmp_path: Path) -> None:  # noqa: F811
    rt = MicroVMRuntime(tmp_path, hypervisors={
        "firecracker": FirecrackerHypervisor(binary="/nonexistent/firecracker"),
        "qemu": QemuHypervisor(tmp_path / "cache"),
    })
    spec = _spec(microvm_guest, "x", hypervisor="firecracker")
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(_workload("fc-missing", spec))
    assert err.value.code == "HypervisorUnavailable" and err.value.terminal


async def test_invalid_host_files_are_terminal(microvm_guest: GuestImages, tmp_path: Path) -> None:  # noqa: F811
    rt = _runtime(tmp_path)
    missing = _spec(microvm_guest, "x", kernel=tmp_path / "no-such-kernel")
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(_workload("bad-kernel", missing))
    assert err.value.code == "ImageNotFound" and err.value.terminal  # as a VM's missing image
    junk = tmp_path / "junk-kernel"
    junk.write_bytes(b"not a kernel" * 100)
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(_workload("junk-kernel", _spec(microvm_guest, "x", kernel=junk)))
    assert err.value.code == "InvalidSpec" and "bzImage" in str(err.value)
    no_tap = WorkloadSpec.model_validate({"type": "microvm", "microvm": {
        "kernel": str(microvm_guest.kernel), "tapDevices": ["persys-no-tap"]}})
    with pytest.raises(RuntimeFailure) as err:
        await rt.start(_workload("no-tap", no_tap))
    assert err.value.code == "NetworkUnavailable" and not err.value.terminal
    assert await rt.list() == []


def test_example_manifest_parses() -> None:
    repo = Path(__file__).resolve().parents[3]
    [m] = parse_manifests((repo / "examples/hello-microvm.yaml").read_text(), "hello-microvm.yaml")
    assert m.spec.type == "microvm" and m.spec.microvm is not None
    assert m.spec.microvm.hypervisor == "auto" and m.spec.microvm.kernel.startswith("/")


def test_bzimage_is_unpacked_to_the_same_vmlinux(microvm_guest: GuestImages, tmp_path: Path) -> None:  # noqa: F811
    cached = ensure_elf_kernel(microvm_guest.bzimage, tmp_path)
    assert cached.parent == tmp_path and _digest(cached) == _digest(microvm_guest.kernel)
    assert ensure_elf_kernel(microvm_guest.bzimage, tmp_path) == cached  # unpacked once
    assert ensure_elf_kernel(microvm_guest.kernel, tmp_path) == microvm_guest.kernel  # an ELF as it is


@pytest.mark.vm
async def test_boot_adopt_replace_remove(microvm_guest: GuestImages, tmp_path: Path) -> None:  # noqa: F811
    base = {p: _digest(p) for p in (microvm_guest.kernel, microvm_guest.initrd, microvm_guest.rootfs)}
    rt = _runtime(tmp_path)
    spec = _spec(microvm_guest, "first-boot")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    obs = await rt.start(_workload("vm1", spec))
    assert obs.state is RuntimeState.RUNNING and obs.message.startswith("qemu")
    log = await _wait_log(rt, "vm1", f"{ROOTFS_MARKER} {ROOTFS_TEXT}")
    boot_seconds = loop.time() - t0
    assert f"{BOOT_MARKER} first-boot" in log
    print(f"\nmicroVM boot to rootfs marker: {boot_seconds:.1f} s")  # shown with -s
    # Its folder (disk copy, console, sockets) and console log are the agent's alone (issue #30).
    wdir = tmp_path / "microvm" / "vm1"
    assert wdir.stat().st_mode & 0o077 == 0 and (wdir / "console.log").stat().st_mode & 0o077 == 0

    # Usage: the VMM's CPU and memory from /proc, disk counters from QMP query-blockstats.
    got = await rt.inspect("vm1")
    assert got is not None and got.state is RuntimeState.RUNNING
    assert got.usage.memory_bytes > 16 * 1024 * 1024 and got.usage.cpu_percent >= 0.0
    assert got.usage.disk_read_bytes > 0 and got.usage.disk_write_bytes > 0

    # A new runtime instance (a restarted agent) adopts the running VM: same process, no reboot.
    rt2 = _runtime(tmp_path)
    adopted = await rt2.start(_workload("vm1", spec))
    assert adopted.runtime_id == obs.runtime_id and adopted.state is RuntimeState.RUNNING
    assert [o.workload_id for o in await rt2.list()] == ["vm1"]
    assert (await rt2.logs("vm1")).count(BOOT_MARKER) == 1

    # A new revision replaces the VM.
    spec2 = _spec(microvm_guest, "second-boot")
    replaced = await rt2.start(_workload("vm1", spec2))
    assert replaced.runtime_id != obs.runtime_id
    assert int(obs.runtime_id) not in _qemu_pids_for(tmp_path / "microvm" / "vm1")
    second = await _wait_log(rt2, "vm1", READY_MARKER, after=f"{BOOT_MARKER} second-boot")
    assert f"{ROOTFS_MARKER} {ROOTFS_TEXT}" in second
    # ...on a fresh overlay of the base image: the first boot's write is not there.
    assert PERSISTED_MARKER not in second
    await check_console(rt2, "vm1", "microvm")
    console_socket = socket_path(tmp_path / "microvm" / "vm1", "console.sock")
    assert console_socket.exists()

    # remove: the VMM is gone, with every file it had (overlay, QMP socket, logs).
    await rt2.remove("vm1")
    assert _qemu_pids_for(tmp_path / "microvm" / "vm1") == []
    assert not (tmp_path / "microvm" / "vm1").exists() and not console_socket.exists()
    assert await rt2.inspect("vm1") is None and await rt2.list() == []
    # The guest wrote to its disk, but only ever to the overlay: the base images are unchanged.
    assert {p: _digest(p) for p in base} == base


@pytest.mark.vm
async def test_guest_poweroff_is_a_clean_stop_even_after_adoption(
    microvm_guest: GuestImages, tmp_path: Path  # noqa: F811
) -> None:
    rt = _runtime(tmp_path)
    spec = _spec(microvm_guest, "bye", rootfs=False, extra="persys.poweroff")
    await rt.start(_workload("vm2", spec))
    await _wait_log(rt, "vm2", POWEROFF_MARKER)
    # A wall-clock deadline, not a count of polls: each inspect of a running VM samples its usage,
    # which under load takes long enough that 300 polls once stalled a run for minutes.
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        obs = await rt.inspect("vm2")
        if obs is not None and obs.state is not RuntimeState.RUNNING:
            break
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"the guest powered off but its VMM still runs after 60 s: {obs}\n"
                        f"{await rt.logs('vm2', tail=20)}")
        await asyncio.sleep(0.1)
    assert obs is not None and obs.state is RuntimeState.STOPPED and obs.exit_code == 0, obs
    # A later agent still knows it was a clean exit (exit status file written by the wrapper),
    # so restartPolicy OnFailure leaves it alone.
    later = await _runtime(tmp_path).inspect("vm2")
    assert later is not None and later.state is RuntimeState.STOPPED and later.exit_code == 0
    await rt.remove("vm2")
    assert not (tmp_path / "microvm" / "vm2").exists()


@pytest.mark.vm
async def test_stop_then_start_same_revision_keeps_the_disk(
    microvm_guest: GuestImages, tmp_path: Path  # noqa: F811
) -> None:
    rt = _runtime(tmp_path)
    spec = _spec(microvm_guest, "keep")
    first = await rt.start(_workload("vm3", spec))
    await _wait_log(rt, "vm3", ROOTFS_MARKER)
    await rt.stop("vm3")
    stopped = await rt.inspect("vm3")
    assert stopped is not None and stopped.state is RuntimeState.STOPPED and stopped.message == "stopped by agent"
    assert (tmp_path / "microvm" / "vm3" / "rootfs.qcow2").exists()  # stop keeps disk and logs
    again = await rt.start(_workload("vm3", spec))
    assert again.runtime_id != first.runtime_id and again.state is RuntimeState.RUNNING
    # The same overlay: the second boot finds the file the first one wrote.
    await _wait_log(rt, "vm3", PERSISTED_MARKER, after=f"{BOOT_MARKER} keep")
    await rt.remove("vm3")
