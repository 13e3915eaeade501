"""Many small compare-and-swap writes as few transactions.

A placement or a status change is a *unit*: a few compares and a few puts that must land
together or not at all. Committing each unit alone costs one store round trip, one etcd
revision and one fsync; packing units into one transaction costs that once. The catch is that
a transaction is all or nothing: if any unit's compare fails, every unit in it fails. Then each
unit is retried alone, so one lost race never costs the others their write.

`commit_units` does this for units a caller already holds together (a batch of placements);
`GroupCommit` collects units that concurrent callers submit (agents' status reports arriving
over many RPCs) and commits what has accumulated while the previous transactions were in
flight: under load the batches grow by themselves, at rest each unit goes out at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

from persys.observability.metrics import LoopHistogram
from persys.store.base import DEFAULT_MAX_TXN_BYTES, Compare, Delete, Put, TxnTooLarge, txn_bytes

TXN_MAX_OPS = 128  # etcd's default --max-txn-ops (per branch: compares and operations alike)
FENCE_HEADROOM = 2  # compares a fenced commit adds in front of ours
# Bytes a transaction may carry (etcd's --max-request-bytes), less room for the fence's compares.
TXN_MAX_BYTES = DEFAULT_MAX_TXN_BYTES - 1024

log = logging.getLogger(__name__)
Ops = Sequence[Put | Delete]
Commit = Callable[[Sequence[Compare], Ops], Awaitable[bool]]


@dataclass(slots=True)
class Unit:
    compares: Sequence[Compare]
    ops: Ops
    done: asyncio.Future[bool] | None = field(default=None)


def _transactions(units: Sequence[Unit], max_ops: int, max_bytes: int = TXN_MAX_BYTES) -> Iterator[list[Unit]]:
    limit = max_ops - FENCE_HEADROOM
    cur: list[Unit] = []
    n_cmp = n_ops = n_bytes = 0
    written: set[str] = set()
    for u in units:
        keys = {op.key for op in u.ops}
        size = txn_bytes(u.compares, u.ops)
        if cur and (n_cmp + len(u.compares) > limit or n_ops + len(u.ops) > limit or n_bytes + size > max_bytes
                    or not written.isdisjoint(keys)):
            yield cur
            cur, n_cmp, n_ops, n_bytes, written = [], 0, 0, 0, set()
        cur.append(u)  # a unit over the limit alone goes alone: the store refuses it, not its neighbours
        n_cmp += len(u.compares)
        n_ops += len(u.ops)
        n_bytes += size
        written |= keys
    if cur:
        yield cur


def pack(units: Sequence[Unit], max_ops: int = TXN_MAX_OPS, max_bytes: int = TXN_MAX_BYTES) -> list[list[Unit]]:
    """Split units, in order, into transactions within etcd's limits (operations per branch and
    bytes per request) and without a key written twice in one transaction (etcd refuses that)."""
    return list(_transactions(units, max_ops, max_bytes))


async def _commit_txn(commit: Commit, txn: list[Unit], sizes: LoopHistogram | None = None) -> list[bool]:
    if sizes is not None:
        sizes.observe(len(txn))
    if len(txn) == 1:
        try:
            return [await commit(txn[0].compares, txn[0].ops)]
        except TxnTooLarge as err:  # nothing was sent: this unit fails, the others go on
            log.warning("a write was refused: %s", err)
            return [False]
    if await commit([c for u in txn for c in u.compares], [o for u in txn for o in u.ops]):
        return [True] * len(txn)
    # Some guard failed; find out which by committing each unit alone.
    return list(await asyncio.gather(*(commit(u.compares, u.ops) for u in txn)))


async def commit_units(commit: Commit, units: Sequence[Unit], max_ops: int = TXN_MAX_OPS,
                       max_bytes: int = TXN_MAX_BYTES, sizes: LoopHistogram | None = None) -> list[bool]:
    """Commit every unit (concurrently, packed into as few transactions as fit). Returns
    whether each landed (a unit too large for one request did not); a store error propagates."""
    results = await asyncio.gather(*(_commit_txn(commit, txn, sizes) for txn in pack(units, max_ops, max_bytes)))
    return [ok for part in results for ok in part]


class GroupCommit:
    """Joins units submitted by concurrent callers into shared transactions."""

    def __init__(self, commit: Commit, max_in_flight: int = 4, max_ops: int = TXN_MAX_OPS,
                 max_bytes: int = TXN_MAX_BYTES, sizes: LoopHistogram | None = None) -> None:
        self._commit = commit
        self._sizes = sizes  # units per transaction, for metrics
        self._max_ops = max_ops
        self._max_bytes = max_bytes
        self._slots = asyncio.Semaphore(max_in_flight)
        self._pending: list[Unit] = []
        self._flusher: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def submit(self, units: Sequence[tuple[Sequence[Compare], Ops]]) -> list[bool]:
        """Commit these units, each on its own terms; returns whether each landed."""
        if not units:
            return []
        loop = asyncio.get_running_loop()
        mine = [Unit(c, o, loop.create_future()) for c, o in units]
        self._pending += mine
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        futures = [u.done for u in mine if u.done is not None]
        try:
            return list(await asyncio.gather(*futures))
        finally:
            for f in futures:  # mark sibling failures as seen: one error is raised, not logged n times
                if f.done() and not f.cancelled():
                    f.exception()

    async def _flush(self) -> None:
        while self._pending:
            await self._slots.acquire()
            await asyncio.sleep(0)  # callers woken in the same loop pass join this batch
            # Only the first transaction: the rest may still grow, and packing all of a long
            # backlog on every pass would cost O(backlog) per transaction.
            txn = next(_transactions(self._pending, self._max_ops, self._max_bytes))
            del self._pending[: len(txn)]
            task = asyncio.create_task(self._run(txn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, txn: list[Unit]) -> None:
        try:
            oks = await _commit_txn(self._commit, txn, self._sizes)
        except Exception as err:  # the store failed: every caller in this batch sees the error
            for u in txn:
                if u.done is not None and not u.done.done():
                    u.done.set_exception(err)
        else:
            for u, ok in zip(txn, oks, strict=True):
                if u.done is not None and not u.done.done():
                    u.done.set_result(ok)
        finally:
            self._slots.release()


def chunk_ops(ops: Sequence[Put | Delete], size: int) -> list[list[Put | Delete]]:
    """`ops` in order, at most `size` and TXN_MAX_BYTES to a chunk (an op larger than that goes
    alone, and the store refuses it)."""
    chunks: list[list[Put | Delete]] = []
    n_bytes = 0
    for op in ops:
        b = txn_bytes((), (op,))
        if not chunks or len(chunks[-1]) >= size or n_bytes + b > TXN_MAX_BYTES:
            chunks.append([])
            n_bytes = 0
        chunks[-1].append(op)
        n_bytes += b
    return chunks
