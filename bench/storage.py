"""Volume provision + attach -> workload running, per driver, through Persys against the same by
hand in the same run (a benchmark, not a test).

    .venv/bin/python bench/storage.py [--drivers local,nfs,ceph-rbd] [--rounds 5] [--sizes 64,1024,10240]

local (`--sizes` MiB each; `--local-workloads` process and container): a scheduler, an agent
with a local pool and a gateway as processes; each round applies a workload (one CPU, 64 MiB)
with an inline `local` volume and times until its command has written a marker into the mounted
volume (placed, sparse ext4 image provisioned and formatted, loop-mounted, started), then deletes
it. By hand: `truncate`, `mkfs.ext4` (the same options), `mount -o loop`, then the same shell
command with the same limits as nobody (the workload runs as Persys' workload user): its cgroups
(cpu quota one CPU, memory 64 MiB, pids) made, the mount chowned, the command moved into them and
`setpriv` to nobody; or `docker run -d --cpus 1 -m 64m -v <mount>:/data` of the same image and
command.

nfs and ceph-rbd (a VM workload; this machine has no kernel NFS or RBD client, so their volumes
attach to VMs): `persys dev --storage` with nfs-ganesha and a one-node Ceph cluster started here;
each round applies a VM with an inline volume of the first size and times apply -> Running (the
domain started with the volume as its second disk). By hand: the image created (`qemu-img create
nfs://...`, `rbd create`), the cephx key as a libvirt secret (`virsh secret-define`,
`secret-set-value`), and `virsh create` of a domain with the same kernel, overlay disk and the
volume as a network disk: what an operator types.

Printed: per driver (and size) the medians and the ratio (target: at most 1.3x by hand).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.runtimes import Dev, manifest  # noqa: E402
from tests.e2e.harness import eventually  # noqa: E402
from tests.gateway.cluster import start_cluster  # noqa: E402
from tests.storage.loop_pool import sweep_pool  # noqa: E402

SCRIPT = 'echo ok > "{dir}/marker"; exec sleep 600'
VIRSH = ("virsh", "-q", "-c", "qemu:///system")
# Before each timed VM start, either path: the previous VM is still being torn down (QEMU
# exiting, libvirt's cleanup, the image's removal). The two paths also take turns going first:
# the second one finds the guest's kernel, initrd and base disk in the page cache, and libvirt warm.
SETTLE_S = 1.0


def run(*argv: str) -> str:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode:
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-800:]}")
    return r.stdout


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- local


IMAGE = "persys/busybox:latest"  # examples/images/build-busybox.sh


def local_manifest(name: str, size_mb: int, kind: str) -> dict[str, Any]:
    if kind == "process":
        body: dict[str, Any] = {"command": ["sh", "-c", SCRIPT.format(dir="$PERSYS_VOLUME_DATA")]}
    else:
        body = {"image": IMAGE, "command": ["sh", "-c", SCRIPT.format(dir="/data")]}
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": kind, kind: body, "resources": {"cpuMillicores": 1000, "memoryMb": 64},
                     "volumes": [{"name": "data", "driver": "local", "sizeMb": size_mb, "mountPath": "/data"}]}}


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.perf_counter() + timeout
    while not path.exists():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(0.005)


CGROUP_V1 = Path("/sys/fs/cgroup")
HAND_CONTROLLERS = ("cpu", "cpuacct", "memory", "pids")  # those the process runtime uses here
HAND_CGROUP = "persys-bench-hand"


def hand_cgroups(i: int) -> dict[str, Path]:
    return {c: CGROUP_V1 / c / HAND_CGROUP / str(i) for c in HAND_CONTROLLERS}


def process_by_hand(cgroups: dict[str, Path], mnt: Path) -> list[str]:
    """What an operator types for the same workload as the bench's: its cgroups with the same
    limits (one CPU, 64 MiB), the volume handed to nobody, the command moved into the cgroups
    and run as nobody. The argv to spawn."""
    for d in cgroups.values():
        d.mkdir(parents=True, exist_ok=True)  # exists: cpu and cpuacct mounted together
    (cgroups["cpu"] / "cpu.cfs_quota_us").write_text("100000")  # the default 100 ms period: one CPU
    (cgroups["memory"] / "memory.limit_in_bytes").write_text(str(64 * 1024 * 1024))
    os.chown(mnt, 65534, 65534)
    join = "".join(f"echo $$ > {d}/cgroup.procs; " for d in cgroups.values())
    as_nobody = "setpriv --reuid=65534 --regid=65534 --clear-groups"
    return ["sh", "-c", f"{join}exec {as_nobody} sh -c '{SCRIPT.format(dir=mnt)}'"]


def local_by_hand(root: Path, i: int, size_mb: int, kind: str) -> float:
    img, mnt = root / f"hand-{i}.img", root / f"hand-{i}"
    mnt.mkdir()
    container = f"persys-bench-hand-{uuid.uuid4().hex[:8]}"
    cgroups = hand_cgroups(i)
    t0 = time.perf_counter()
    subprocess.run(["truncate", "-s", f"{size_mb}M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=0,lazy_journal_init=0", str(img)],
                   check=True)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    if kind == "process":
        proc = subprocess.Popen(process_by_hand(cgroups, mnt))
    else:
        run("docker", "run", "-d", "--name", container, "--cpus", "1", "-m", "64m", "-v", f"{mnt}:/data", IMAGE,
            "sh", "-c",
            SCRIPT.format(dir="/data"))
    wait_for(mnt / "marker", 60)
    took = time.perf_counter() - t0
    if kind == "process":
        proc.kill()
        proc.wait()
        for d in cgroups.values():
            with contextlib.suppress(FileNotFoundError):
                d.rmdir()
    else:
        run("docker", "rm", "-f", container)
    subprocess.run(["umount", str(mnt)], check=True)
    img.unlink()
    mnt.rmdir()
    return took


def bench_local(rounds: int, sizes: list[int], kinds: list[str]) -> list[tuple[str, float, float]]:
    tmp = Path(tempfile.mkdtemp(prefix="persys-bench-storage-"))
    tmp.chmod(0o711)  # the process runs as nobody: it must reach its volume
    pool = tmp / "pool"
    (tmp / "storage.yaml").write_text(f"local: {{pool: {pool}}}\n")
    out = []
    cluster = start_cluster(tmp / "cluster", with_agent=True, agent_args=("--storage", str(tmp / "storage.yaml")))
    try:
        http = cluster.client()
        eventually(lambda: [n for n in http.get("/v1/nodes").json() if n["status"] == "Ready"], 60, "node Ready")
        for kind, size in ((k, s) for k in kinds for s in sizes):
            hand_times: list[float] = []
            persys_times: list[float] = []
            for i in range(rounds):
                hand_times.append(local_by_hand(tmp, i, size, kind))
                name = f"bench-{kind[0]}{size}-{i}"
                marker = pool / "mounts" / f"{name}-data" / "marker"
                t0 = time.perf_counter()
                assert http.post("/v1/workloads", json=local_manifest(name, size, kind)).status_code == 201
                wait_for(marker, 120)  # polled as often as by hand: the ratio compares the paths, not the polling
                persys_times.append(time.perf_counter() - t0)
                http.delete(f"/v1/workloads/{name}")
                eventually(lambda name=name: http.get(f"/v1/workloads/{name}").status_code == 404, 60, "deleted")
                eventually(lambda name=name: http.get(f"/v1/volumes/{name}-data").status_code == 404, 60,
                           "its volume removed by the node")
                print(f"local {size} MiB {kind} round {i + 1}: by hand {hand_times[-1] * 1000:.0f} ms, "
                      f"persys {persys_times[-1] * 1000:.0f} ms", flush=True)
            out.append((f"local {size} MiB ({kind})", statistics.median(hand_times),
                        statistics.median(persys_times)))
    finally:
        cluster.stop()
        for c in HAND_CONTROLLERS:
            with contextlib.suppress(FileNotFoundError):
                (CGROUP_V1 / c / HAND_CGROUP).rmdir()
        sweep_pool(pool)
        shutil.rmtree(tmp, ignore_errors=True)
    return out


# --------------------------------------------------------------------------- nfs and ceph-rbd (VMs)


def _domain_xml(name: str, guest: Any, overlay: Path, log: Path, volume_disk: str) -> str:
    return f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><kernel>{guest.kernel}</kernel><initrd>{guest.initrd}</initrd>
<cmdline>console=ttyS0</cmdline></os><devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
<source file='{overlay}'/><target dev='vda' bus='virtio'/></disk>{volume_disk}
<serial type='file'><source path='{log}'/><target port='0'/></serial></devices></domain>"""


def vm_by_hand(home: Path, guest: Any, driver: str, size_mb: int, ceph: Any, nfs: Any
               ) -> tuple[float, Callable[[], None]]:
    name = f"hand-{uuid.uuid4().hex[:6]}"
    overlay = home / f"{name}.qcow2"
    xml = home / f"{name}.xml"
    undo: list[Callable[[], object]] = []
    t0 = time.perf_counter()
    run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(guest.base_disk), str(overlay))
    if driver == "nfs":
        path = f"{nfs.export.base}/{name}.img"
        run("qemu-img", "create", "-q", "-f", "raw", nfs.export.qemu_url(f"/{name}.img"), f"{size_mb}M")
        undo.append(lambda: (nfs.folder / f"{name}.img").unlink(missing_ok=True))
        disk = (f"<disk type='network' device='disk'><driver name='qemu' type='raw'/><source protocol='nfs' "
                f"name='{path}'><host name='{nfs.export.server}'/><identity user='+0' group='+0'/></source>"
                "<target dev='vdb' bus='virtio'/></disk>")
    else:
        auth = ("-c", str(ceph.conf), "--id", "admin", "--keyring", str(ceph.admin_keyring))
        run("rbd", *auth, "create", "--size", str(size_mb), f"{ceph.pool}/{name}")
        undo.append(lambda: run("rbd", *auth, "rm", "--no-progress", f"{ceph.pool}/{name}"))
        secret = str(uuid.uuid4())
        sxml = home / f"{name}-secret.xml"
        sxml.write_text(f"<secret ephemeral='yes' private='yes'><uuid>{secret}</uuid>"
                        f"<usage type='ceph'><name>bench {name}</name></usage></secret>")
        run(*VIRSH, "secret-define", str(sxml))
        undo.append(lambda: run(*VIRSH, "secret-undefine", secret))
        keyfile = home / f"{name}.key"
        keyfile.write_bytes(base64.b64decode(ceph.node_key))
        keyfile.chmod(0o600)
        run(*VIRSH, "secret-set-value", secret, "--file", str(keyfile), "--plain")
        disk = (f"<disk type='network' device='disk'><driver name='qemu' type='raw' cache='none'/>"
                f"<source protocol='rbd' name='{ceph.pool}/{name}'><host name='{ceph.mon_host}' "
                f"port='{ceph.mon_port}'/></source><auth username='{ceph.node_user}'><secret type='ceph' "
                f"uuid='{secret}'/></auth><target dev='vdb' bus='virtio'/></disk>")
    xml.write_text(_domain_xml(name, guest, overlay, home / f"{name}.log", disk))
    run(*VIRSH, "create", str(xml))
    took = time.perf_counter() - t0

    def cleanup() -> None:
        run(*VIRSH, "destroy", name)
        for step in reversed(undo):
            step()
        overlay.unlink(missing_ok=True)

    return took, cleanup


def vm_round(dev: Dev, doc: dict[str, Any], by_hand: Callable[[], tuple[float, Callable[[], None]]], *,
             persys_first: bool) -> tuple[float, float]:
    """One round, both paths timed: (by hand, persys), each cleaned up before the other starts."""
    times: dict[str, float] = {}

    def persys() -> None:
        name = doc["metadata"]["name"]
        times["persys"] = dev.apply_until_running(doc)
        dev.delete(name)
        eventually(lambda: dev.http.get(f"/v1/volumes/{name}-data").status_code == 404, 60, "its volume removed")

    def hand() -> None:
        times["hand"], cleanup = by_hand()
        cleanup()

    for step in (persys, hand) if persys_first else (hand, persys):
        time.sleep(SETTLE_S)
        step()
    return times["hand"], times["persys"]


@contextlib.contextmanager
def backends(tmp: Path, drivers: list[str]) -> Iterator[tuple[Any, Any]]:
    from tests.ceph_cluster import start_ceph
    from tests.nfs_server import start_nfs_server

    nfs = start_nfs_server(tmp / "nfs") if "nfs" in drivers else None
    try:
        if "ceph-rbd" not in drivers:
            yield None, nfs
            return
        with start_ceph(tmp) as ceph:
            yield ceph, nfs
    finally:
        if nfs is not None:
            nfs.stop()


def bench_vm_volumes(rounds: int, size_mb: int, drivers: list[str]) -> list[tuple[str, float, float]]:
    from tests.vm_fixtures import build_test_guest

    guest = build_test_guest()
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="persys-bench-vmvol-"))
    home.chmod(0o755)  # QEMU (user libvirt-qemu) must reach the VM files
    (home / "nfs").mkdir()
    (home / "nfs").chmod(0o700)
    out = []
    with backends(home, drivers) as (ceph, nfs):
        lines = [f"local: {{pool: {home / 'pool'}}}"]
        if nfs is not None:
            e = nfs.export
            lines.append(f"nfs: {{server: {e.server}, port: {e.port}, export: {e.export}}}")
        if ceph is not None:
            key = home / "ceph-node.key"
            key.write_text(ceph.node_key + "\n")
            key.chmod(0o600)
            lines.append(f"ceph-rbd: {{monitors: ['{ceph.mon_host}:{ceph.mon_port}'], pool: {ceph.pool}, "
                         f"user: {ceph.node_user}, secretName: ceph-node, keyFile: {key}}}")
        (home / "storage.yaml").write_text("\n".join(lines) + "\n")
        dev = Dev(home, "--storage", str(home / "storage.yaml"))
        try:
            for driver in drivers:
                ours, theirs = [], []
                for i in range(rounds):
                    name = f"bench-{driver}-{i}"
                    doc = manifest(name, "vm", {"image": dev.served(guest.base_disk),
                                                "kernel": dev.served(guest.kernel), "initrd": dev.served(guest.initrd),
                                                "cmdline": "console=ttyS0", "memoryMb": 256})
                    doc["spec"]["resources"]["memoryMb"] = 256
                    doc["spec"]["volumes"] = [{"name": "data", "driver": driver, "sizeMb": size_mb,
                                               "mountPath": "/dev/vdb"}]
                    hand = functools.partial(vm_by_hand, home, guest, driver, size_mb, ceph, nfs)
                    took, mine = vm_round(dev, doc, hand, persys_first=i % 2 == 0)
                    theirs.append(took)
                    ours.append(mine)
                    print(f"{driver} round {i + 1}: by hand {took * 1000:.0f} ms, persys {mine * 1000:.0f} ms",
                          flush=True)
                out.append((f"{driver} {size_mb} MiB (VM)", statistics.median(theirs), statistics.median(ours)))
        finally:
            dev.stop()
            shutil.rmtree(home, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drivers", default="local,nfs,ceph-rbd")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sizes", default="64,1024,10240", help="local volume sizes in MiB (the VMs use the first)")
    ap.add_argument("--local-workloads", default="process,container",
                    help="what runs on the local volumes: process, container (docker, the busybox image)")
    args = ap.parse_args()
    drivers = [d for d in args.drivers.split(",") if d]
    sizes = [int(s) for s in args.sizes.split(",") if s]
    kinds = [k for k in args.local_workloads.split(",") if k]
    results = bench_local(args.rounds, sizes, kinds) if "local" in drivers else []
    network = [d for d in drivers if d != "local"]
    if network:
        results += bench_vm_volumes(args.rounds, sizes[0], network)
    print(f"\nvolume provision + attach -> workload running, median of {args.rounds}:")
    for what, hand, ours in results:
        print(f"  {what:<28} by hand {hand * 1000:7.0f} ms   persys {ours * 1000:7.0f} ms   "
              f"ratio x{ours / hand:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
