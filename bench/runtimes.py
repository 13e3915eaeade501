"""Apply-to-Running latency per runtime, against starting the same thing by hand in the same run.

    .venv/bin/python bench/runtimes.py [--repeat 3] [--only process,container,...]

Starts `persys dev` (embedded store, one node) and, for each runtime, applies a small workload
and times apply -> phase Running as seen through the REST API (polled every 20 ms); then starts
the equivalent directly: a process with Popen, `docker run -d`, `docker-compose up -d`,
`virsh create` of a domain XML, and the QEMU microvm command line (until QMP answers). The
ratio is Persys' time over the manual one. The VM guests are the tiny test guests that
tests/vm_fixtures.py and tests/microvm_fixtures.py build (Debian's kernel, a busybox initramfs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
BIN = Path(sys.executable).parent
RUNTIMES = ("process", "container", "compose", "vm", "microvm")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Dev:
    def __init__(self, home: Path, *extra: str) -> None:
        self.home = home
        self.port = free_port()
        self.log = home / "dev.log"
        self.proc = subprocess.Popen([str(BIN / "persys"), "dev", "--port", str(self.port), "--node-id", "bench",
                                      *extra],
                                     env={**os.environ, "PERSYS_HOME": str(home)}, stdout=self.log.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while "Press Ctrl-C" not in self.log.read_text():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"persys dev did not start:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.1)
        cfg = yaml.safe_load((home / "config.yaml").read_text())
        ctx = ssl.create_default_context(cafile=cfg["ca"])
        ctx.load_cert_chain(cfg["cert"], cfg["key"])
        self.http = httpx.Client(base_url=cfg["server"], verify=ctx, timeout=30)

    def served(self, path: str | Path) -> str:
        """`path` linked (or copied) under the node paths `persys dev` serves: a node refuses VM
        files anywhere else (the nodePaths policy)."""
        from tests.vm_fixtures import linked_into

        images = self.home / "dev" / "images"
        images.mkdir(parents=True, exist_ok=True)
        return str(linked_into(Path(path), images))

    def runtimes(self) -> set[str]:
        return set(self.http.get("/v1/nodes").json()[0]["capabilities"]["runtimes"])

    def apply_until_running(self, doc: dict) -> float:  # type: ignore[type-arg]
        name = doc["metadata"]["name"]
        t0 = time.monotonic()
        r = self.http.post("/v1/workloads", json=doc)
        if r.is_error:
            raise SystemExit(f"applying {name}: {r.status_code} {r.text}")
        while True:
            w = self.http.get(f"/v1/workloads/{name}").json()
            if w["phase"] == "Running":
                return time.monotonic() - t0
            if w["phase"] == "Failed" or time.monotonic() - t0 > 120:
                raise SystemExit(f"{name} did not reach Running: {w['phase']} {w['reason']} {w['message']}")
            time.sleep(0.02)

    def delete(self, name: str) -> None:
        self.http.delete(f"/v1/workloads/{name}")
        deadline = time.monotonic() + 60
        while self.http.get(f"/v1/workloads/{name}").status_code != 404 and time.monotonic() < deadline:
            time.sleep(0.1)

    def stop(self) -> None:
        self.http.close()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise SystemExit(f"persys dev did not stop within 30 s:\n{self.log.read_text()[-2000:]}") from None


def manifest(name: str, type_: str, body: dict) -> dict:  # type: ignore[type-arg]
    return {"apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
            "spec": {"type": type_, "resources": {"cpuMillicores": 100, "memoryMb": 64}, type_: body}}


def timed(fn: Callable[[], None]) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=120).stdout


# --------------------------------------------------------------------------- by hand


def by_hand_process() -> tuple[float, Callable[[], None]]:
    t0 = time.monotonic()
    p = subprocess.Popen(["sleep", "600"], start_new_session=True)
    return time.monotonic() - t0, lambda: (p.kill(), p.wait())  # type: ignore[func-returns-value]


def by_hand_container() -> tuple[float, Callable[[], None]]:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    took = timed(lambda: run("docker", "run", "-d", "--name", name, "persys/busybox:latest", "sleep", "600"))
    return took, lambda: run("docker", "rm", "-f", name) and None


COMPOSE = """services:
  web: {image: "persys/busybox:latest", command: ["sleep", "600"]}
  worker: {image: "persys/busybox:latest", command: ["sleep", "600"]}
"""


def compose_binary() -> str:
    for c in (BIN / "docker-compose", shutil.which("docker-compose")):
        if c and Path(c).exists():
            return str(c)
    raise SystemExit("no docker-compose binary")


def by_hand_compose(tmp: Path) -> tuple[float, Callable[[], None]]:
    project = f"bench{uuid.uuid4().hex[:6]}"
    f = tmp / f"{project}.yaml"
    f.write_text(COMPOSE)
    exe = compose_binary()
    took = timed(lambda: run(exe, "-p", project, "-f", str(f), "up", "-d"))
    return took, lambda: run(exe, "-p", project, "-f", str(f), "down", "-t", "1") and None


def by_hand_vm(tmp: Path, guest: object) -> tuple[float, Callable[[], None]]:
    name = f"bench-{uuid.uuid4().hex[:6]}"
    disk = tmp / f"{name}.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", str(guest.base_disk), str(disk))  # type: ignore[attr-defined]
    xml = tmp / f"{name}.xml"
    xml.write_text(f"""<domain type='qemu'><name>{name}</name><memory unit='MiB'>256</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type><kernel>{guest.kernel}</kernel><initrd>{guest.initrd}</initrd>
<cmdline>console=ttyS0</cmdline></os><devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
<source file='{disk}'/><target dev='vda' bus='virtio'/></disk><serial type='file'><source path='{tmp}/{name}.log'/>
<target port='0'/></serial><console type='file'><source path='{tmp}/{name}.log'/><target type='serial' port='0'/>
</console></devices></domain>""")  # type: ignore[attr-defined]
    took = timed(lambda: run("virsh", "-c", "qemu:///system", "create", str(xml)))
    return took, lambda: run("virsh", "-c", "qemu:///system", "destroy", name) and None


def by_hand_microvm(tmp: Path, guest: object) -> tuple[float, Callable[[], None]]:
    qmp = tmp / f"qmp-{uuid.uuid4().hex[:6]}.sock"
    disk = tmp / f"mvm-{uuid.uuid4().hex[:6]}.qcow2"
    run("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(guest.rootfs), str(disk))  # type: ignore[attr-defined]
    t0 = time.monotonic()
    p = subprocess.Popen(
        ["qemu-system-x86_64", "-M", "microvm", "-accel", "tcg", "-nodefaults", "-no-user-config", "-nographic",
         "-m", "128", "-smp", "1", "-kernel", str(guest.kernel), "-initrd", str(guest.initrd),  # type: ignore[attr-defined]
         "-append", "console=ttyS0 quiet pci=off", "-serial", f"file:{tmp}/mvm.log",
         "-drive", f"id=root,file={disk},format=qcow2,if=none", "-device", "virtio-blk-device,drive=root",
         "-qmp", f"unix:{qmp},server,nowait"], start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    while True:  # QEMU answers on its QMP socket once the machine exists
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(qmp))
                if s.recv(4096):
                    break
        except OSError:
            time.sleep(0.005)
    return time.monotonic() - t0, lambda: (p.kill(), p.wait())  # type: ignore[func-returns-value]


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default=",".join(RUNTIMES))
    args = ap.parse_args()
    wanted = [r for r in args.only.split(",") if r]
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="persys-bench-rt-"))
    home.chmod(0o755)  # QEMU (user libvirt-qemu) must reach the VM files
    results: dict[str, dict[str, float]] = {}
    dev = Dev(home)
    try:
        available = dev.runtimes()
        vm_guest = mvm_guest = None
        if "vm" in wanted and "vm" in available:
            from tests.vm_fixtures import build_test_guest

            vm_guest = build_test_guest()
        if "microvm" in wanted and "microvm" in available:
            from tests.microvm_fixtures import build_guest

            mvm_guest = build_guest()
        for rt in wanted:
            if rt not in available:
                print(f"{rt:<10} skipped: the node does not offer it")
                continue
            ours, theirs = [], []
            for i in range(args.repeat):
                name = f"bench-{rt}-{i}"
                if rt == "process":
                    doc = manifest(name, "process", {"command": ["sleep", "600"]})
                    hand = by_hand_process
                elif rt == "container":
                    doc = manifest(name, "container", {"image": "persys/busybox:latest", "command": ["sleep", "600"]})
                    hand = by_hand_container
                elif rt == "compose":
                    doc = manifest(name, "compose", {"inline": COMPOSE})
                    hand = lambda: by_hand_compose(home)  # noqa: E731
                elif rt == "vm":
                    g = vm_guest
                    doc = manifest(name, "vm", {"image": dev.served(g.base_disk),  # type: ignore[union-attr]
                                                "kernel": dev.served(g.kernel),  # type: ignore[union-attr]
                                                "initrd": dev.served(g.initrd),  # type: ignore[union-attr]
                                                "cmdline": "console=ttyS0", "memoryMb": 256})
                    doc["spec"]["resources"]["memoryMb"] = 256
                    hand = lambda: by_hand_vm(home, vm_guest)  # noqa: E731
                else:
                    g2 = mvm_guest
                    doc = manifest(name, "microvm", {"kernel": dev.served(g2.kernel),  # type: ignore[union-attr]
                                                     "initrd": dev.served(g2.initrd),  # type: ignore[union-attr]
                                                     "rootfs": dev.served(g2.rootfs), "memoryMb": 128,  # type: ignore[union-attr]
                                                     "cmdline": "console=ttyS0 quiet pci=off"})
                    doc["spec"]["resources"]["memoryMb"] = 160
                    hand = lambda: by_hand_microvm(home, mvm_guest)  # noqa: E731
                ours.append(dev.apply_until_running(doc))
                dev.delete(name)
                took, cleanup = hand()
                theirs.append(took)
                cleanup()
            o, t = statistics.median(ours), statistics.median(theirs)
            results[rt] = {"persys_s": o, "by_hand_s": t, "ratio": o / t if t else float("inf")}
            print(f"{rt:<10} apply->Running {o * 1000:8.0f} ms   by hand {t * 1000:8.0f} ms   ratio {o / t:6.2f}x"
                  f"   (median of {args.repeat})")
    finally:
        dev.stop()
        shutil.rmtree(home, ignore_errors=True)
    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / f"runtimes-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}, indent=1))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
