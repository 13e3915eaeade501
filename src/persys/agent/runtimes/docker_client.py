"""One Docker engine client per runtime, made on first use (docker and compose share this)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import aiodocker
from aiodocker.exceptions import DockerError

from persys.agent.runtimes.base import RuntimeFailure


class LazyDocker:
    """Call it for the client. aiodocker's aiohttp session must be created inside a running event
    loop, so the client is made on the first call rather than when the runtime is built."""

    def __init__(self, url: str | None) -> None:
        self.url = url
        self._url = url
        self._client: aiodocker.Docker | None = None

    def __call__(self) -> aiodocker.Docker:
        if self._client is None:
            self._client = aiodocker.Docker(url=self._url)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def engine_unreachable(exc: BaseException, url: str | None) -> str:
    """Why the engine could not be used, never empty (a timeout's text is ""), with the fix."""
    what = str(exc) or ("no answer within 5 s" if isinstance(exc, TimeoutError) else type(exc).__name__)
    where = url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    return (f"docker engine not reachable at {where}: {what} (start dockerd, e.g. scripts/start-dockerd.sh, "
            "and the agent picks it up at its next probe)")


async def inspect_containers(docker: aiodocker.Docker, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Full inspect data of every container matching the label filters (the list summary lacks
    exit codes and OOM; an inspect each is cheap on a local socket). A container removed between
    the list and its inspect is simply gone. Engine errors become RuntimeFailure."""
    try:
        summaries = await docker.containers.list(all=True, filters=json.dumps(filters))
        details = await asyncio.gather(*(c.show() for c in summaries), return_exceptions=True)
    except (DockerError, OSError) as exc:
        raise RuntimeFailure(f"list containers: {exc}") from exc
    return [d for d in details if isinstance(d, dict)]
