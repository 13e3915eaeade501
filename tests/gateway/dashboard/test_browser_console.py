"""A VM's and a microVM's serial console in the browser: a tiny libvirt/QEMU guest and a QEMU
microvm guest (TCG here, no KVM: Firecracker cannot run) on a `persys dev` node; each workload
page's Console (xterm.js over /v1/workloads/NAME/console, the agent relaying libvirt's console
stream or the microVM's QEMU chardev socket: the same page, the same WebSocket), the guest's
output seen in the page and a line typed into its shell answered. Audited as the operator; a
viewer gets no console.

Its own cluster: QEMU runs as libvirt-qemu and must reach the VM's files, so the cluster's home
is under /var/tmp (pytest's tmp dirs are 0700), with the guest's images linked into its data dir
(the workload policy admits node paths only there). The guest boots in 10-60 s under TCG."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.harness import eventually
from tests.gateway.dashboard.browser import Browser, Dev, dev_cluster, goto, shot, sign_in
from tests.microvm_fixtures import READY_MARKER, GuestImages, microvm_guest  # noqa: F401
from tests.vm_fixtures import GUEST_READY, TestGuest, linked_into, test_guest, vm_host  # noqa: F401

pytestmark = [pytest.mark.e2e, pytest.mark.vm]


@pytest.fixture(scope="module")
def vm_dev(test_guest: TestGuest, microvm_guest: GuestImages  # noqa: F811
           ) -> Iterator[tuple[Dev, TestGuest, GuestImages]]:
    root = Path(tempfile.mkdtemp(dir="/var/tmp", prefix="persys-dash-console-"))
    root.chmod(0o755)
    try:
        images = root / "home" / "dev" / "images"
        images.mkdir(parents=True)

        def placed(guest: Any, where: str) -> Any:
            (images / where).mkdir()
            files = {f: v for f, v in vars(guest).items() if isinstance(v, Path) and v.is_file()}
            return dataclasses.replace(guest, **{f: linked_into(v, images / where, f"{f}-{v.name}")
                                                 for f, v in files.items()})

        vm, micro = placed(test_guest, "vm"), placed(microvm_guest, "microvm")
        with dev_cluster(root, "--node-id", "vm-node") as dev:
            yield dev, vm, micro
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_microvm_console_in_the_browser(vm_dev: tuple[Dev, TestGuest, GuestImages]) -> None:
    dev, _, guest = vm_dev
    dev.apply(f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: console-micro, labels: {{suite: dashboard}}}}
spec:
  type: microvm
  resources: {{cpuMillicores: 500, memoryMb: 160}}
  microvm:
    kernel: {guest.kernel}
    initrd: {guest.initrd}
    rootfs: {guest.rootfs}
    cmdline: "console=ttyS0 quiet pci=off"
    memoryMb: 128
""")
    t0 = time.monotonic()
    with dev.api() as c:
        eventually(lambda: READY_MARKER in c.get("/v1/workloads/console-micro/logs",
                                                 params={"tail": 200}).json()["text"], 240, "the microVM's shell")
    print(f"microVM booted to its shell in {time.monotonic() - t0:.1f}s")
    token = uuid.uuid4().hex[:8]
    browser = Browser()
    try:
        ctx = browser.context()
        page = ctx.new_page()
        sign_in(page, dev.url, dev.tokens["operator"], "/ui/workloads/console-micro")
        _type_on_the_console(page, "console-micro", f"echo mic-{token}-$((6*7))\n", f"mic-{token}-42")
        shot(page, "console-microvm")
        ctx.close()
    finally:
        browser.close()
    assert browser.outside == [], f"requests to non-local addresses: {browser.outside}"
    dev.delete("console-micro")


def _type_on_the_console(page: Any, name: str, line: str, wanted: str) -> None:
    """Open the workload's console from its page, type `line` until the guest's answer shows."""
    assert page.locator(f"a[href='/ui/workloads/{name}/terminal']").count() == 0  # a VM: no exec
    page.click(f"a[href='/ui/workloads/{name}/console']")
    page.wait_for_selector("#terminal .xterm")
    assert page.locator("#term-command").count() == 0  # a console runs no command
    page.click("#term-connect")
    page.wait_for_selector("#term-status[data-state=connected]", timeout=30_000)
    page.locator("#terminal .xterm").click()
    rows = "#terminal .xterm-rows"

    def answered() -> bool:  # typed again until the guest's shell answers
        if wanted in page.inner_text(rows):
            return True
        page.keyboard.type(line)
        page.wait_for_timeout(2000)
        return wanted in page.inner_text(rows)

    eventually(answered, 90, "the guest's answer in the browser")


def test_vm_console_in_the_browser(vm_dev: tuple[Dev, TestGuest, GuestImages]) -> None:
    dev, guest, _ = vm_dev
    token = uuid.uuid4().hex[:8]
    dev.apply(f"""
apiVersion: persys.dev/v1
kind: Workload
metadata: {{name: console-vm, labels: {{suite: dashboard}}}}
spec:
  type: vm
  resources: {{cpuMillicores: 1000, memoryMb: 256}}
  vm:
    image: {guest.base_disk}
    kernel: {guest.kernel}
    initrd: {guest.initrd}
    cmdline: console=ttyS0
    memoryMb: 256
    cloudInit: {{userData: "#cloud-config\\n# token {token}\\n"}}
""")
    t0 = time.monotonic()
    eventually(lambda: dev.workload("console-vm")["phase"] == "Running", 180, "console-vm Running")
    with dev.api() as c:  # the guest's shell is on its console once it printed GUEST_READY
        eventually(lambda: GUEST_READY in c.get("/v1/workloads/console-vm/logs", params={"tail": 200}).json()["text"],
                   240, "the guest ready on its console")
    print(f"VM booted to its shell in {time.monotonic() - t0:.1f}s")
    browser = Browser()
    try:
        ctx = browser.context()
        page = ctx.new_page()
        sign_in(page, dev.url, dev.tokens["operator"], "/ui/workloads/console-vm")
        _type_on_the_console(page, "console-vm", f"echo con-{token}-$((6*7))\n", f"con-{token}-42")
        shot(page, "console")
        # Leaving detaches; the VM keeps running, and the console can be opened again.
        goto(page, dev.url + "/ui/workloads/console-vm")
        assert dev.workload("console-vm")["phase"] == "Running"
        with dev.api() as c:
            records = c.get("/v1/audit", params={"who": "operator1"}).json()["items"]
            assert any(r["action"] == "GET /v1/workloads/{workload_id}/console" and r["object"].get("node") == "vm-node"
                       for r in records), records
            # What was typed reached the guest's console log too (logs read the same serial port).
            eventually(lambda: f"con-{token}-42" in c.get("/v1/workloads/console-vm/logs",
                                                          params={"tail": 200}).json()["text"], 30, "logged")
        # A viewer has no console link, and the page and the WebSocket refuse the viewer.
        viewer_ctx = browser.context()
        viewer = viewer_ctx.new_page()
        sign_in(viewer, dev.url, dev.tokens["viewer"], "/ui/workloads/console-vm")
        assert viewer.locator("a[href='/ui/workloads/console-vm/console']").count() == 0
        goto(viewer, dev.url + "/ui/workloads/console-vm/console")
        assert "may not exec workloads" in viewer.inner_text("main")
        opened: Any = viewer.evaluate("""() => new Promise((done) => {
            const ws = new WebSocket(`wss://${location.host}/v1/workloads/console-vm/console`);
            ws.onopen = () => done("open"); ws.onclose = () => done("closed");
        })""")
        assert opened == "closed"
        viewer_ctx.close()
        ctx.close()
    finally:
        browser.close()
    assert browser.outside == [], f"requests to non-local addresses: {browser.outside}"
    dev.delete("console-vm")
