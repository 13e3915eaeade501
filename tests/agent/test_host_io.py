"""The node's I/O counters (persys.agent.host.host_io): real disks and NICs only, read from a /sys
and /proc laid out as the kernel does; and the real ones of this machine; and the meter's node
samples turning them into rates (persys.scheduler.work.telemetry)."""

from __future__ import annotations

from pathlib import Path

from persys.agent.host import SECTOR, UsageSampler, disk_used, host_io
from persys.events.samples import NODE, Sample
from persys.model.node import NodeUsage
from persys.scheduler.work.telemetry import SAMPLE_INTERVAL, Telemetry

DISKSTATS = """\
 252       0 vda 100 0 2000 50 300 0 4000 90 0 100 140 0 0 0 0
 252       1 vda1 90 0 1800 40 290 0 3900 80 0 90 120 0 0 0 0
   7       0 loop0 10 0 500 1 0 0 0 0 0 1 1 0 0 0 0
 253       0 dm-0 80 0 1700 30 280 0 3800 70 0 80 100 0 0 0 0
"""
NETDEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls
    lo: 9999 10 0 0 0 0 0 0 9999 10 0 0 0 0 0 0
  eth0: 1000 10 0 0 0 0 0 0 2000 20 0 0 0 0 0 0
docker0: 5000 50 0 0 0 0 0 0 6000 60 0 0 0 0 0 0
vethab12: 7000 70 0 0 0 0 0 0 8000 80 0 0 0 0 0 0
"""


def _tree(root: Path) -> tuple[Path, Path]:
    sys_root, proc_root = root / "sys", root / "proc"
    for disk in ("vda", "loop0", "dm-0"):
        (sys_root / "block" / disk).mkdir(parents=True)
    (sys_root / "block" / "vda" / "device").mkdir()  # only vda is backed by a device
    for nic in ("lo", "eth0", "docker0", "vethab12"):
        (sys_root / "class" / "net" / nic).mkdir(parents=True)
    (sys_root / "class" / "net" / "eth0" / "device").mkdir()
    (proc_root / "net").mkdir(parents=True)
    (proc_root / "diskstats").write_text(DISKSTATS)
    (proc_root / "net" / "dev").write_text(NETDEV)
    return sys_root, proc_root


def test_only_devices_count(tmp_path: Path) -> None:
    # vda's own line (not its partition, the loop device or the device-mapper volume on it).
    assert host_io(*_tree(tmp_path)) == (2000 * SECTOR, 4000 * SECTOR, 1000, 2000)


def test_missing_files_read_as_zero(tmp_path: Path) -> None:
    assert host_io(tmp_path / "sys", tmp_path / "proc") == (0, 0, 0, 0)


def test_this_machine_has_a_disk_that_has_been_read(tmp_path: Path) -> None:
    h = UsageSampler(tmp_path).sample()
    assert h.io[0] > 0 and h.memory_used_mb > 0  # booting read the root disk


class Outbox:
    def __init__(self) -> None:
        self.samples: list[Sample] = []

    def offer(self, samples: list[Sample]) -> None:
        self.samples.extend(samples)


def test_node_samples_carry_io_rates() -> None:
    now = [1000.0]
    outbox = Outbox()
    t = Telemetry(outbox, clock=lambda: now[0])  # type: ignore[arg-type]
    t.node("n1", NodeUsage(cpu_percent=5.0, memory_used_mb=100, disk_read_bytes=1000, net_tx_bytes=50))
    now[0] += SAMPLE_INTERVAL
    t.node("n1", NodeUsage(cpu_percent=6.0, memory_used_mb=100, disk_read_bytes=1000 + 4000 * SAMPLE_INTERVAL,
                           net_tx_bytes=50 + 10 * SAMPLE_INTERVAL, disk_used_mb=300))
    first, second = outbox.samples
    assert (first.disk_used, second.disk_used) == (0.0, 300.0 * 2**20)  # space used, in bytes (a gauge)
    assert first.kind == NODE and (first.disk_read, first.net_tx) == (0.0, 0.0)  # no rate from one sample
    assert (second.disk_read, second.disk_write, second.net_rx, second.net_tx) == (4000.0, 0.0, 0.0, 10.0)


def test_disk_used_counts_each_filesystem_once(tmp_path: Path) -> None:
    """The state folder and a volume pool on the same filesystem are one filesystem's bytes; an
    unreadable folder counts nothing (the agent's usage report never fails for it)."""
    import shutil

    (tmp_path / "state").mkdir()
    (tmp_path / "pool").mkdir()
    one = shutil.disk_usage(tmp_path).used
    both = disk_used([tmp_path / "state", tmp_path / "pool", tmp_path / "missing"])
    assert abs(both - one) < 64 * 2**20, (both, one)  # the same filesystem, not twice
    sample = UsageSampler(tmp_path / "state", [tmp_path / "pool"]).sample()
    assert abs(sample.disk_used_mb - one // 2**20) < 64
