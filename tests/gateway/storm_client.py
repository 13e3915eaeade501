"""A storm of concurrent GETs against the gateway, run as its own process (so its TLS handshakes
and parsing do not steal the probing test's interpreter): `python -m tests.gateway.storm_client URL
CA CERT KEY PATH N`. Prints one JSON line: each answer's status and seconds from send to answer."""

from __future__ import annotations

import asyncio
import json
import ssl
import sys
import time

import httpx


async def storm(url: str, ctx: ssl.SSLContext, path: str, n: int) -> list[tuple[int, float]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, verify=ctx, limits=limits, timeout=60) as client:
        async def one() -> tuple[int, float]:
            t0 = time.monotonic()
            try:
                r = await client.get(path)
                await r.aread()
                return r.status_code, time.monotonic() - t0
            except httpx.HTTPError:
                return 0, time.monotonic() - t0
        return list(await asyncio.gather(*(one() for _ in range(n))))


def main() -> None:
    url, ca, cert, key, path, n = sys.argv[1:7]
    ctx = ssl.create_default_context(cafile=ca)
    ctx.load_cert_chain(cert, key)
    got = asyncio.run(storm(url, ctx, path, int(n)))
    print(json.dumps(got))


if __name__ == "__main__":
    main()
