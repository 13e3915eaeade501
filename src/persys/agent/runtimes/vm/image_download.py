"""VM disk images downloaded from an http(s) URL and kept on the node by their checksum.

A spec names `image: https://...` with `imageSha256`; the node downloads the bytes once into its
image registry (`ImageRegistry`, content-addressed), under the name `sha256-<hex>`, and every
later start of any workload naming the same checksum boots that blob without a request. The
bytes are hashed while they stream to disk and used only when they hash to the spec's value:
the server is trusted for nothing but availability. What a workload may name is the workload
policy's `allowedImageUrls`; a redirect is followed only within the URL's own origin, so a server
cannot send the node somewhere the policy did not name.

Like registry pulls (`image_pull`), a start never waits for a download: the first start begins it
in a thread and raises StartPending (ImagePulling, with bytes so far); the agent reports that,
goes on with its loop and asks again when the download ends; the next start raises ImagePulled
once (what came down, how long it took), then boots. One download per checksum, shared by every
instance that needs it. Failures say which: ImageNotFound (404/410), ImageSourceUnauthorized
(401/403), ImageChecksumMismatch and ImageTooLarge (terminal: a new spec or a restart is needed);
ImageSourceUnreachable, DiskFull and ImagePullTimeout are retried with the agent's backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import logging
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin, urlsplit

from persys.agent.runtimes.base import RuntimeFailure, StartPending
from persys.agent.runtimes.image_pull import DISK_FULL, IMAGE_NOT_FOUND, PULL_TIMED_OUT, one_line, size_text
from persys.agent.runtimes.vm.images import ImageError, ImageRecord, ImageRegistry
from persys.model.status import IMAGE_PULLED, IMAGE_PULLING

log = logging.getLogger(__name__)

UNAUTHORIZED = "ImageSourceUnauthorized"
UNREACHABLE = "ImageSourceUnreachable"
CHECKSUM_MISMATCH = "ImageChecksumMismatch"
TOO_LARGE = "ImageTooLarge"
DOWNLOAD_TIMEOUT = 3600.0  # seconds a whole download may take
READ_TIMEOUT = 60.0  # seconds without a byte before the server counts as gone
MAX_BYTES = 64 * 1024**3  # a bigger disk image is refused before (Content-Length) or while it streams
MAX_REDIRECTS = 5
_CHUNK = 1 << 20


def record_name(sha256: str) -> str:
    """The registry name of a downloaded image: its checksum (the URL may change, the bytes may not)."""
    return f"sha256-{sha256}"


class _Cancelled(Exception):
    pass


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects within the first URL's scheme, host and port only (a policy names origins)."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        target, origin = urlsplit(urljoin(req.full_url, newurl)), urlsplit(req.full_url)
        if (target.scheme, target.netloc) != (origin.scheme, origin.netloc):
            raise RuntimeFailure(f"{req.full_url} redirects to another server ({target.scheme}://{target.netloc}); "
                                 "name the final URL in the spec (and in allowedImageUrls)", code=UNREACHABLE,
                                 terminal=True)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def classify_http(status: int, url: str) -> RuntimeFailure:
    """What an HTTP error status of an image server means. Pure."""
    if status in (404, 410):
        return RuntimeFailure(f"{url}: the server has no such image (HTTP {status})", code=IMAGE_NOT_FOUND,
                              terminal=True)
    if status in (401, 403):
        return RuntimeFailure(f"{url}: the server refused the node (HTTP {status}); image URLs carry no "
                              "credentials, so serve it to the nodes without them", code=UNAUTHORIZED, terminal=True)
    return RuntimeFailure(f"{url}: HTTP {status} from the image server", code=UNREACHABLE)


@dataclass
class DownloadJob:
    url: str
    sha256: str
    started: float  # monotonic
    received: int = 0
    total: int = 0  # Content-Length, 0 when the server gave none
    task: asyncio.Task[None] | None = None
    error: RuntimeFailure | None = None
    record: ImageRecord | None = None
    finished: float | None = None
    cancel: threading.Event = field(default_factory=threading.Event)

    def pulling_message(self, now: float) -> str:
        so_far = f"{size_text(self.received)} of {size_text(self.total)}" if self.total else size_text(self.received)
        return f"downloading {self.url}: {so_far}, {now - self.started:.0f} s"

    def pulled_message(self) -> str:
        took = (self.finished or self.started) - self.started
        return (f"downloaded {self.url}: {size_text(self.received)} ({self.received} bytes, sha256 verified) "
                f"in {took:.1f} s")


class ImageDownloader:
    """The node's downloads of VM images, one per checksum."""

    def __init__(self, registry: ImageRegistry, *, timeout: float = DOWNLOAD_TIMEOUT,
                 read_timeout: float = READ_TIMEOUT, max_bytes: int = MAX_BYTES) -> None:
        self._registry = registry
        self._timeout = timeout
        self._read_timeout = read_timeout
        self._max_bytes = max_bytes
        self._jobs: dict[str, DownloadJob] = {}  # sha256 -> its download
        self._waiting: dict[str, DownloadJob] = {}  # instance -> the download it was told about

    def cached(self, sha256: str) -> ImageRecord | None:
        try:
            rec = self._registry.get(record_name(sha256))
        except ImageError:
            return None  # an unreadable record: download again, the blob is rewritten identically
        if rec is None or rec.sha256 != sha256 or not Path(rec.path).is_file():
            return None
        return rec

    async def ensure(self, owner: str, url: str, sha256: str) -> ImageRecord:
        """The registered image for `owner`'s start: at once when the node holds it; otherwise
        raises StartPending while it downloads and once when it has (ImagePulled), or the
        download's RuntimeFailure."""
        told = self._waiting.get(owner)
        if told is not None and told.sha256 != sha256:
            del self._waiting[owner]  # the spec moved on
            told = None
        job = self._jobs.get(sha256)
        if job is None:
            if told is not None and told.finished is not None:
                # Its download ended and another instance collected the outcome first.
                del self._waiting[owner]
                if told.error is not None:
                    raise told.error
                raise StartPending(told.pulled_message(), code=IMAGE_PULLED)
            rec = await asyncio.to_thread(self.cached, sha256)
            if rec is not None:
                return rec
            job = DownloadJob(url, sha256, time.monotonic())
            job.task = asyncio.create_task(self._run(job), name=f"download-{sha256[:12]}")
            self._jobs[sha256] = job
            log.info("downloading %s for %s", url, owner)
        if job.finished is None:
            self._waiting[owner] = job
            raise StartPending(job.pulling_message(time.monotonic()), code=IMAGE_PULLING, done=job.task)
        self._jobs.pop(sha256, None)  # ended: a failure is retried by a later start, a success is cached
        self._waiting.pop(owner, None)
        if job.error is not None:
            raise job.error
        assert job.record is not None
        if told is not None:
            raise StartPending(job.pulled_message(), code=IMAGE_PULLED)
        return job.record

    def forget(self, owner: str) -> None:
        """`owner` needs no download any more (removed, or its spec moved on). A download others
        wait for goes on; one nobody waits for is stopped."""
        job = self._waiting.pop(owner, None)
        if job is not None and job.finished is None and job not in self._waiting.values():
            job.cancel.set()

    async def close(self) -> None:
        jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
        for job in jobs:
            if job.task is not None:
                with contextlib.suppress(BaseException):
                    await job.task

    async def _run(self, job: DownloadJob) -> None:
        try:
            job.record = await asyncio.to_thread(self._download, job)
        except RuntimeFailure as err:
            job.error = err
        except _Cancelled:
            job.error = RuntimeFailure(f"downloading {job.url} was stopped (no instance needs it any more)",
                                       code=UNREACHABLE)
        finally:
            job.finished = time.monotonic()
        if job.error is not None:
            log.warning("downloading %s failed: %s", job.url, job.error)
        else:
            log.info("%s", job.pulled_message())

    def _download(self, job: DownloadJob) -> ImageRecord:
        deadline = time.monotonic() + self._timeout
        opener = urllib.request.build_opener(_SameOriginRedirects())
        request = urllib.request.Request(job.url, headers={"User-Agent": "persys-agent"})
        tmp = self._registry.incoming()
        try:
            try:
                with opener.open(request, timeout=self._read_timeout) as resp, open(tmp, "wb") as out:
                    length = resp.headers.get("Content-Length")
                    job.total = int(length) if length and length.isdigit() else 0
                    if job.total > self._max_bytes:
                        raise self._too_large(job)
                    digest = self._stream(job, resp, out, deadline)
            except urllib.error.HTTPError as exc:
                raise classify_http(exc.code, job.url) from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RuntimeFailure(f"{job.url}: {one_line(str(reason)) or type(exc).__name__}",
                                     code=UNREACHABLE) from None
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise RuntimeFailure(f"downloading {job.url}: the node's disk is full ({exc.strerror})",
                                         code=DISK_FULL) from None
                raise RuntimeFailure(f"{job.url}: {one_line(str(exc))}", code=UNREACHABLE) from None
            if digest != job.sha256:
                raise RuntimeFailure(f"{job.url} served {size_text(job.received)} whose SHA-256 is {digest}, not "
                                     f"the spec's imageSha256 {job.sha256}; nothing was kept",
                                     code=CHECKSUM_MISMATCH, terminal=True)
            try:
                return self._registry.adopt(tmp, digest, name=record_name(digest), kind="disk", source=job.url)
            except ImageError as exc:  # not a disk image QEMU can boot (or one with a backing file)
                raise RuntimeFailure(f"{job.url}: {exc}", code="InvalidImage", terminal=True) from None
        finally:
            tmp.unlink(missing_ok=True)

    def _stream(self, job: DownloadJob, resp: IO[bytes], out: IO[bytes], deadline: float) -> str:
        h = hashlib.sha256()
        while chunk := resp.read(_CHUNK):
            if job.cancel.is_set():
                raise _Cancelled
            if time.monotonic() > deadline:
                raise RuntimeFailure(f"downloading {job.url} took over {self._timeout:g} s "
                                     f"({size_text(job.received)} came down)", code=PULL_TIMED_OUT)
            job.received += len(chunk)
            if job.received > self._max_bytes:
                raise self._too_large(job)
            h.update(chunk)
            out.write(chunk)
        out.flush()
        os.fsync(out.fileno())
        if job.total and job.received != job.total:
            raise RuntimeFailure(f"{job.url}: the connection ended after {job.received} of {job.total} bytes",
                                 code=UNREACHABLE)
        return h.hexdigest()

    def _too_large(self, job: DownloadJob) -> RuntimeFailure:
        return RuntimeFailure(f"{job.url} is over the {size_text(self._max_bytes)} a downloaded VM image may "
                              "have", code=TOO_LARGE, terminal=True)
