"""The bucket watch, run by the active replica: every `period_s` one pass of BucketApi.watch_pass
(a bucket deleted in RGW behind Persys' back becomes Lost, with an event; a binding made before
keys were confined to their bucket gets them confined). RGW unreachable: the pass is retried on
the next period, nothing changes meanwhile."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine

from persys.scheduler.api.buckets import BucketApi, BucketsUnavailable

log = logging.getLogger(__name__)
WATCH_PERIOD_S = 30.0


def bucket_watch(api: BucketApi, period_s: float = WATCH_PERIOD_S) -> Callable[[], Coroutine[None, None, None]]:
    async def run() -> None:
        while True:
            try:
                await api.watch_pass()
            except BucketsUnavailable as err:
                log.warning("bucket watch: %s; trying again in %.0f s", err, period_s)
            await asyncio.sleep(period_s)

    return run


def bucket_watches(api: BucketApi) -> list[Callable[[], Coroutine[None, None, None]]]:
    """The watch when buckets are configured (an rgw section), else none."""
    return [bucket_watch(api)] if api.rgw is not None else []
