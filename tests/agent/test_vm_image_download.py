"""VM images from an http(s) URL: downloaded once per checksum into the node's image registry,
verified before use, reported as ImagePulling/ImagePulled, failures classified. A real HTTP
server (tests/http_file_server.py) serves the bytes and counts requests."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from persys.agent.runtimes.base import RuntimeFailure, StartPending
from persys.agent.runtimes.vm import image_download as dl
from persys.agent.runtimes.vm.images import ImageRegistry
from persys.model.status import IMAGE_PULLED, IMAGE_PULLING
from tests.http_file_server import FileServer

DISK = b"\0" * (3 << 20)  # a raw disk image of 3 MiB
DISK_SHA = hashlib.sha256(DISK).hexdigest()


@pytest.fixture
def server() -> Iterator[FileServer]:
    s = FileServer()
    s.routes["/disk.img"] = (200, DISK, {})
    yield s
    s.close()


@pytest.fixture
def registry(tmp_path: Path) -> ImageRegistry:
    return ImageRegistry(tmp_path)


async def _until_done(d: dl.ImageDownloader, owner: str, url: str, sha: str) -> list[StartPending]:
    """Call ensure as the agent would: until it stops raising StartPending; the pendings seen."""
    seen: list[StartPending] = []
    for _ in range(200):
        try:
            await d.ensure(owner, url, sha)
            return seen
        except StartPending as p:
            seen.append(p)
            if p.done is not None:
                await asyncio.wait_for(asyncio.shield(p.done), 20)
    raise AssertionError("never done")


def _incoming(registry: ImageRegistry) -> list[Path]:
    return list((registry.root / "blobs").glob(".incoming-*"))


async def test_downloads_once_verifies_and_is_cached(server: FileServer, registry: ImageRegistry) -> None:
    d = dl.ImageDownloader(registry)
    url = server.base + "/disk.img"
    seen = await _until_done(d, "vm-a.0", url, DISK_SHA)
    assert [p.code for p in seen] == [IMAGE_PULLING, IMAGE_PULLED]
    assert "sha256 verified" in str(seen[-1]) and str(len(DISK)) in str(seen[-1])
    rec = await d.ensure("vm-a.0", url, DISK_SHA)
    assert rec.name == f"sha256-{DISK_SHA}" and rec.sha256 == DISK_SHA and rec.format == "raw"
    assert hashlib.sha256(await asyncio.to_thread(Path(rec.path).read_bytes)).hexdigest() == DISK_SHA
    assert rec.source == url
    # Another instance, another agent process, another URL of the same bytes: no request at all.
    again = await dl.ImageDownloader(registry).ensure("vm-b.0", server.base + "/elsewhere.img", DISK_SHA)
    assert again.path == rec.path
    assert server.requests == ["/disk.img"]
    assert not _incoming(registry)


async def test_two_instances_share_one_download(server: FileServer, registry: ImageRegistry) -> None:
    server.gate.clear()
    d = dl.ImageDownloader(registry)
    url = server.base + "/disk.img"
    with pytest.raises(StartPending) as a:
        await d.ensure("vm-a.0", url, DISK_SHA)
    with pytest.raises(StartPending) as b:
        await d.ensure("vm-b.0", url, DISK_SHA)
    assert a.value.code == b.value.code == IMAGE_PULLING and a.value.done is b.value.done
    assert "downloading " + url in str(a.value)
    server.gate.set()
    for owner in ("vm-a.0", "vm-b.0"):  # each is told once that it came down
        codes = [p.code for p in await _until_done(d, owner, url, DISK_SHA)]
        assert codes[-1] == IMAGE_PULLED and set(codes[:-1]) <= {IMAGE_PULLING}
    assert server.requests == ["/disk.img"]


async def test_wrong_checksum_is_terminal_and_keeps_nothing(server: FileServer, registry: ImageRegistry) -> None:
    d = dl.ImageDownloader(registry)
    with pytest.raises(RuntimeFailure) as err:
        await _until_done(d, "vm-a.0", server.base + "/disk.img", "0" * 64)
    assert err.value.code == dl.CHECKSUM_MISMATCH and err.value.terminal
    assert DISK_SHA in str(err.value) and "nothing was kept" in str(err.value)
    assert not _incoming(registry) and not list((registry.root / "blobs").iterdir())


@pytest.mark.parametrize(("status", "code", "terminal"), [
    (404, "ImageNotFound", True), (410, "ImageNotFound", True), (403, dl.UNAUTHORIZED, True),
    (401, dl.UNAUTHORIZED, True), (503, dl.UNREACHABLE, False), (500, dl.UNREACHABLE, False),
])
async def test_http_errors_say_which(server: FileServer, registry: ImageRegistry, status: int, code: str,
                                     terminal: bool) -> None:
    server.routes["/x.img"] = (status, b"nope", {})
    with pytest.raises(RuntimeFailure) as err:
        await _until_done(dl.ImageDownloader(registry), "vm-a.0", server.base + "/x.img", DISK_SHA)
    assert (err.value.code, err.value.terminal) == (code, terminal)
    assert f"HTTP {status}" in str(err.value)
    assert not _incoming(registry)


async def test_redirects_stay_on_the_server(server: FileServer, registry: ImageRegistry) -> None:
    server.routes["/moved.img"] = (302, b"", {"Location": "/disk.img"})
    server.routes["/away.img"] = (302, b"", {"Location": "http://169.254.169.254/latest/meta-data"})
    d = dl.ImageDownloader(registry)
    await _until_done(d, "vm-a.0", server.base + "/moved.img", DISK_SHA)
    assert server.requests == ["/moved.img", "/disk.img"]
    with pytest.raises(RuntimeFailure) as err:
        await _until_done(dl.ImageDownloader(ImageRegistry(registry.root.parent / "other")), "vm-b.0",
                          server.base + "/away.img", DISK_SHA)
    assert err.value.terminal and "redirects to another server (http://169.254.169.254)" in str(err.value)


async def test_too_large_unreachable_and_cut_short(server: FileServer, registry: ImageRegistry) -> None:
    with pytest.raises(RuntimeFailure) as big:
        await _until_done(dl.ImageDownloader(registry, max_bytes=1 << 20), "a", server.base + "/disk.img", DISK_SHA)
    assert big.value.code == dl.TOO_LARGE and big.value.terminal
    # Announced 3 MiB, sent 1 MiB: the connection's end is no image.
    server.routes["/short.img"] = (200, DISK[: 1 << 20], {"Content-Length": str(len(DISK))})
    with pytest.raises(RuntimeFailure) as short:
        await _until_done(dl.ImageDownloader(registry, read_timeout=5), "a", server.base + "/short.img", DISK_SHA)
    assert short.value.code == dl.UNREACHABLE and not short.value.terminal
    port = server.port
    server.close()  # nobody listens there any more
    with pytest.raises(RuntimeFailure) as gone:
        await _until_done(dl.ImageDownloader(registry), "a", f"http://127.0.0.1:{port}/disk.img", DISK_SHA)
    assert gone.value.code == dl.UNREACHABLE and not gone.value.terminal and "refused" in str(gone.value).lower()
    assert not _incoming(registry)


async def test_a_download_nobody_needs_is_stopped(server: FileServer, registry: ImageRegistry) -> None:
    server.gate.clear()
    d = dl.ImageDownloader(registry)
    with pytest.raises(StartPending) as p:
        await d.ensure("vm-a.0", server.base + "/disk.img", DISK_SHA)
    d.forget("vm-a.0")
    server.gate.set()
    assert p.value.done is not None
    await asyncio.wait_for(p.value.done, 20)
    assert d.cached(DISK_SHA) is None and not _incoming(registry)
    await d.close()
