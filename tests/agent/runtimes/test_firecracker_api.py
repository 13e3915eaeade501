"""The Firecracker backend's API traffic, checked against Firecracker's published OpenAPI document.

No Firecracker binary can be obtained on our machines (not in Debian, PyPI or npm, and no source
build without GitHub/crates.io), and the hosts' KVM could not run a Debian guest at a usable speed
anyway. So these tests run the real backend code (spawn, API client, boot sequence, stop, metrics)
against an in-process HTTP server on a unix socket that records every request and answers the way
Firecracker's API document says (204 for PUTs). That recorder stands in ONLY because no Firecracker
binary exists here; `test_real_firecracker_boots_guest` runs the same backend against a real
binary wherever one is on PATH.

Every recorded request must name an operation of /work/shared/firecracker/firecracker.yaml
(method + path template), and its JSON body must validate against that operation's body schema
with $refs resolved, made strict (no properties the document does not declare, as Firecracker's
own deserializer refuses unknown fields).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from persys.agent.runtimes.base import RuntimeState, RuntimeWorkload
from persys.agent.runtimes.microvm import FirecrackerHypervisor, HypervisorError, MicroVMRuntime, QemuHypervisor
from persys.agent.runtimes.microvm.hypervisor import VMConfig
from persys.model.workload import WorkloadSpec
from tests.microvm_fixtures import BOOT_MARKER, GuestImages, microvm_guest  # noqa: F401

SPEC_PATH = Path(__file__).resolve().parents[3].parent / "shared" / "firecracker" / "firecracker.yaml"
if not SPEC_PATH.exists():  # CI lays shared/ beside the clone; a work tree has it at /work/shared
    SPEC_PATH = Path("/work/shared/firecracker/firecracker.yaml")


# ---- the OpenAPI contract ---------------------------------------------------------------------


def _strict(schema: Any) -> Any:
    """Object schemas without an explicit additionalProperties refuse undeclared properties."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@dataclass(frozen=True)
class Operation:
    template: str
    method: str
    params: dict[str, str]
    body_schema: dict[str, Any] | None
    path_param_types: dict[str, str]


class FirecrackerContract:
    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.definitions = _strict(copy.deepcopy(doc["definitions"]))

    def operation(self, method: str, path: str) -> Operation:
        for template, ops in self.doc["paths"].items():
            regex = "^" + re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template)) + "$"
            m = re.match(regex, path)
            if m is None or method.lower() not in ops:
                continue
            op = ops[method.lower()]
            body = next((p["schema"] for p in op.get("parameters", []) if p["in"] == "body"), None)
            types = {p["name"]: p.get("type", "") for p in op.get("parameters", []) if p["in"] == "path"}
            return Operation(template, method, m.groupdict(), body, types)
        raise AssertionError(f"{method} {path} is not an operation of the Firecracker API")

    def validate(self, method: str, path: str, body: Any) -> Operation:
        op = self.operation(method, path)
        assert set(op.params) == set(op.path_param_types), op
        assert all(op.path_param_types[k] == "string" for k in op.params)
        if op.body_schema is None:
            assert body is None, f"{method} {path} takes no body but got {body!r}"
            return op
        assert body is not None, f"{method} {path} needs a body"
        # $refs ("#/definitions/X") resolve against the document's definitions; Swagger 2.0 schemas are draft 4.
        schema = {**_strict(op.body_schema), "definitions": self.definitions}
        jsonschema.Draft4Validator(schema).validate(body)
        return op


@pytest.fixture(scope="module")
def contract() -> FirecrackerContract:
    return FirecrackerContract(yaml.safe_load(SPEC_PATH.read_text()))


# ---- the recording stand-in for Firecracker's API server ----------------------------------------


@dataclass
class Recorded:
    method: str
    path: str
    content_type: str
    body: Any


class RecordingFirecracker:
    """HTTP/1.1 on a unix socket: records requests, answers like Firecracker's API document.

    It stands in for Firecracker ONLY because no Firecracker binary exists on this machine.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.requests: list[Recorded] = []
        self.fail: dict[tuple[str, str], tuple[int, str]] = {}  # (method, path) -> (status, fault)
        self.metrics_path: Path | None = None
        self.flushes = 0
        self._server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line.strip():
                    break
                method, target, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    k, _, v = h.decode().partition(":")
                    headers[k.strip().lower()] = v.strip()
                raw = await reader.readexactly(int(headers.get("content-length", "0")))
                body = json.loads(raw) if raw else None
                self.requests.append(Recorded(method, target, headers.get("content-type", ""), body))
                status, payload = self._answer(method, target, body)
                data = json.dumps(payload).encode() if payload is not None else b""
                reason = {200: "OK", 204: "No Content", 400: "Bad Request"}.get(status, "Error")
                head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(data)}\r\n"
                head += "Content-Type: application/json\r\n" if data else ""
                writer.write(head.encode() + b"\r\n" + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _answer(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if (method, path) in self.fail:
            status, fault = self.fail[(method, path)]
            return status, {"fault_message": fault}
        if method == "GET" and path == "/":
            return 200, {"app_name": "Firecracker", "id": "anonymous-instance", "state": "Running",
                         "vmm_version": "1.17.0-dev"}
        if method == "GET" and path == "/version":
            return 200, {"firecracker_version": "1.17.0-dev"}
        if method == "PUT" and path == "/metrics":
            self.metrics_path = Path(body["metrics_path"])
        if method == "PUT" and path == "/actions" and body.get("action_type") == "FlushMetrics":
            # Like Firecracker: one JSON line per flush, counters are deltas since the last flush.
            self.flushes += 1
            assert self.metrics_path is not None
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps({"utc_timestamp_ms": 1, "block": {"read_bytes": 4096, "write_bytes": 512},
                                    "net": {"rx_bytes_count": 100, "tx_bytes_count": 60}}) + "\n")
        return 204, None


@dataclass
class FakeFirecracker:
    server: RecordingFirecracker
    binary: Path


@pytest.fixture
async def fake_firecracker(tmp_path: Path) -> AsyncIterator[FakeFirecracker]:
    server = RecordingFirecracker(tmp_path / "recorder.sock")
    await server.start()
    # The backend really spawns this in place of `firecracker` (no binary exists here): it answers
    # --version like Firecracker, and points the --api-sock path it is given at the recorder.
    binary = tmp_path / "firecracker-standin"
    binary.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "Firecracker v1.17.0-dev"; exit 0; fi\n'
        '[ "$1" = "--api-sock" ] || exit 2\n'
        f'ln -s "{server.path}" "$2" || exit 3\n'
        "exec sleep 600\n"
    )
    binary.chmod(0o755)
    yield FakeFirecracker(server, binary)
    await server.close()


@pytest.fixture
def boot_files(tmp_path: Path) -> Iterator[dict[str, Path]]:
    files = {"kernel": tmp_path / "vmlinux", "initrd": tmp_path / "initrd.img", "rootfs": tmp_path / "rootfs.ext4"}
    files["kernel"].write_bytes(b"\x7fELF" + b"\0" * 60)  # the recorder never boots it
    files["initrd"].write_bytes(b"initrd")
    files["rootfs"].write_bytes(b"base image" * 100)
    yield files


def _assert_all_valid(contract: FirecrackerContract, requests: list[Recorded]) -> list[tuple[str, str]]:
    seen = []
    for r in requests:
        op = contract.validate(r.method, r.path, r.body)
        if r.body is not None:
            assert r.content_type.startswith("application/json"), r
        for name, value in op.params.items():  # Firecracker requires the path id to equal the body's
            if isinstance(r.body, dict) and name in r.body:
                assert r.body[name] == value, r
        seen.append((r.method, op.template))
    return seen


# ---- tests --------------------------------------------------------------------------------------


def test_contract_rejects_what_firecracker_would(contract: FirecrackerContract) -> None:
    # The validator is only worth something if it fails on real mistakes.
    contract.validate("PUT", "/machine-config", {"vcpu_count": 2, "mem_size_mib": 128})
    for method, path, body in [
        ("PUT", "/machine-config", {"vcpu_count": "2", "mem_size_mib": 128}),  # wrong type
        ("PUT", "/machine-config", {"vcpu_count": 2}),  # missing required
        ("PUT", "/boot-source", {"kernel_image_path": "/k", "bootargs": "x"}),  # undeclared property
        ("PUT", "/actions", {"action_type": "Reboot"}),  # not in the enum
    ]:
        with pytest.raises(jsonschema.ValidationError):
            contract.validate(method, path, body)
    with pytest.raises(AssertionError):
        contract.validate("POST", "/boot-source", {"kernel_image_path": "/k"})
    with pytest.raises(AssertionError):
        contract.validate("PUT", "/drive/rootfs", {"drive_id": "rootfs", "is_root_device": True})


async def test_every_request_matches_the_api_document(
    contract: FirecrackerContract, fake_firecracker: FakeFirecracker, boot_files: dict[str, Path], tmp_path: Path
) -> None:
    hv = FirecrackerHypervisor(binary=str(fake_firecracker.binary), metrics_flush_interval=0)
    probe = await hv.probe()
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert not probe.available and "kvm" in probe.reason
    else:
        assert probe.available and probe.version == "1.17.0-dev"
    workdir = tmp_path / "vm"
    workdir.mkdir()
    cfg = VMConfig(
        vm_id="fc-1", workdir=workdir, kernel=boot_files["kernel"], cmdline="console=ttyS0 reboot=k panic=1",
        vcpus=2, memory_mb=256, initrd=boot_files["initrd"], rootfs=boot_files["rootfs"],
        tap_devices=("lo",),  # any existing device: the recorder does not open it
    )
    handle = await hv.start(cfg)
    status = await hv.inspect(handle)
    assert status.running and status.detail == "Running"
    m1 = await hv.metrics(handle)
    m2 = await hv.metrics(handle)
    await hv.stop(handle, grace=0.3)
    assert not (await hv.inspect(handle)).running

    seen = _assert_all_valid(contract, fake_firecracker.server.requests)
    boot = seen[: seen.index(("PUT", "/actions")) + 1]
    assert set(boot) == {
        ("PUT", "/logger"), ("PUT", "/metrics"), ("PUT", "/machine-config"), ("PUT", "/boot-source"),
        ("PUT", "/drives/{drive_id}"), ("PUT", "/network-interfaces/{iface_id}"), ("PUT", "/actions"),
    }
    bodies = {r.path: r.body for r in fake_firecracker.server.requests if r.method == "PUT" and r.path != "/actions"}
    assert bodies["/machine-config"] == {"vcpu_count": 2, "mem_size_mib": 256}
    assert bodies["/boot-source"] == {"kernel_image_path": str(boot_files["kernel"]),
                                      "boot_args": "console=ttyS0 reboot=k panic=1",
                                      "initrd_path": str(boot_files["initrd"])}
    drive = bodies["/drives/rootfs"]
    assert drive["is_root_device"] is True and drive["is_read_only"] is False
    # The VM gets a private copy, never the base image itself.
    assert drive["path_on_host"] != str(boot_files["rootfs"])
    assert _read(Path(drive["path_on_host"])) == _read(boot_files["rootfs"])
    assert bodies["/network-interfaces/eth0"]["host_dev_name"] == "lo"
    actions = [r.body["action_type"] for r in fake_firecracker.server.requests if r.path == "/actions"]
    assert actions == ["InstanceStart", "FlushMetrics", "FlushMetrics", "SendCtrlAltDel"]
    # Metrics lines hold deltas: the backend keeps cumulative totals.
    u1 = m1.usage
    assert (u1.disk_read_bytes, u1.disk_write_bytes, u1.net_rx_bytes, u1.net_tx_bytes) == (4096, 512, 100, 60)
    assert (m2.usage.disk_read_bytes, m2.usage.net_tx_bytes) == (8192, 120)


async def test_api_error_fails_start_and_kills_the_vmm(
    contract: FirecrackerContract, fake_firecracker: FakeFirecracker, boot_files: dict[str, Path], tmp_path: Path
) -> None:
    fake_firecracker.server.fail[("PUT", "/boot-source")] = (400, "Invalid kernel image path")
    hv = FirecrackerHypervisor(binary=str(fake_firecracker.binary))
    cfg = VMConfig(vm_id="fc-bad", workdir=tmp_path, kernel=boot_files["kernel"], cmdline="console=ttyS0",
                   vcpus=1, memory_mb=128)
    with pytest.raises(HypervisorError) as err:
        await hv.start(cfg)
    assert err.value.spec_error and "Invalid kernel image path" in str(err.value)
    _assert_all_valid(contract, fake_firecracker.server.requests)
    assert ("PUT", "/actions") not in [(r.method, r.path) for r in fake_firecracker.server.requests]
    # The stand-in process (and its wrapper) are gone: nothing is left running.
    standins = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(int(p)).startswith(str(tmp_path))]
    assert standins == []


def _lexists(path: str) -> bool:
    return os.path.lexists(path)


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


async def test_runtime_auto_prefers_firecracker_and_adopts(
    contract: FirecrackerContract, fake_firecracker: FakeFirecracker, boot_files: dict[str, Path], tmp_path: Path
) -> None:
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        pytest.skip("/dev/kvm is not accessible, so the Firecracker backend reports itself unavailable")
    # Deep enough that the API socket cannot live in the VM's dir (sun_path holds 108 bytes).
    state = tmp_path / ("deep-state-dir-" * 6)

    def runtime() -> MicroVMRuntime:
        return MicroVMRuntime(state, grace_seconds=0.3, hypervisors={
            "firecracker": FirecrackerHypervisor(binary=str(fake_firecracker.binary)),
            "qemu": QemuHypervisor(state / "cache", binary="/nonexistent/qemu-system-x86_64"),
        })

    spec = WorkloadSpec.model_validate({"type": "microvm", "microvm": {
        "kernel": str(boot_files["kernel"]), "rootfs": str(boot_files["rootfs"]), "hypervisor": "auto"}})
    rt = runtime()
    probe = await rt.probe()
    assert probe.available and "hypervisor:firecracker" in probe.features
    assert "hypervisor:qemu" not in probe.features
    obs = await rt.start(RuntimeWorkload("fc-auto", spec.spec_revision(), 1, spec))
    assert obs.state is RuntimeState.RUNNING and obs.message.startswith("firecracker")
    # A new runtime instance (a restarted agent) adopts the VMM instead of starting another one.
    rt2 = runtime()
    again = await rt2.start(RuntimeWorkload("fc-auto", spec.spec_revision(), 1, spec))
    assert again.runtime_id == obs.runtime_id
    starts = [r for r in fake_firecracker.server.requests if r.body == {"action_type": "InstanceStart"}]
    assert len(starts) == 1
    handle = json.loads((state / "microvm" / "fc-auto" / "meta.json").read_text())["handle"]
    assert not handle["api_socket"].startswith(str(state)) and len(handle["api_socket"]) < 100
    assert _lexists(handle["api_socket"])
    await rt2.remove("fc-auto")
    assert not (state / "microvm" / "fc-auto").exists()
    assert not _lexists(handle["api_socket"])  # remove cleans up outside the VM's dir too
    _assert_all_valid(contract, fake_firecracker.server.requests)


@pytest.mark.vm
@pytest.mark.skipif(shutil.which("firecracker") is None, reason="no firecracker binary on PATH")
async def test_real_firecracker_boots_guest(microvm_guest: GuestImages, tmp_path: Path) -> None:  # noqa: F811
    hv = FirecrackerHypervisor()
    probe = await hv.probe()
    assert probe.available, probe.reason
    cfg = VMConfig(vm_id="fc-real", workdir=tmp_path, kernel=microvm_guest.kernel,
                   cmdline="console=ttyS0 reboot=k panic=1 persys.marker=fc-real", vcpus=1, memory_mb=128,
                   initrd=microvm_guest.initrd, rootfs=microvm_guest.rootfs)
    handle = await hv.start(cfg)
    try:
        for _ in range(600):
            if f"{BOOT_MARKER} fc-real" in hv.console_log(handle).read_text(errors="replace"):
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the guest did not print its boot marker within 60 s")
        assert (await hv.inspect(handle)).running
        assert (await hv.metrics(handle)).memory_bytes > 0
    finally:
        await hv.stop(handle, grace=5)
    assert not (await hv.inspect(handle)).running
