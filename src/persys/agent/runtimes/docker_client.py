"""One Docker engine client per runtime, made on first use (docker and compose share this)."""

from __future__ import annotations

import aiodocker


class LazyDocker:
    """Call it for the client. aiodocker's aiohttp session must be created inside a running event
    loop, so the client is made on the first call rather than when the runtime is built."""

    def __init__(self, url: str | None) -> None:
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
