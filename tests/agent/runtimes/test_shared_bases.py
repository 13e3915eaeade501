"""The bases the runtimes share: Docker stats and the CPU sampler (table-driven, usage_cases/),
the one WorkloadUsage type on its way through protobuf, the work directories, and the KVM probe
(real QEMU booting the probe firmware under TCG on both machine types the runtimes use)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from persys._pb.persys.v1 import control_pb2 as pb
from persys.agent.runtimes.base import RuntimeFailure
from persys.agent.runtimes.cpu_sampler import CpuSampler
from persys.agent.runtimes.docker_stats import container_usage, parse_docker_time, total_usage
from persys.agent.runtimes.kvm import PROBE_FIRMWARE, firmware_runs, write_firmware
from persys.agent.runtimes.workdir import WorkDirs, tail_text
from persys.model.status import WorkloadUsage
from tests.cases import load

CASES = Path(__file__).parent / "usage_cases"
STATS_CASES = load(CASES, "docker_stats.yaml")
SAMPLER_CASES = load(CASES, "cpu_sampler.yaml")


@pytest.mark.parametrize("case", STATS_CASES, ids=[c["name"] for c in STATS_CASES])
def test_docker_stats(case: dict[str, Any]) -> None:
    assert container_usage(case["stats"]) == WorkloadUsage(**case["expect"])


def test_compose_total_is_the_sum_over_containers() -> None:
    parts = [container_usage(c["stats"]) for c in STATS_CASES]
    total = total_usage(parts)
    assert total.cpu_percent == 130.0 and total.memory_bytes == 8388608 + 4000 + 100
    assert (total.disk_read_bytes, total.net_tx_bytes) == (5120, 61)
    assert total_usage([]) == WorkloadUsage()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T10:00:00.123456789Z", 1714557600.123456),
        ("2024-05-01T10:00:00Z", 1714557600.0),
        ("0001-01-01T00:00:00Z", 0.0),  # never started
        ("", 0.0),
        ("not a time", 0.0),
    ],
)
def test_parse_docker_time(text: str, expected: float) -> None:
    assert parse_docker_time(text) == pytest.approx(expected)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("case", SAMPLER_CASES, ids=[c["name"] for c in SAMPLER_CASES])
async def test_cpu_sampler(case: dict[str, Any]) -> None:
    clock = _Clock()
    sampler = CpuSampler(case["settle"], clock=clock, sleep=clock.sleep)
    for i, step in enumerate(case["steps"]):
        if "forget" in step:
            sampler.forget(step["forget"])
            continue
        clock.now = step["at"]
        asked: list[bool] = []

        async def again(step: dict[str, Any] = step, asked: list[bool] = asked) -> int:
            asked.append(True)
            return int(step["again"])

        got = await sampler.percent(step["key"], step["used"], again, identity=step.get("identity"))
        assert (got, bool(asked)) == (step["expect"], step["reread"]), f"step {i}"


def test_usage_round_trip_through_the_protobuf_report() -> None:
    usage = WorkloadUsage(cpu_percent=12.5, memory_bytes=1 << 20, disk_read_bytes=1, disk_write_bytes=2,
                          net_rx_bytes=3, net_tx_bytes=4)
    report = pb.WorkloadReport(instance_id="w")
    usage.copy_into(report)
    assert (report.cpu_percent, report.memory_bytes, report.net_tx_bytes) == (12.5, 1 << 20, 4)
    assert WorkloadUsage.of(report) == usage
    assert WorkloadUsage.of(pb.WorkloadReport(instance_id="idle")) is None  # nothing measured
    # Every usage field is in the message under the same name, and nothing else is called so.
    assert set(WorkloadUsage.model_fields) <= {f.name for f in pb.WorkloadReport.DESCRIPTOR.fields}
    assert usage.measured and WorkloadUsage(net_tx_bytes=1).measured and not WorkloadUsage().measured


@dataclass
class _Meta:
    workload_id: str
    revision: str
    pids: list[int] = field(default_factory=list)


def test_work_dirs_records(tmp_path: Path) -> None:
    dirs = WorkDirs(tmp_path / "rt", _Meta)
    assert dirs.ids() == [] and dirs.load("a") is None  # no root yet
    dirs.save(_Meta("b", "r1", [1, 2]))
    dirs.save(_Meta("a", "r2"))
    assert dirs.ids() == ["a", "b"]
    assert dirs.load("b") == _Meta("b", "r1", [1, 2])
    # A record this version cannot read counts as absent (strict), or drops unknown fields (lenient).
    (dirs.path("b") / "meta.json").write_text('{"workload_id": "b", "revision": "r1", "newer": 1}')
    assert dirs.load("b") is None
    assert WorkDirs(tmp_path / "rt", _Meta, lenient=True).load("b") == _Meta("b", "r1")
    (dirs.path("a") / "meta.json").write_text("{half-written")
    assert dirs.load("a") is None
    dirs.remove("a")
    assert dirs.ids() == ["b"]
    for bad in ("", ".", "..", "x/y"):
        with pytest.raises(RuntimeFailure) as err:
            dirs.path(bad)
        assert err.value.code == "InvalidSpec" and err.value.terminal


def test_tail_text(tmp_path: Path) -> None:
    log = tmp_path / "out.log"
    assert tail_text(log, 5) == ""
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    assert tail_text(log, 2) == "line 8\nline 9\n"
    assert tail_text(log, 0) == ""
    assert tail_text(log, 3, max_bytes=10) == " 8\nline 9\n"  # bounded read: a partial first line


needs_qemu = pytest.mark.skipif(shutil.which("qemu-system-x86_64") is None, reason="QEMU is not installed")


@needs_qemu
@pytest.mark.parametrize("machine", ["pc", "microvm"])
def test_kvm_probe_firmware_runs_under_tcg(tmp_path: Path, machine: str) -> None:
    # TCG always runs the firmware; whether KVM does depends on the host (test_runtime_vm and
    # test_runtime_microvm check the verdict each runtime draws from it).
    fw = write_firmware(tmp_path / "fw.bin")
    assert fw.read_bytes() == PROBE_FIRMWARE and len(PROBE_FIRMWARE) == 65536
    qemu = shutil.which("qemu-system-x86_64") or ""
    assert firmware_runs(qemu, fw, machine=machine, accel="tcg", deadline=30.0) == (True, "")


@needs_qemu
def test_kvm_probe_failures_name_their_cause(tmp_path: Path) -> None:
    fw = write_firmware(tmp_path / "fw.bin")
    qemu = shutil.which("qemu-system-x86_64") or ""
    ok, why = firmware_runs(qemu, fw, machine="no-such-machine", accel="tcg", deadline=30.0)
    assert not ok and why.startswith("probe guest failed:") and "machine" in why  # QEMU's last words
    ok, why = firmware_runs(str(tmp_path / "missing-qemu"), fw, machine="pc", accel="tcg", deadline=5.0)
    assert not ok and why.startswith("cannot run ")
