"""A `persys dev` cluster (three agents: a roomy node, a tainted one, a small one) and Debian's
chromium driven by Playwright, for the dashboard's browser tests.

The browser is /usr/bin/chromium (never a downloaded one); every request it makes to anything
but this machine is aborted and recorded, and the test fails on it (`Browser.outside`)."""

from __future__ import annotations

import contextlib
import re
import signal
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import yaml
from playwright.sync_api import expect

from tests.e2e.harness import REPO, Proc, ctl, eventually, persys

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
LOCAL_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
SHOTS = REPO / "docs" / "dashboard"
NODES = REPO / "examples" / "dev-3-nodes.yaml"  # big (roomy), gpu (tainted), tiny (small)


@dataclass
class Dev:
    proc: Proc
    url: str
    env: dict[str, str]
    tokens: dict[str, str]
    ca: str
    cert: str  # the dev admin's client certificate (persysctl's), and its key
    key: str
    created: list[str] = field(default_factory=list)

    def api(self, role: str = "admin") -> httpx.Client:
        ctx = ssl.create_default_context(cafile=self.ca)
        return httpx.Client(base_url=self.url, verify=ctx, timeout=30,
                            headers={"authorization": f"Bearer {self.tokens[role]}"})

    def apply(self, manifest: str) -> dict[str, Any]:
        doc = yaml.safe_load(manifest)
        with self.api() as c:
            r = c.post("/v1/workloads", json=doc)
            assert r.status_code in (200, 201), r.text
        self.created.append(doc["metadata"]["name"])
        return dict(r.json())

    def delete(self, name: str) -> None:
        with self.api() as c:
            assert c.delete(f"/v1/workloads/{name}").status_code == 200
        eventually(lambda: self.api().get(f"/v1/workloads/{name}").status_code == 404, 30, f"{name} gone")
        self.created.remove(name)

    def workload(self, name: str) -> dict[str, Any]:
        with self.api() as c:
            r = c.get(f"/v1/workloads/{name}")
            assert r.status_code == 200, r.text
            return dict(r.json())


def process_manifest(name: str, memory_mb: int = 16, cpu: int = 10) -> str:
    return (f"apiVersion: persys.dev/v1\nkind: Workload\nmetadata: {{name: {name}, labels: {{suite: dashboard}}}}\n"
            f"spec:\n  type: process\n  resources: {{cpuMillicores: {cpu}, memoryMb: {memory_mb}}}\n"
            f"  process: {{command: [sleep, \"3600\"]}}\n")


@contextlib.contextmanager
def dev_cluster(tmp: Path, *args: str) -> Iterator[Dev]:
    """`persys dev` with the three nodes of NODES, or with `args` instead (then its data lives in
    `tmp`/home, which a VM's QEMU must be able to reach)."""
    home = tmp / "home"
    home.mkdir(exist_ok=True)
    env = {"PERSYS_HOME": str(home)}
    where = args or ("--data-dir", str(tmp / "data"), "--nodes", str(NODES))
    proc = Proc("dev", persys("dev", "--port", "0", *where), tmp, env=env)
    try:
        proc.wait_for("Press Ctrl-C to stop.", timeout=90)
        m = re.search(r"dashboard:\s+(https://127\.0\.0\.1:\d+)/", proc.text())
        assert m, proc.text()[-2000:]  # the README's first command prints the dashboard's address
        tokens = {}
        for role in ("admin", "operator", "viewer"):
            out = ctl("auth", "token", "create", f"{role}1", "--role", role, env=env).stdout
            found = re.search(r"persys_[A-Za-z0-9_-]+", out)
            assert found, out
            tokens[role] = found.group(0)
        cfg = yaml.safe_load((home / "config.yaml").read_text())
        dev = Dev(proc, m.group(1), env, tokens, _find(cfg, "ca"), _find(cfg, "cert"), _find(cfg, "key"))
        yield dev
        for name in dev.created:  # persys dev leaves workloads running when it stops: remove ours
            ctl("delete", "workload", name, env=env, check=False)
        for name in dev.created:
            eventually(lambda n=name: ctl("get", "workloads", n, env=env, check=False).returncode != 0,  # type: ignore[misc]
                       30, f"{name} deleted")
    finally:
        proc.stop(signal.SIGINT)


def _find(cfg: Any, key: str) -> str:
    """A file the saved persysctl config names (its layout: contexts or flat)."""
    found: list[str] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == key and isinstance(x, str):
                    found.append(x)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(cfg)
    assert found, cfg
    return found[0]


class Browser:
    """One chromium for the module; a fresh context (cookies) per sign-in."""

    def __init__(self) -> None:
        from playwright.sync_api import sync_playwright

        self._pw = sync_playwright().start()
        self.browser = self._pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        self.outside: list[str] = []

    def context(self, width: int = 1280, height: int = 800, **options: Any) -> Any:
        ctx = self.browser.new_context(ignore_https_errors=True, viewport={"width": width, "height": height},
                                       **options)

        def guard(route: Any) -> None:
            host = urlsplit(route.request.url).hostname or ""
            if route.request.url.startswith(("data:", "blob:", "about:")) or host in LOCAL_HOSTS:
                route.continue_()
            else:
                self.outside.append(route.request.url)
                route.abort()

        ctx.route("**/*", guard)
        return ctx

    def close(self) -> None:
        self.browser.close()
        self._pw.stop()


def goto(page: Any, url: str) -> None:
    """page.goto, again when chromium saw the machine's network change under it (another test
    creating a Docker network or a veth: ERR_NETWORK_CHANGED aborts the navigation)."""
    for attempt in range(5):
        try:
            page.goto(url)
            return
        except Exception as err:
            if not network_changed(err) or attempt == 4:
                raise


def network_changed(err: Exception) -> bool:
    return "ERR_NETWORK_CHANGED" in str(err) or "chrome-error://" in str(err)


def sign_in(page: Any, url: str, token: str, path: str = "/") -> None:
    for attempt in range(5):
        goto(page, url + path)
        page.wait_for_url(re.compile(r".*/ui/signin.*"))
        page.fill("#token", token)
        page.click("form[action='/ui/signin'] button[type=submit]")
        try:  # signed in once the form's answer has taken the page elsewhere (its cookie set)
            expect(page).not_to_have_url(re.compile(r".*/ui/signin.*"), timeout=30_000)
            page.wait_for_load_state("domcontentloaded")
        except Exception as err:
            if not network_changed(err) or attempt == 4:
                raise
        if not page.url.startswith("chrome-error://") or attempt == 4:  # see goto
            return


def live(page: Any) -> None:
    """Until the page's live connection is open."""
    page.wait_for_selector("body[data-live='live']", timeout=10_000)


def shot(page: Any, name: str, full: bool = False) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=full)
