"""Images from registries: the pull policy, pulls in the background, and what a failed pull means.

A start that needs a pull does not wait for it: `ImagePuller.ensure` starts the pull as its own
task (bounded by a timeout) and raises StartPending, which the agent reports as the instance's
reason (ImagePulling, with bytes and seconds so far) while its loop goes on: reports, heartbeats
and other instances' starts are never held up by a slow registry. The next start call finds the
pull ended: once ImagePulled (what came down, how long it took) has been reported, the start goes
ahead; a failed pull becomes a RuntimeFailure classified by `classify` (terminal or retried with
backoff). Keyed by instance, so each start with pullPolicy Always pulls again.

Credentials come from the node's file (registry_auth), read when the pull begins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiodocker.exceptions import DockerError

from persys.agent.runtimes.base import RuntimeFailure, StartPending
from persys.agent.runtimes.docker_client import LazyDocker
from persys.agent.runtimes.registry_auth import RegistryAuth, qualified, registry_of, workload_credentials
from persys.model.status import IMAGE_PULLED, IMAGE_PULLING
from persys.model.workload import PullPolicy

log = logging.getLogger(__name__)

PULL_TIMEOUT = 900.0  # seconds one pull may take before it is abandoned (retried with backoff)
MESSAGE_LIMIT = 300

# Failure codes of a pull (the instance's reason); terminal ones wait for a new spec, a restart,
# or (any pull failure) a change of the node's credentials file.
IMAGE_NOT_FOUND = "ImageNotFound"
UNAUTHORIZED = "RegistryUnauthorized"
UNREACHABLE = "RegistryUnreachable"
RATE_LIMITED = "RegistryRateLimited"
DISK_FULL = "DiskFull"
PULL_TIMED_OUT = "ImagePullTimeout"
PULL_FAILED = "ImagePullFailed"
INVALID_REFERENCE = "InvalidSpec"

# (code, terminal, words in the engine's message), first match wins; lower case.
_RULES: tuple[tuple[str, bool, tuple[str, ...]], ...] = (
    (DISK_FULL, False, ("no space left on device", "disk quota exceeded")),
    (INVALID_REFERENCE, True, ("invalid reference format",)),
    (IMAGE_NOT_FOUND, True, ("manifest unknown", "not found", "repository does not exist", "name unknown")),
    (RATE_LIMITED, False, ("toomanyrequests", "too many requests", "rate limit")),
    (UNAUTHORIZED, True, ("unauthorized", "authentication required", "no basic auth credentials",
                          "incorrect username or password", "denied")),
    (UNREACHABLE, False, ("connection refused", "no such host", "i/o timeout", "connection reset",
                          "network is unreachable", "tls handshake", "x509", "dial tcp", "server misbehaving",
                          "timeout", "eof", "service unavailable", "bad gateway")),
)


def classify(status: int | None, message: str) -> tuple[str, bool]:
    """(code, terminal) of a pull the engine refused: `status` is its HTTP status (None: an
    error inside the progress stream), `message` its text. Pure."""
    low = message.lower()
    for code, terminal, words in _RULES:
        if any(w in low for w in words):
            return code, terminal
    if status == 404:
        return IMAGE_NOT_FOUND, True
    return PULL_FAILED, False


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def size_text(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


@dataclass
class PullProgress:
    """Bytes downloaded, from the engine's progress stream (per layer: current and total)."""

    layers: dict[str, tuple[int, int]] = field(default_factory=dict)
    up_to_date: bool = False

    def feed(self, item: Mapping[str, Any]) -> None:
        status = str(item.get("status", ""))
        layer = str(item.get("id", ""))
        detail = item.get("progressDetail") or {}
        if status == "Downloading" and layer:
            self.layers[layer] = (int(detail.get("current", 0) or 0), int(detail.get("total", 0) or 0))
        elif status in ("Download complete", "Pull complete") and layer in self.layers:
            current, total = self.layers[layer]
            self.layers[layer] = (max(current, total), total)
        elif status.startswith("Status: Image is up to date"):
            self.up_to_date = True

    @property
    def downloaded(self) -> int:
        return sum(c for c, _ in self.layers.values())

    @property
    def total(self) -> int:
        return sum(t for _, t in self.layers.values())


@dataclass
class PullJob:
    image: str
    started: float  # monotonic
    # The workload's own credentials for this image's registry (spec.secrets.registryAuth); None:
    # the node's file. Never in a repr.
    credentials: dict[str, str] | None = field(default=None, repr=False)
    progress: PullProgress = field(default_factory=PullProgress)
    task: asyncio.Task[None] | None = None
    error: RuntimeFailure | None = None
    finished: float | None = None
    announced: bool = False  # ImagePulled was raised once: the next start goes ahead

    def pulling_message(self, now: float) -> str:
        p = self.progress
        so_far = f"{size_text(p.downloaded)} of {size_text(p.total)}" if p.total else "starting"
        return f"pulling {self.image}: {so_far}, {now - self.started:.0f} s"

    def pulled_message(self) -> str:
        took = (self.finished or self.started) - self.started
        what = "up to date" if self.progress.up_to_date else size_text(self.progress.downloaded)
        return f"pulled {self.image}: {what} ({self.progress.downloaded} bytes) in {took:.1f} s"


class ImagePuller:
    """Pulls for one runtime's engine: per instance, one job per image it needs."""

    def __init__(self, docker: LazyDocker, auth: RegistryAuth | None = None, timeout: float = PULL_TIMEOUT) -> None:
        self._docker = docker
        self._auth = auth
        self._timeout = timeout
        self._jobs: dict[str, dict[str, PullJob]] = {}  # instance -> image -> its pull
        self._revisions: dict[str, str] = {}  # instance -> the revision its pulls are for

    async def close(self) -> None:
        owners = list(self._jobs)
        tasks = [j.task for o in owners for j in self._jobs[o].values() if j.task is not None]
        for owner in owners:
            self.forget(owner)
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    def forget(self, owner: str, keep: Collection[str] = ()) -> None:
        """Abandon the instance's pulls (but those of `keep`): the engine stops a pull whose
        client went away."""
        jobs = self._jobs.get(owner, {})
        for image in [i for i in jobs if i not in keep]:
            task = jobs.pop(image).task
            if task is not None:
                task.cancel()
        if not jobs:
            self._jobs.pop(owner, None)
            self._revisions.pop(owner, None)

    async def present(self, image: str) -> bool:
        try:
            await self._docker().images.inspect(image)
        except DockerError as exc:
            if exc.status == 404:
                return False
            raise RuntimeFailure(f"inspect image {image}: {exc.message}") from exc
        except OSError as exc:
            raise RuntimeFailure(f"docker engine not reachable: {exc}") from exc
        return True

    def still_pulling(self, owner: str, revision: str) -> None:
        """Raise StartPending while pulls for this revision of `owner` run: a caller whose
        preparation costs (a compose app's git clone and `config`) skips it until they end."""
        running = [j for j in self._jobs.get(owner, {}).values() if j.finished is None]
        if running and self._revisions.get(owner) == revision:
            now = time.monotonic()
            raise StartPending("; ".join(j.pulling_message(now) for j in running), code=IMAGE_PULLING,
                               done=running[0].task)

    async def ensure(self, owner: str, images: Sequence[str], policy: PullPolicy, revision: str = "",
                     credentials: Mapping[str, bytes] | None = None) -> None:
        """Return once every image may be used for `owner`'s start (at `revision`). Raises
        StartPending while pulls run (ImagePulling) and once when they have all ended
        (ImagePulled), RuntimeFailure when an image cannot be had (the first such).
        `credentials`: the workload's registryAuth (registry -> JSON), preferred to the node's file."""
        wanted = list(dict.fromkeys(images))
        self.forget(owner, keep=wanted)  # the spec moved on from the others
        self._revisions[owner] = revision
        jobs = self._jobs.setdefault(owner, {})
        for image in wanted:
            if image not in jobs:
                own = workload_credentials(image, credentials) if credentials else None
                await self._start_if_needed(owner, jobs, image, policy, own)
        failed = [j for j in jobs.values() if j.finished is not None and j.error is not None]
        if failed:
            for j in failed:
                del jobs[j.image]  # a retry after the backoff pulls again
            err = failed[0].error
            assert err is not None
            raise err
        now = time.monotonic()
        running = [j for j in jobs.values() if j.finished is None]
        if running:
            raise StartPending("; ".join(j.pulling_message(now) for j in running), code=IMAGE_PULLING,
                               done=running[0].task)
        fresh = [j for j in jobs.values() if not j.announced]
        if fresh:
            for j in fresh:
                j.announced = True
            raise StartPending("; ".join(j.pulled_message() for j in fresh), code=IMAGE_PULLED)
        self._jobs.pop(owner, None)  # used: a later start pulls again where the policy says so
        self._revisions.pop(owner, None)

    async def _start_if_needed(self, owner: str, jobs: dict[str, PullJob], image: str, policy: PullPolicy,
                               credentials: dict[str, str] | None) -> None:
        if policy != PullPolicy.ALWAYS:
            if await self.present(image):
                return
            if policy == PullPolicy.NEVER:
                self.forget(owner)
                raise RuntimeFailure(f"image {image!r} is not present on this node and pullPolicy is Never "
                                     "(persysctl image load, or another pullPolicy)", code=IMAGE_NOT_FOUND,
                                     terminal=True)
        job = PullJob(image, time.monotonic(), credentials)
        job.task = asyncio.create_task(self._pull(job), name=f"pull-{owner}")
        jobs[image] = job
        log.info("pulling %s for %s (pullPolicy %s)", image, owner, policy)

    async def _pull(self, job: PullJob) -> None:
        own = job.credentials is not None
        credentials = self._auth.fingerprint() if self._auth is not None and not own else None
        try:
            if own:
                auth: dict[str, str] | None = job.credentials
            else:
                auth = await asyncio.to_thread(self._auth.for_image, job.image) if self._auth is not None else None
            reference = qualified(job.image) if auth is not None else job.image
            async with asyncio.timeout(self._timeout):
                async for item in self._docker().images.pull(reference, auth=auth, stream=True):
                    job.progress.feed(item)
        except RuntimeFailure as err:  # the credentials file
            job.error = err
        except TimeoutError:
            job.error = RuntimeFailure(f"pulling {job.image} from {registry_of(job.image)} took over "
                                       f"{self._timeout:g} s ({size_text(job.progress.downloaded)} came down)",
                                       code=PULL_TIMED_OUT)
        except DockerError as exc:
            job.error = self._refused(job.image, exc, credentials, own)
        except (OSError, aiohttp.ClientError) as exc:
            job.error = RuntimeFailure(f"pull {job.image}: docker engine not reachable: {one_line(str(exc))}")
        finally:
            job.finished = time.monotonic()
        if job.error is not None:
            log.warning("pulling %s failed: %s", job.image, job.error)
        else:
            log.info("%s", job.pulled_message())

    def _refused(self, image: str, exc: DockerError, credentials: str | None, own: bool = False) -> RuntimeFailure:
        stream_error = type(exc).__name__ == "DockerStreamError"  # inside the progress stream: no HTTP status
        code, terminal = classify(None if stream_error else exc.status, str(exc.message))
        message = f"pull {image}: {one_line(str(exc.message))}"
        if code == UNAUTHORIZED and own:
            message += (f" (the workload's spec.secrets.registryAuth for {registry_of(image)}; a new version of "
                        "the secret rolls the workload and pulls again)")
        elif code == UNAUTHORIZED:
            message += (" (tried again once the node's --registry-auth file changes)" if self._auth is not None
                        else " (this node has no registry credentials: persys agent --registry-auth FILE, "
                             "or spec.secrets.registryAuth)")
        return RuntimeFailure(message, code=code, terminal=terminal, credentials=credentials)
