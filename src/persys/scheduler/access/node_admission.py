"""Node distrust (Kubernetes' NodeRestriction is the anchor): what a node may say about itself.

Pure: the servicer turns a call into a `NodeClaim` (what the agent reported plus what its verified
certificate says) and refuses the call when `caller_refusal` or `registration_refusal` return a
`Refusal`, before anything is written. The bounds:

- only a `node:<id>` certificate acts for node `<id>` (a user's, a gateway's or a scheduler's
  does not; principals listed as node simulators, for benchmarks, may act for any node id);
- node ids: `persys.model.node_names` (DNS-name-like, at most 63 characters);
- capacity never negative, at most 4,096 CPUs, 64 TiB of memory, 64 PiB of disk (beyond any
  host built today, so only a lie fails); heartbeat usage likewise;
- labels: at most 64, keys DNS-subdomain-like with an optional `/name` (at most 253 characters),
  values at most 253 printable characters; keys under `persys.dev/` are the operators' (set
  with `persysctl label`), never the node's own;
- taints: at most 32, the same key and value rules, a known effect;
- agent version, runtime names, versions and features, storage drivers: short printable text;
- the address the gateway will dial: `host:port` whose host is among the names of the node's
  certificate (none for simulators, whose certificate does not name the node's host).

"Printable" refuses control and format characters (terminal escapes, NUL, bidi overrides).
"""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from persys.model.node_names import node_id_problem
from persys.security.identity import Identity, Kind

RESERVED_LABEL_PREFIX = "persys.dev/"
MAX_CPU_MILLICORES = 4096 * 1000
MAX_MEMORY_MB = 64 * 1024 * 1024  # 64 TiB
MAX_DISK_MB = 64 * 1024 * 1024 * 1024  # 64 PiB
MAX_LABELS = 64
MAX_TAINTS = 32
MAX_KEY = 253
MAX_VALUE = 253
MAX_SHORT_TEXT = 128  # versions, runtime names, features, drivers
MAX_LIST = 32  # runtimes, features per runtime, storage drivers
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_KEY = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


class Code(StrEnum):
    PERMISSION_DENIED = "PERMISSION_DENIED"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"


@dataclass(frozen=True, slots=True)
class Refusal:
    code: Code
    rule: str  # a stable name for the rule, printed in the message
    message: str

    def __str__(self) -> str:
        return f"{self.message} (rule {self.rule})"


@dataclass(frozen=True, slots=True)
class RuntimeClaim:
    name: str
    version: str = ""
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TaintClaim:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True, slots=True)
class NodeClaim:
    """A registration: the agent's report plus the names in its verified certificate."""

    node_id: str
    address: str = ""
    agent_version: str = ""
    cpu_millicores: int = 0
    memory_mb: int = 0
    disk_mb: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[TaintClaim, ...] = ()
    runtimes: tuple[RuntimeClaim, ...] = ()
    storage_drivers: tuple[str, ...] = ()
    cert_hosts: frozenset[str] = frozenset()
    simulated: bool = False  # a node simulator speaks: its certificate names no node host


def _deny(rule: str, message: str) -> Refusal:
    return Refusal(Code.PERMISSION_DENIED, rule, message)


def _invalid(rule: str, message: str) -> Refusal:
    return Refusal(Code.INVALID_ARGUMENT, rule, message)


def caller_refusal(caller: Identity, node_id: str, simulators: frozenset[str] = frozenset()) -> Refusal | None:
    """May `caller` act as node `node_id` at all (every node call: register, heartbeat, report, watch)?"""
    problem = node_id_problem(node_id)
    if problem:
        return _invalid("node-id", problem)
    if caller.principal in simulators:
        return None
    if caller.kind is not Kind.NODE:
        return _deny("node-identity", f"certificate {caller.principal} is not a node identity: only node:<id> "
                                      "certificates register, heartbeat and report as nodes")
    if caller.name != node_id:
        return _deny("own-node-only", f"certificate {caller.principal} may not act for node {node_id}")
    return None


def unprintable(text: str) -> bool:
    """Control or format characters (terminal escapes, NUL, bidi overrides)."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn") for c in text)


def _text_refusal(what: str, text: str, limit: int) -> Refusal | None:
    if len(text) > limit:
        return _invalid("bounded-text", f"{what} is {len(text)} characters long (at most {limit})")
    if unprintable(text):
        return _invalid("printable-text", f"{what} {text[:limit]!r} contains control characters")
    return None


def _key_refusal(what: str, key: str) -> Refusal | None:
    if len(key) > MAX_KEY or not _KEY.fullmatch(key):
        return _invalid("label-key", f"{what} {key[:MAX_KEY]!r} must be [prefix/]name of letters, digits, "
                                     f"'-', '_' and '.' (at most {MAX_KEY} characters)")
    return None


def _capacity_refusal(what: str, value: float, limit: int) -> Refusal | None:
    if not math.isfinite(value):
        return _invalid("capacity-range", f"{what} is not a number ({value})")
    if value < 0:
        return _invalid("capacity-range", f"{what} is negative ({value})")
    if value > limit:
        return _invalid("capacity-range", f"{what} is {value}, beyond any host (at most {limit})")
    return None


def _first(refusals: Iterable[Refusal | None]) -> Refusal | None:
    return next((r for r in refusals if r is not None), None)


def labels_refusal(labels: Mapping[str, str]) -> Refusal | None:
    if len(labels) > MAX_LABELS:
        return _invalid("label-count", f"{len(labels)} labels (at most {MAX_LABELS})")
    for key, value in labels.items():
        problem = _key_refusal("label key", key) or _text_refusal(f"label {key}", value, MAX_VALUE)
        if problem:
            return problem
        if key.startswith(RESERVED_LABEL_PREFIX):
            return _deny("reserved-label", f"label {key}: keys under {RESERVED_LABEL_PREFIX} are set by operators "
                                           "(persysctl label node), not by the node itself")
    return None


def taints_refusal(taints: tuple[TaintClaim, ...]) -> Refusal | None:
    if len(taints) > MAX_TAINTS:
        return _invalid("taint-count", f"{len(taints)} taints (at most {MAX_TAINTS})")
    for t in taints:
        problem = _key_refusal("taint key", t.key) or _text_refusal(f"taint {t.key} value", t.value, MAX_VALUE)
        if problem:
            return problem
        if t.effect not in TAINT_EFFECTS:
            return _invalid("taint-effect", f"taint {t.key}: effect {t.effect[:32]!r} is not one of "
                                            f"{', '.join(TAINT_EFFECTS)}")
    return None


def _runtimes_refusal(runtimes: tuple[RuntimeClaim, ...], drivers: tuple[str, ...]) -> Refusal | None:
    if len(runtimes) > MAX_LIST or len(drivers) > MAX_LIST:
        return _invalid("bounded-text", f"{len(runtimes)} runtimes, {len(drivers)} storage drivers "
                                        f"(at most {MAX_LIST} each)")
    for r in runtimes:
        if len(r.features) > MAX_LIST:
            return _invalid("bounded-text", f"runtime {r.name[:32]!r}: {len(r.features)} features (at most {MAX_LIST})")
        problem = _first([_text_refusal("runtime name", r.name, MAX_SHORT_TEXT),
                          _text_refusal(f"runtime {r.name} version", r.version, MAX_SHORT_TEXT),
                          *(_text_refusal(f"runtime {r.name} feature", f, MAX_SHORT_TEXT) for f in r.features)])
        if problem:
            return problem
    return _first(_text_refusal("storage driver", d, MAX_SHORT_TEXT) for d in drivers)


def _split_address(address: str) -> tuple[str, str]:
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host, port) if sep else ("", "")


def address_refusal(address: str, cert_hosts: frozenset[str], simulated: bool) -> Refusal | None:
    """The address the gateway dials for this node's logs and images must name the node's own host."""
    if not address:
        return None  # no agent service: the gateway answers that the node serves no logs
    problem = _text_refusal("address", address, 260)
    if problem:
        return problem
    host, port = _split_address(address)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return _invalid("address-form", f"address {address!r} must be host:port")
    if simulated:
        return None
    try:
        canonical = str(ipaddress.ip_address(host))
    except ValueError:
        canonical = host.lower().rstrip(".")
    if canonical not in cert_hosts:
        return _deny("address-in-certificate", f"address {address!r}: host {host!r} is not among the names of the "
                                               "node's certificate")
    return None


def registration_refusal(claim: NodeClaim) -> Refusal | None:
    """What is wrong with a registration (None: it may be written). The first problem found."""
    return _first([
        _capacity_refusal("capabilities.cpu_millicores", claim.cpu_millicores, MAX_CPU_MILLICORES),
        _capacity_refusal("capabilities.memory_mb", claim.memory_mb, MAX_MEMORY_MB),
        _capacity_refusal("capabilities.disk_mb", claim.disk_mb, MAX_DISK_MB),
        _text_refusal("agent_version", claim.agent_version, MAX_SHORT_TEXT),
        labels_refusal(claim.labels),
        taints_refusal(claim.taints),
        _runtimes_refusal(claim.runtimes, claim.storage_drivers),
        address_refusal(claim.address, claim.cert_hosts, claim.simulated),
    ])


MAX_IO_BYTES = 2**62  # a cumulative counter: far beyond any host's lifetime, within int64


def usage_refusal(cpu_percent: float, memory_used_mb: int, disk_used_mb: int, workloads: int,
                  io: tuple[int, int, int, int] = (0, 0, 0, 0)) -> Refusal | None:
    """A heartbeat's usage: never negative, never beyond what a host can have."""
    return _first([
        _capacity_refusal("usage.cpu_percent", cpu_percent, MAX_CPU_MILLICORES // 10),  # 100 % per CPU
        _capacity_refusal("usage.memory_used_mb", memory_used_mb, MAX_MEMORY_MB),
        _capacity_refusal("usage.disk_used_mb", disk_used_mb, MAX_DISK_MB),
        _capacity_refusal("usage.workloads", workloads, 1_000_000),
        *(_capacity_refusal(f"usage.{name}", value, MAX_IO_BYTES) for name, value in
          zip(("disk_read_bytes", "disk_write_bytes", "net_rx_bytes", "net_tx_bytes"), io, strict=True)),
    ])


MAX_UNAVAILABLE_RUNTIMES = 16
MAX_RUNTIME_REASON_CHARS = 500


def unavailable_runtimes(reported: Mapping[str, str]) -> dict[str, str]:
    """What a node says about its broken runtimes, bounded: at most 16, names of at most 32
    characters, each reason cut at 500 (a node cannot grow its document without limit)."""
    kept = sorted((k, v) for k, v in reported.items() if 0 < len(k) <= 32)[:MAX_UNAVAILABLE_RUNTIMES]
    return {k: v[:MAX_RUNTIME_REASON_CHARS] for k, v in kept}
