"""A workload's own Prometheus metric as an autoscale figure (`metric: prometheus`): scrape the
endpoint it exposes, bounded in time and size, and sum the samples of one metric whose labels
include the policy's. `total_of` is pure (text in, figure out); `scrape` does the I/O and answers
None on any failure (the loop then keeps the last figure, which goes stale: the fallback)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

from persys.model.automation import PrometheusSource

log = logging.getLogger(__name__)
MAX_BYTES = 1 << 20  # an exposition larger than this is refused (not a metrics endpoint, or a runaway one)


def total_of(text: str, name: str, labels: Mapping[str, str]) -> float | None:
    """The sum of the samples named `name` whose labels include `labels`; None when none match
    or the text does not parse (a missing metric is no figure, never zero)."""
    found = False
    total = 0.0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    found = True
                    total += float(sample.value)
    except (ValueError, TypeError, IndexError) as err:
        log.warning("prometheus text did not parse: %s", err)
        return None
    return total if found else None


async def scrape(src: PrometheusSource) -> float | None:
    try:
        async with httpx.AsyncClient(timeout=float(src.timeout_seconds), follow_redirects=False) as client:
            async with client.stream("GET", src.url, headers={"accept": "text/plain"}) as r:
                if r.status_code != 200:
                    log.warning("scrape %s: HTTP %d", src.url, r.status_code)
                    return None
                body = bytearray()
                async for chunk in r.aiter_bytes():
                    body += chunk
                    if len(body) > MAX_BYTES:
                        log.warning("scrape %s: over %d bytes", src.url, MAX_BYTES)
                        return None
    except httpx.HTTPError as err:
        log.warning("scrape %s: %s", src.url, err)
        return None
    return total_of(body.decode(errors="replace"), src.name, src.labels)
