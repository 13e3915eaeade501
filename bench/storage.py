"""Volume provision + attach -> workload running, through Persys against the same by hand
(a benchmark, not a test).

    .venv/bin/python bench/storage.py [--rounds 5] [--size-mb 64]

Persys: a scheduler, an agent (`--storage` with a local pool) and a gateway as processes; each
round applies a process workload with an inline `local` volume and times until the process has
written a marker into its mounted volume (the scheduler places it, the agent provisions a sparse
ext4 image, loop-mounts it and starts the process), then deletes it and waits until the volume is
detached. By hand, in the same run: `truncate`, `mkfs.ext4`, `mount -o loop`, start the same
shell command writing the same marker, then `umount` and `rm`. Printed: the medians and the
ratio (target: at most 1.3x by hand).

ceph-rbd and nfs volumes attach to VMs (this machine has no kernel RBD or NFS client); their
figure is a VM boot under TCG (5-15 s) either way, so the ratio is measured where the volume
path is the cost: the local driver.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.harness import eventually  # noqa: E402
from tests.gateway.cluster import start_cluster  # noqa: E402
from tests.storage.loop_pool import sweep_pool  # noqa: E402

SCRIPT = 'echo ok > "{dir}/marker"; exec sleep 600'


def manifest(name: str, size_mb: int) -> dict[str, Any]:
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": "process", "process": {"command": ["sh", "-c", SCRIPT.format(dir="$PERSYS_VOLUME_DATA")]},
                     "resources": {"cpuMillicores": 10, "memoryMb": 16},
                     "volumes": [{"name": "data", "driver": "local", "sizeMb": size_mb, "mountPath": "/data"}]}}


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not path.exists():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.005)


def by_hand(root: Path, i: int, size_mb: int) -> float:
    img, mnt = root / f"hand-{i}.img", root / f"hand-{i}"
    mnt.mkdir()
    t0 = time.perf_counter()
    subprocess.run(["truncate", "-s", f"{size_mb}M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(img)],
                   check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    proc = subprocess.Popen(["sh", "-c", SCRIPT.format(dir=mnt)])
    wait_for(mnt / "marker", 60)
    took = time.perf_counter() - t0
    proc.kill()
    proc.wait()
    subprocess.run(["umount", str(mnt)], check=True)
    img.unlink()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--size-mb", type=int, default=64)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="persys-bench-storage-"))
    tmp.chmod(0o711)  # the process runs as nobody: it must reach its volume
    pool = tmp / "pool"
    (tmp / "storage.yaml").write_text(f"local: {{pool: {pool}}}\n")
    hand_times: list[float] = []
    persys_times: list[float] = []
    cluster = start_cluster(tmp / "cluster", with_agent=True, agent_args=("--storage", str(tmp / "storage.yaml")))
    try:
        http = cluster.client()
        eventually(lambda: [n for n in http.get("/v1/nodes").json() if n["status"] == "Ready"], 60, "node Ready")
        for i in range(args.rounds):
            hand_times.append(by_hand(tmp, i, args.size_mb))
            name = f"bench-{i}"
            marker = pool / "mounts" / f"{name}-data" / "marker"
            t0 = time.perf_counter()
            assert http.post("/v1/workloads", json=manifest(name, args.size_mb)).status_code == 201
            wait_for(marker, 60)  # polled as often as by hand: the ratio compares the paths, not the polling
            persys_times.append(time.perf_counter() - t0)
            http.delete(f"/v1/workloads/{name}")
            eventually(lambda name=name: http.get(f"/v1/workloads/{name}").status_code == 404, 60, "deleted")
            print(f"round {i + 1}: by hand {hand_times[-1] * 1000:.0f} ms, persys {persys_times[-1] * 1000:.0f} ms",
                  flush=True)
    finally:
        cluster.stop()
        sweep_pool(pool)
        shutil.rmtree(tmp, ignore_errors=True)
    hand, ours = statistics.median(hand_times), statistics.median(persys_times)
    print(f"\nlocal volume ({args.size_mb} MiB) provision + attach -> process running, median of {args.rounds}:")
    print(f"  by hand (truncate, mkfs.ext4, mount -o loop, start): {hand * 1000:.0f} ms")
    print(f"  persys (apply -> placed -> provisioned -> mounted -> started): {ours * 1000:.0f} ms")
    print(f"  ratio x{ours / hand:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
