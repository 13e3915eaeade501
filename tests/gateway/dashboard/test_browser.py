"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a real
`persys dev` cluster of three nodes on ports the kernel picks. Any request to a non-local
address fails the test. Each test saves screenshots of the pages it visits into docs/dashboard/
(shown in docs/dashboard.md).

- sign in with a token: the session cookie's flags; overview, lists and pages render;
- apply a manifest from the UI (plan preview first) and watch it reach Running without reload;
- a Pending workload's page names every node and its reason;
- a viewer sees no mutating control, and a forged POST is refused (and audited);
- drain a node and watch its progress live;
- the live connection dropped (a proxy resets it) and resumed shows every event once;
- keyboard (skip link, focus) and no horizontal overflow at 1280x800 and phone width.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect as ws_connect

from tests.e2e.harness import eventually
from tests.gateway.dashboard.browser import Browser, Dev, dev_cluster, goto, live, process_manifest, shot, sign_in
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    with dev_cluster(tmp_path_factory.mktemp("dashboard")) as d:
        yield d


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture
def page_as(dev: Dev, browser: Browser) -> Iterator[Any]:
    """page_as(role, path="/", width, height): a signed-in page in a fresh context."""
    contexts: list[Any] = []

    def make(role: str, path: str = "/", width: int = 1280, height: int = 800) -> Any:
        ctx = browser.context(width, height)
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("dialog", lambda d: d.accept())
        sign_in(page, dev.url, dev.tokens[role], path)
        return page

    yield make
    for ctx in contexts:
        ctx.close()
    assert browser.outside == [], f"requests to non-local addresses: {browser.outside}"


def text(page: Any, selector: str) -> str:
    return str(page.inner_text(selector))


def test_sign_in_with_a_token(dev: Dev, browser: Browser, page_as: Any) -> None:
    ctx = browser.context()
    page = ctx.new_page()
    goto(page, dev.url + "/ui/workloads")
    assert "/ui/signin" in page.url
    shot(page, "signin")
    page.fill("#token", "persys_0000000000000000_wrong")
    page.click("form[action='/ui/signin'] button[type=submit]")
    assert "sign-in refused" in text(page, "main")
    page.fill("#token", dev.tokens["operator"])
    page.click("form[action='/ui/signin'] button[type=submit]")
    page.wait_for_url(re.compile(r".*/ui/workloads$"))  # back where the user was going
    cookie = next(c for c in ctx.cookies() if c["name"] == "persys_session")
    assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
    assert "user:operator1" in text(page, "header")
    ctx.close()

    page = page_as("admin")
    live(page)
    main = text(page, "main")
    assert "Control plane" in main and "Nodes (3)" in main and "Capacity" in main
    assert "allocatable" in main
    shot(page, "overview")
    paints: dict[str, float] = {}
    for path, name, needle in (("/ui/nodes", "nodes", "tiny"), ("/ui/topology", "topology", "zone=a"),
                               ("/ui/events", "events", "Kind"), ("/ui/audit", "audit", "/persys.v1.Auth/CreateToken"),
                               ("/ui/volumes", "volumes", "Volumes"), ("/ui/buckets", "buckets", "Buckets"),
                               ("/ui/secrets", "secrets", "Values are never shown"),
                               ("/ui/nodes/big", "node", "Runtimes and storage")):
        goto(page, dev.url + path)
        assert needle in text(page, "main"), (path, text(page, "main")[:500])
        shot(page, name)
        paints[path] = page.evaluate(
            "(performance.getEntriesByName('first-contentful-paint')[0] || {startTime: -1}).startTime")
    # A timing, printed (docs/dashboard.md), not asserted: the budget is 1 s on this machine.
    print("first contentful paint (ms):", {k: round(v) for k, v in paints.items()})
    goto(page, dev.url + "/ui/topology")
    page.fill("#topology-search", "tin")
    assert page.locator("li.tile:visible").count() == 1


def test_sign_in_with_a_client_certificate(dev: Dev, browser: Browser) -> None:
    ctx = browser.context(client_certificates=[{"origin": dev.url, "certPath": dev.cert, "keyPath": dev.key}])
    try:
        page = ctx.new_page()
        goto(page, dev.url + "/")
        button = page.locator("form[action='/ui/signin'] button", has_text="client certificate")
        label = button.inner_text()
        button.click()
        page.wait_for_selector("main h1:text('Overview')")
        principal = text(page, ".principal")
        assert principal in label and "admin" in text(page, ".who")
    finally:
        ctx.close()
    # Without the certificate the same browser is offered the token form only.
    plain = browser.context()
    try:
        page = plain.new_page()
        goto(page, dev.url + "/")
        assert page.locator("button", has_text="client certificate").count() == 0
    finally:
        plain.close()


def test_apply_from_the_ui_reaches_running_without_reload(dev: Dev, page_as: Any) -> None:
    page = page_as("operator", "/ui/apply")
    page.fill("#manifest", process_manifest("web-ui"))
    page.click("button[value=plan]")
    preview = text(page, "#preview")
    assert "web-ui-0 →" in preview or "web-ui →" in preview, preview
    assert "rejected" in preview and "gpu" in preview  # the tainted node, with its reason
    shot(page, "apply-preview", full=True)
    page.click("button[value=apply]")
    page.wait_for_url(re.compile(r".*/ui/workloads/web-ui$"))
    dev.created.append("web-ui")
    live(page)
    page.evaluate("window.__notReloaded = true")
    t0 = time.monotonic()
    page.wait_for_selector("#status .b-running", timeout=20_000)
    took = time.monotonic() - t0
    assert page.evaluate("window.__notReloaded === true")  # the same document: updated live
    assert dev.workload("web-ui")["phase"] == "Running"
    shot(page, "workload")
    print(f"Running shown {took:.2f}s after the page opened")

    # A change made elsewhere shows within 2 s, still without reload: a restart from the API.
    goto(page, dev.url + "/ui/workloads?label=suite%3Ddashboard")
    live(page)
    page.evaluate("window.__notReloaded = true")
    dev.apply(process_manifest("web-ui-2"))
    t0 = time.monotonic()
    page.wait_for_selector("#list a[href='/ui/workloads/web-ui-2']", timeout=2_000)
    print(f"a new workload listed {time.monotonic() - t0:.2f}s after its apply")
    assert page.evaluate("window.__notReloaded === true")
    shot(page, "workloads")


def test_edit_a_manifest_see_the_diff_and_roll_back(dev: Dev, page_as: Any) -> None:
    dev.apply(process_manifest("edited"))
    page = page_as("operator", "/ui/workloads/edited")
    page.click("a[href='/ui/apply?from=edited']")
    manifest = page.input_value("#manifest")
    assert "name: edited" in manifest and "cpuMillicores: 10" in manifest
    page.fill("#manifest", manifest.replace("cpuMillicores: 10", "cpuMillicores: 20"))
    page.click("button[value=plan]")
    diff = text(page, "#preview pre.diff")
    assert "-    cpuMillicores: 10" in diff and "+    cpuMillicores: 20" in diff, diff
    page.click("button[value=apply]")
    page.wait_for_url(re.compile(r".*/ui/workloads/edited$"))
    page.wait_for_selector("#revisions form[action='/ui/workloads/edited/rollback']")
    # The diff is folded (<details>); a live refresh may fold it again, so it is read as text.
    assert "+  cpuMillicores: 20" in str(page.text_content("#revisions pre.diff"))  # the spec alone
    page.click("#revisions summary")
    shot(page, "workload-revisions", full=True)
    page.click("#revisions form[action='/ui/workloads/edited/rollback'] button")
    page.wait_for_url(re.compile(r".*/ui/workloads/edited$"))
    w = dev.workload("edited")
    assert w["generation"] == 3 and w["spec"]["resources"]["cpuMillicores"] == 10
    assert "rollback of 1" in text(page, "#revisions")


def test_pending_workload_shows_every_nodes_reasons(dev: Dev, page_as: Any) -> None:
    dev.apply(process_manifest("too-big", memory_mb=6000))
    eventually(lambda: dev.workload("too-big")["reason"] == "Unschedulable", 15, "too-big Unschedulable")
    page = page_as("viewer", "/ui/workloads/too-big")
    rows = {r.get_attribute("data-node"): r.inner_text() for r in page.locator("table.placement tr[data-node]").all()}
    assert set(rows) == {"big", "gpu", "tiny"}, rows
    assert "insufficient memory" in rows["big"] and "6000" in rows["big"]
    assert "insufficient memory" in rows["tiny"]
    assert "taint" in rows["gpu"] and "gpu=true" in rows["gpu"]
    assert "0/3 nodes available" in text(page, "#placement")
    shot(page, "workload-pending", full=True)
    # The counterfactual: the smallest verified changes that would place it, as the API gives them.
    with dev.api() as c:
        whatif = c.get("/v1/workloads/too-big/whatif").json()
    changes = [ch for rep in whatif["replicas"] for ch in rep["changes"]]
    assert changes, whatif
    panel = text(page, "#placement .whatif")
    assert all(ch["summary"] in panel for ch in changes), (panel, changes)
    assert "what would place it" in panel
    page.locator("#placement .whatif").scroll_into_view_if_needed()
    shot(page, "workload-whatif")


def test_viewer_sees_no_mutating_control_and_a_forged_post_is_refused(dev: Dev, page_as: Any) -> None:
    dev.apply(process_manifest("guarded"))
    page = page_as("viewer", "/ui/workloads/guarded")
    for path in ("/ui/workloads/guarded", "/ui/nodes/big", "/", "/ui/workloads"):
        goto(page, dev.url + path)
        posts = page.locator("form[method=post]:not([action='/ui/signout'])")
        assert posts.count() == 0, (path, [posts.nth(i).get_attribute("action") for i in range(posts.count())])
        assert page.locator("nav a[href='/ui/apply'], nav a[href='/ui/audit']").count() == 0
    csrf = page.locator("form[action='/ui/signout'] input[name=csrf]").get_attribute("value")
    before = dev.workload("guarded")["generation"]
    forged = page.request.post(dev.url + "/ui/workloads/guarded/stop", form={"csrf": csrf},
                               headers={"origin": dev.url})
    assert forged.status == 403 and "may not control workloads" in forged.text()
    goto(page, dev.url + "/ui/apply")
    assert "may not apply workloads" in text(page, "main")
    assert dev.workload("guarded")["desiredState"] == "Running" and dev.workload("guarded")["generation"] == before
    with dev.api() as c:
        records = c.get("/v1/audit", params={"who": "viewer1"}).json()["items"]
    assert any(r["result"] == "403" and "/ui/workloads/guarded/stop" in r["action"] for r in records), records
    # An operator's POST without the session's CSRF token, or from another origin, is refused too.
    op = page_as("operator", "/ui/workloads/guarded")
    assert op.request.post(dev.url + "/ui/workloads/guarded/stop", form={"csrf": "x"},
                           headers={"origin": dev.url}).status == 403
    token = op.locator("form[action='/ui/signout'] input[name=csrf]").get_attribute("value")
    assert op.request.post(dev.url + "/ui/workloads/guarded/stop", form={"csrf": token},
                           headers={"origin": "https://evil.example"}).status == 403
    assert dev.workload("guarded")["desiredState"] == "Running"
    # The operator's own stop goes through, audited as that user.
    op.click("form[action='/ui/workloads/guarded/stop'] button")
    eventually(lambda: dev.workload("guarded")["desiredState"] == "Stopped", 10, "guarded Stopped")
    with dev.api() as c:
        records = c.get("/v1/audit", params={"who": "operator1"}).json()["items"]
    assert any(r["principal"] == "user:operator1" and "ControlWorkload" in r["action"] for r in records), records
    dev.delete("guarded")  # stopped, it would stay "moving" in a drain for good


def test_live_connection_dropped_and_resumed_shows_every_event_once(dev: Dev, browser: Browser,
                                                                    tmp_path: Path) -> None:
    proxy = TcpProxy(dev.url.removeprefix("https://"))
    via = f"https://{proxy.address}"
    ctx = browser.context()
    try:
        page = ctx.new_page()
        sign_in(page, via, dev.tokens["viewer"], "/ui/events")
        live(page)
        before = set(page.eval_on_selector_all("#events-table tr[data-event]", "rs => rs.map(r => r.dataset.event)"))
        proxy.reset()  # every connection through it closed, new ones refused
        page.wait_for_selector("body:not([data-live='live'])", state="attached", timeout=10_000)
        names = [f"drop-{i}" for i in range(4)]
        for n in names:
            dev.apply(process_manifest(n))
        proxy.heal()
        with dev.api() as c:
            wanted = {e["id"] for e in c.get("/v1/events", params={"limit": 500}).json()
                      if e["subject"] in {f"workload/{n}" for n in names}}
        assert wanted

        def shown() -> list[str]:
            return list(page.eval_on_selector_all("#events-table tr[data-event]",
                                                  "rs => rs.map(r => r.dataset.event)"))

        eventually(lambda: wanted <= set(shown()), 20, "the missed events shown after the resume")
        ids = shown()
        assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]  # each once
        assert before <= set(ids)
        assert page.get_attribute("#gap", "hidden") is not None  # nothing was lost: no gap marker
        shot(page, "events-live")
        # Resuming after an event the bus no longer holds: the gap is said, not skipped silently.
        page.evaluate("persysLive.drop(); persysLive.resume('1-0')")
        page.wait_for_selector("#gap:not([hidden])", timeout=10_000)
        assert "lost" in text(page, "#gap")
        shot(page, "events-gap")
    finally:
        ctx.close()
        proxy.close()
    assert browser.outside == []


PINNED = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: pinned, labels: {suite: dashboard}}
spec:
  type: process
  resources: {cpuMillicores: 10, memoryMb: 16}
  process: {command: [sleep, "3600"]}
  volumes:
    - {name: data, driver: local, sizeMb: 16, mountPath: /data}
"""


def test_drain_a_node_and_see_progress_and_the_stuck_workload(dev: Dev, page_as: Any) -> None:
    dev.apply(PINNED)  # its node-local volume keeps it where it is: a drain cannot move it
    node = eventually(lambda: dev.workload("pinned")["node"] if dev.workload("pinned")["phase"] == "Running"
                      else None, 60, "pinned Running")[0]
    dev.apply(process_manifest("mover"))
    eventually(lambda: dev.workload("mover")["phase"] == "Running", 20, "mover Running")
    moves = dev.workload("mover")["node"] == node
    page = page_as("operator", f"/ui/nodes/{node}")
    live(page)
    assert "Schedulable" in text(page, "#drain")
    page.click(f"form[action='/ui/nodes/{node}/drain'] button")
    page.wait_for_selector("#drain .drain-summary", timeout=15_000)  # the answer's page (same URL)
    live(page)
    page.evaluate("window.__notReloaded = true")
    try:  # progress arrives live: the stuck workload and why, nothing left to move
        page.wait_for_selector("#drain .drain-summary:text('0 remaining, 0 moving, 1 stuck')", timeout=30_000)
    except Exception:
        raise AssertionError(text(page, "#drain")) from None
    assert page.evaluate("window.__notReloaded === true")
    stuck = text(page, "#drain table.stuck")
    assert "pinned" in stuck and f"node-local volume lives on {node}" in stuck
    shot(page, "node-drain", full=True)
    if moves:
        eventually(lambda: dev.workload("mover")["node"] != node and dev.workload("mover")["phase"] == "Running",
                   30, "mover elsewhere")
    page.click(f"form[action='/ui/nodes/{node}/uncordon'] button")
    page.wait_for_selector("#drain >> text=Schedulable", timeout=10_000)
    dev.delete("pinned")


def test_keyboard_and_narrow_screens(dev: Dev, page_as: Any) -> None:
    for width, height, name in ((1280, 800, "overview"), (390, 844, "overview-phone")):
        page = page_as("admin", "/", width, height)
        live(page)
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, f"horizontal overflow of {overflow}px at {width}px"
        if width < 600:
            shot(page, name)
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"


def test_exec_in_a_workload_through_the_browser_terminal(dev: Dev, page_as: Any) -> None:
    dev.apply(process_manifest("shell"))
    eventually(lambda: dev.workload("shell")["phase"] == "Running", 20, "shell Running")
    page = page_as("operator", "/ui/workloads/shell")
    page.click("a[href='/ui/workloads/shell/terminal']")
    page.wait_for_selector("#terminal .xterm")
    page.fill("#term-command", "sh")
    page.click("#term-connect")
    page.wait_for_selector("#term-status[data-state=connected]", timeout=15_000)
    page.locator("#terminal .xterm").click()
    page.keyboard.type("echo dash$((6*7))board; exit 3\n")
    page.wait_for_selector("#term-status[data-state=ended]", timeout=15_000)
    assert "exit code 3" in text(page, "#term-status")
    assert "dash42board" in text(page, "#terminal .xterm-rows")  # the shell's output, rendered by xterm.js
    shot(page, "terminal")
    with dev.api() as c:
        records = c.get("/v1/audit", params={"who": "operator1"}).json()["items"]
    assert any(r["action"] == "GET /v1/workloads/{workload_id}/terminal" and r["object"].get("command") == "sh"
               for r in records), records
    # A viewer has no terminal link, and the WebSocket refuses the viewer's session.
    viewer = page_as("viewer", "/ui/workloads/shell")
    assert viewer.locator("a[href='/ui/workloads/shell/terminal']").count() == 0
    goto(viewer, dev.url + "/ui/workloads/shell/terminal")
    assert "may not exec workloads" in text(viewer, "main")
    opened = viewer.evaluate("""() => new Promise((done) => {
        const ws = new WebSocket(`wss://${location.host}/v1/workloads/shell/terminal?command=sh`);
        ws.onopen = () => done("open"); ws.onclose = (e) => done("closed");
    })""")
    assert opened == "closed"
    with dev.api() as c:
        records = c.get("/v1/audit", params={"who": "viewer1"}).json()["items"]
    assert any(r["result"] == "403" and r["action"] == "GET /v1/workloads/{workload_id}/terminal" for r in records)
    # The operator's session cookie from another site's page (its Origin) opens nothing.
    sid = next(c["value"] for c in page.context.cookies() if c["name"] == "persys_session")
    ctx = ssl.create_default_context(cafile=dev.ca)
    uri = dev.url.replace("https://", "wss://") + "/v1/workloads/shell/terminal?command=sh"
    for origin, refused in (("https://evil.example", True), (dev.url, False)):
        try:
            with ws_connect(uri, ssl=ctx, additional_headers={"cookie": f"persys_session={sid}", "origin": origin},
                            open_timeout=30) as ws:
                assert json.loads(ws.recv(timeout=15))["ready"]
                assert not refused
        except InvalidStatus as err:
            assert refused and err.response.status_code == 401, err


def test_usage_charts_from_the_meter(dev: Dev, page_as: Any) -> None:
    dev.apply(process_manifest("metered"))
    eventually(lambda: dev.workload("metered")["phase"] == "Running", 20, "metered Running")
    page = page_as("viewer", "/ui/workloads/metered?range=15m")
    assert page.locator("#usage figure svg.chart").count() == 4  # CPU, memory, disk, network

    def drawn() -> bool:
        page.reload()
        return page.locator("#usage svg.chart circle").count() >= 6  # a sample of each of the six metrics
    eventually(drawn, 90, "the meter's samples drawn")
    label = page.get_attribute("#usage svg.chart >> nth=1", "aria-label")
    assert label is not None and label.startswith("Memory (bytes), latest: metered") and "no samples" not in label
    shot(page, "workload-usage", full=True)
    goto(page, dev.url + "/ui/nodes/big?range=15m")
    eventually(lambda: page.reload() or page.locator("#usage svg.chart polyline").count() >= 1, 60, "node usage")


TICKER = """
apiVersion: persys.dev/v1
kind: Workload
metadata: {name: ticker, labels: {suite: dashboard}}
spec:
  type: process
  resources: {cpuMillicores: 10, memoryMb: 16}
  process: {command: [sh, -c, "i=0; while true; do echo tick-$i; i=$((i+1)); sleep 0.3; done"]}
"""


def test_logs_follow_live_on_the_workload_page(dev: Dev, page_as: Any) -> None:
    dev.apply(TICKER)
    eventually(lambda: dev.workload("ticker")["phase"] == "Running", 30, "ticker Running")
    page = page_as("viewer", "/ui/workloads/ticker")
    live(page)
    page.evaluate("window.__notReloaded = true")

    def ticks() -> list[int]:
        return [int(x[5:]) for x in text(page, "#log-lines").split() if x.startswith("tick-")]

    first = ticks()
    t0 = time.monotonic()
    eventually(lambda: len(ticks()) >= len(first) + 5, 30, "new lines appended live")
    print(f"5 new lines shown {time.monotonic() - t0:.2f}s after the page was live")
    assert page.evaluate("window.__notReloaded === true")
    # Dropped and resumed: the lines written meanwhile come once each, none lost.
    page.evaluate("persysLive.drop()")
    seen = len(ticks())
    page.wait_for_timeout(1500)
    assert len(ticks()) == seen  # not following while dropped
    page.evaluate("persysLive.resume()")
    live(page)
    eventually(lambda: len(ticks()) >= seen + 10, 30, "following again")
    shown = ticks()
    assert len(shown) == len(set(shown)), [t for t in shown if shown.count(t) > 1]  # each once
    assert shown == list(range(shown[0], shown[-1] + 1)), shown  # none lost
    page.evaluate("document.getElementById('logs').scrollIntoView()")
    shot(page, "workload-logs-live")
    dev.delete("ticker")
