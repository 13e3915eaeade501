"""Whether KVM really runs guest code at hardware speed: the one probe the VM and microVM runtimes share.

On nested/PVM hosts /dev/kvm exists but a plain guest runs about 1000x slower than under TCG (or
QEMU aborts on an MSR), so opening /dev/kvm proves nothing. The probe boots a 64 KiB firmware
whose reset vector (F000:FFF0, real mode) spins 10M iterations and then writes one byte to the
first serial port: real KVM does that in a few milliseconds, TCG in about 25 ms, emulated "KVM"
in seconds. No SeaBIOS, no kernel, no disk. The caller names the machine type (`pc` for libvirt
domains, `microvm` for microVMs) and the CPU model its guests will get.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Literal

from persys.agent.runtimes.host_verdicts import shared_verdict

log = logging.getLogger(__name__)

Accelerator = Literal["kvm", "tcg"]

# mov ecx,10000000; addr32 loop $; mov al,'K'; mov dx,0x3f8; out dx,al; hlt. Everything before
# it is hlt padding.
_RESET_VECTOR = bytes.fromhex("66b980969800" "67e2fd" "b04b" "baf803" "ee" "f4")
PROBE_FIRMWARE = b"\xf4" * (65536 - 16) + _RESET_VECTOR
PROBE_BYTE = b"K"
KVM_DEADLINE = 2.0  # real KVM answers in milliseconds; PVM-emulated guests take ~6 s


def kvm_device_problem() -> str:
    """Why /dev/kvm cannot be used by this process, or "" when it can be opened read-write."""
    if not os.path.exists("/dev/kvm"):
        return "/dev/kvm does not exist"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return "/dev/kvm is not accessible"
    return ""


def write_firmware(path: Path) -> Path:
    """The probe firmware at `path`, written only when missing or different."""
    if not path.exists() or path.read_bytes() != PROBE_FIRMWARE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(PROBE_FIRMWARE)
    return path


def firmware_runs(
    qemu: str, firmware: Path, *, machine: str, accel: Accelerator, cpu: str | None = None, deadline: float
) -> tuple[bool, str]:
    """Boots the probe firmware; (True, "") if its byte reached the serial port within `deadline`
    seconds, else (False, why). Blocks: call it from a worker thread."""
    argv = [
        qemu, "-M", machine, "-accel", accel, *(["-cpu", cpu] if cpu else []), "-nodefaults",
        "-no-user-config", "-nographic", "-bios", str(firmware), "-m", "16", "-serial", "stdio",
    ]  # fmt: skip
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        return False, f"cannot run {qemu}: {exc}"
    assert proc.stdout is not None and proc.stderr is not None
    got, end = b"", time.monotonic() + deadline
    try:
        while not got and (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if not ready:
                break
            got = os.read(proc.stdout.fileno(), 1)
            if not got:
                break  # QEMU exited (KVM could not even set up the vCPU)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        _, err = proc.communicate()
    if got == PROBE_BYTE:
        return True, ""
    if not got and time.monotonic() >= end:
        return False, f"a 10M-instruction {accel.upper()} guest did not finish within {deadline:g}s"
    last = (err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    return False, f"probe guest failed: {last}"


# ---- libvirt domains: machine `pc`, the default CPU model (what a domain without <cpu> gets) ----

_domain_accel: dict[str, tuple[Accelerator, str]] = {}
_domain_lock = threading.Lock()


def _try_domain_kvm(qemu: str, timeout: float) -> tuple[Accelerator, str]:
    if not qemu:
        return "tcg", "qemu-system-x86_64 not found"
    if why := kvm_device_problem():
        return "tcg", why
    with tempfile.TemporaryDirectory(prefix="persys-kvm-probe-") as tmp:
        ok, why = firmware_runs(qemu, write_firmware(Path(tmp) / "fw.bin"), machine="pc", accel="kvm",
                                deadline=timeout)
    if ok:
        return "kvm", "KVM ran the probe guest"
    return "tcg", f"KVM probe failed: {why}" + (" (emulated/nested KVM)" if "did not finish" in why else "")


def detect_accelerator(qemu: str | None = None, *, timeout: float = KVM_DEADLINE) -> Accelerator:
    """ "kvm" when KVM really runs guest code at hardware speed, else "tcg". Cached per binary;
    takes well under a second where KVM works or fails outright, at most `timeout` otherwise."""
    return detect_accelerator_with_reason(qemu, timeout=timeout)[0]


def detect_accelerator_with_reason(
    qemu: str | None = None, *, timeout: float = KVM_DEADLINE, verdicts: Path | None = None
) -> tuple[Accelerator, str]:
    """The verdict and why; worked out once per boot for every agent on the host (`host_verdicts`,
    in `verdicts` when given) and kept in this process."""
    exe = qemu or shutil.which("qemu-system-x86_64") or ""
    with _domain_lock:
        if exe not in _domain_accel:
            _domain_accel[exe] = _host_domain_accel(exe, timeout, verdicts)
            log.info("VM accelerator: %s (%s)", *_domain_accel[exe])
        return _domain_accel[exe]


def _host_domain_accel(exe: str, timeout: float, verdicts: Path | None) -> tuple[Accelerator, str]:
    try:
        st = os.stat(exe) if exe else None
    except OSError:
        st = None
    if st is None or kvm_device_problem():
        return _try_domain_kvm(exe, timeout)  # answers at once: nothing to share

    def probe() -> dict[str, str]:
        accel, why = _try_domain_kvm(exe, timeout)
        return {"accel": accel, "why": why}

    key = {"v": 1, "qemu": exe, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "host": platform.release()}
    doc = shared_verdict("domain-accel", key, probe, verdicts)
    accel: Accelerator = "kvm" if doc.get("accel") == "kvm" else "tcg"
    return accel, str(doc.get("why", ""))
