"""A VM booted from an image URL (issue #16) on a `persys dev` cluster: refused until the workload
policy names the server, then downloaded once from a real HTTP server (tests/http_file_server.py),
verified, booted under libvirt/QEMU, reported as ImagePulling/ImagePulled events; a second
workload naming the same checksum boots without a request; a wrong checksum is a terminal
ImageChecksumMismatch in `describe`."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.harness import Proc, ctl, eventually, persys
from tests.e2e.test_dev_vms import _placed
from tests.http_file_server import FileServer
from tests.vm_fixtures import GUEST_READY, TestGuest, test_guest, vm_host  # noqa: F401
from tests.waiting import PROCESS_POLL

pytestmark = [pytest.mark.e2e, pytest.mark.vm]


def _vm(name: str, url: str, sha: str, guest: TestGuest) -> str:
    return yaml.safe_dump({
        "apiVersion": "persys.dev/v1", "kind": "Workload", "metadata": {"name": name},
        "spec": {"type": "vm", "resources": {"cpuMillicores": 500, "memoryMb": 192},
                 "vm": {"image": url, "imageSha256": sha, "kernel": str(guest.kernel), "initrd": str(guest.initrd),
                        "cmdline": "console=ttyS0", "memoryMb": 192}}})


def _workload(name: str, env: dict[str, str]) -> dict[str, Any]:
    return dict(json.loads(ctl("get", "workloads", name, "-o", "json", env=env).stdout))


def _events(name: str, kind: str, env: dict[str, str]) -> list[dict[str, Any]]:
    return list(json.loads(ctl("events", "--for", f"workload/{name}", "--kind", kind, "-o", "json", env=env).stdout))


def test_a_vm_boots_from_an_image_url(test_guest: TestGuest) -> None:  # noqa: F811
    home = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="persys-e2e-vmurl-"))  # QEMU must reach it
    home.chmod(0o755)
    env = {"PERSYS_HOME": str(home)}
    guest = _placed(test_guest, home / "dev" / "images")  # kernel and initrd: node paths persys dev serves
    sha = hashlib.sha256(guest.base_disk.read_bytes()).hexdigest()
    dev = None
    with FileServer() as server:
        server.routes["/vm/guest.qcow2"] = (200, guest.base_disk, {})
        url = server.base + "/vm/guest.qcow2"
        try:
            dev = Proc("dev", persys("dev", "--port", "0", "--node-id", "url-node"), home, env=env)
            dev.wait_for("Press Ctrl-C to stop.", timeout=120)
            refused = ctl("apply", "-f", "-", env=env, stdin=_vm("from-url", url, sha, guest), check=False)
            assert refused.returncode != 0 and "imageSources" in refused.stdout + refused.stderr, refused
            assert server.requests == []

            policy = yaml.safe_load(ctl("policy", "get", "-o", "yaml", env=env).stdout)
            policy["allowedImageUrls"] = [server.base + "/vm"]
            ctl("policy", "set", "-f", "-", env=env, stdin=yaml.safe_dump(policy))
            ctl("apply", "-f", "-", env=env, stdin=_vm("from-url", url, sha, guest))
            eventually(lambda: _workload("from-url", env)["phase"] == "Running", 120, "the VM Running")
            eventually(lambda: GUEST_READY in ctl("logs", "from-url", "--tail", "200", env=env).stdout, 90,
                       "the guest booted from the downloaded disk", interval=PROCESS_POLL)
            (pulled,) = eventually(lambda: _events("from-url", "ImagePulled", env), 30, "ImagePulled")[0]
            assert "sha256 verified" in pulled["message"] and url in pulled["message"]
            assert server.requests == ["/vm/guest.qcow2"]

            # The same checksum from a URL that would fail: the node's copy is used, nothing asked.
            ctl("apply", "-f", "-", env=env, stdin=_vm("same-bytes", server.base + "/vm/gone.qcow2", sha, guest))
            eventually(lambda: _workload("same-bytes", env)["phase"] == "Running", 120, "the second VM Running")
            assert server.requests == ["/vm/guest.qcow2"]
            ctl("delete", "workload", "same-bytes", env=env)

            ctl("apply", "-f", "-", env=env, stdin=_vm("wrong-sum", url, "0" * 64, guest))
            w, _ = eventually(lambda: (w := _workload("wrong-sum", env))["reason"] == "ImageChecksumMismatch" and w,
                              60, "the mismatch reported")
            assert sha in w["message"] and "nothing was kept" in w["message"]
            described = ctl("describe", "workload", "wrong-sum", env=env).stdout
            assert "ImageChecksumMismatch" in described
            ctl("delete", "workload", "wrong-sum", env=env)
            ctl("delete", "workload", "from-url", env=env)
        finally:
            if dev is not None:
                dev.stop(signal.SIGINT)
            shutil.rmtree(home, ignore_errors=True)
