"""A VM (libvirt) and a microVM (QEMU microvm) on a `persys dev` cluster: both reach Running,
`persysctl top` shows live CPU and memory for them, `persysctl logs` reads their consoles and
`persysctl console` types into them."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import shutil
import signal
import tempfile
import time
import uuid
from pathlib import Path
from typing import TypeVar

import pytest

from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.microvm_fixtures import BOOT_MARKER, GuestImages, microvm_guest  # noqa: F401
from tests.vm_fixtures import GUEST_READY, TestGuest, linked_into, test_guest, vm_host  # noqa: F401
from tests.waiting import PROCESS_POLL

pytestmark = [pytest.mark.e2e, pytest.mark.vm]
T = TypeVar("T")


def test_vm_and_microvm_run_and_report_usage(test_guest: TestGuest, microvm_guest: GuestImages) -> None:  # noqa: F811
    # Not under pytest's tmp dir (0700): QEMU runs as libvirt-qemu and must reach the VM's files.
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="persys-e2e-vms-"))
    home.chmod(0o755)
    env = {"PERSYS_HOME": str(home)}
    token = uuid.uuid4().hex[:8]
    # The workload policy admits node paths only under Persys' own directories (persys dev: its
    # data dir), and the agent re-checks the real path: hard links there, not symbolic ones.
    images = home / "dev" / "images"
    images.mkdir(parents=True)
    test_guest, microvm_guest = _placed(test_guest, images / "vm"), _placed(microvm_guest, images / "microvm")
    vm = f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: tiny-vm}}
spec:
  type: vm
  resources: {{cpuMillicores: 1000, memoryMb: 256}}
  vm:
    image: {test_guest.base_disk}
    kernel: {test_guest.kernel}
    initrd: {test_guest.initrd}
    cmdline: console=ttyS0
    memoryMb: 256
    cloudInit: {{userData: "#cloud-config\\n# token {token}\\n"}}
"""
    microvm = f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: tiny-microvm}}
spec:
  type: microvm
  resources: {{cpuMillicores: 500, memoryMb: 160}}
  microvm:
    kernel: {microvm_guest.kernel}
    initrd: {microvm_guest.initrd}
    rootfs: {microvm_guest.rootfs}
    cmdline: "console=ttyS0 quiet pci=off persys.marker={token}"
    memoryMb: 128
"""
    started = time.time()
    dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "vm-node"), home, env=env)
    try:
        dev.wait_for("Press Ctrl-C to stop.", timeout=120)
        ctl("apply", "-f", "-", env=env, stdin=vm)
        ctl("apply", "-f", "-", env=env, stdin=microvm)

        def usage() -> dict[str, dict] | None:  # type: ignore[type-arg]
            rows = {r["name"]: r for r in json.loads(ctl("top", "-o", "json", env=env).stdout)}
            ok = all(n in rows and rows[n]["ready"] == "1/1" and rows[n]["memoryBytes"] > 0
                     and rows[n]["cpuPercent"] > 0 for n in ("tiny-vm", "tiny-microvm"))
            return rows if ok else None

        rows, took = eventually(usage, 90, "both running with usage reported")
        print(f"VM and microVM running with live usage after {took:.1f}s: "
              + ", ".join(f"{n} cpu {r['cpuPercent']:.1f}% mem {r['memoryBytes'] >> 20} MiB" for n, r in rows.items()))
        eventually(lambda: GUEST_READY in ctl("logs", "tiny-vm", "--tail", "200", env=env).stdout, 60, "VM console",
                   interval=PROCESS_POLL)
        assert token in ctl("logs", "tiny-vm", "--tail", "200", env=env).stdout  # the guest read its seed
        # persysctl console: keys from a pipe reach the guest's shell, its answer comes back, and
        # with the input at its end persysctl leaves once the output is quiet.
        p = ctl("console", "tiny-vm", "--linger", "3", env=env, stdin=f"echo console-{token}-$((6*7))\n")
        assert f"console-{token}-42" in p.stdout and "connected to the console of tiny-vm" in p.stderr, p
        eventually(lambda: f"{BOOT_MARKER} {token}" in ctl("logs", "tiny-microvm", env=env).stdout, 60,
                   "microVM console", interval=PROCESS_POLL)
        # Console output is timed by when the agent saw it appear (logs --since / --timestamps).
        for name, marker in (("tiny-vm", GUEST_READY), ("tiny-microvm", f"{BOOT_MARKER} {token}")):
            stamped = [line.split(" ", 1) for line in
                       ctl("logs", name, "--since", "10m", "--tail", "0", "--timestamps", env=env).stdout.splitlines()]
            times = [dt.datetime.fromisoformat(t[:26] + "+00:00").timestamp() for t, _ in stamped]  # µs of ns
            assert any(marker in text for _, text in stamped), (name, stamped)
            assert started - 5 <= min(times) and max(times) <= time.time() + 5, (name, started, times)
            assert ctl("logs", name, "--since", "1s", "--tail", "0", env=env).stdout.count(marker) == 0
        ctl("delete", "workload", "tiny-vm", env=env)
        ctl("delete", "workload", "tiny-microvm", env=env)
    finally:
        dev.stop(signal.SIGINT)
        shutil.rmtree(home, ignore_errors=True)


def _placed(guest: T, where: Path) -> T:
    """The same guest images, linked (or copied, across file systems) into `where`."""
    where.mkdir(parents=True)
    moved: dict[str, Path] = {}
    for field, value in vars(guest).items():
        if isinstance(value, Path) and value.is_file():
            moved[field] = linked_into(value, where, f"{field}-{value.name}")
    return dataclasses.replace(guest, **moved)  # type: ignore[type-var]
