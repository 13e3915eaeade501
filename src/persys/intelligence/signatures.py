"""Failure signatures: which cause class a failure's words belong to.

Built for classes, not for cases: the agent already names most failures with a stable code (the
instance's `reason`: ImageNotFound, RegistryUnauthorized, SecretUnavailable, DiskFull, ...), and
engines and kernels use a small vocabulary for the rest ("no space left on device", "OOMKilled",
"executable file not found"). A signature matches a code exactly or a phrase anywhere in the
text (lower case); a text may match several, each becomes a finding. The first table row of a
class is its title and remedy. New causes of a known class need no code.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    cause: str
    score: float
    title: str
    remedy: str
    codes: frozenset[str] = frozenset()
    words: tuple[str, ...] = ()

    def matches(self, reason: str, text: str) -> bool:
        low = text.lower()
        # A retried failure keeps its code in the message: "attempt 3 failed (RegistryUnreachable: ...)".
        return (reason in self.codes or any(f"({c}:" in text or text.startswith(f"{c}:") for c in self.codes)
                or any(w in low for w in self.words))


def _s(cause: str, score: float, title: str, remedy: str, codes: tuple[str, ...] = (),
       words: tuple[str, ...] = ()) -> Signature:
    return Signature(cause, score, title, remedy, frozenset(codes), words)


SIGNATURES: tuple[Signature, ...] = (
    _s("registry-auth", 93, "the registry refuses the node's credentials",
       "fix the registry credentials the node uses (docs/images.md), then `persysctl restart`",
       ("RegistryUnauthorized", "RegistryAuthInvalid", "ImageSourceUnauthorized"),
       ("unauthorized", "authentication required", "no basic auth credentials", "incorrect username or password")),
    _s("image-missing", 92, "the image does not exist where it is looked for",
       "correct the image reference (name, tag, registry) or push the image",
       ("ImageNotFound", "InvalidImage"),
       ("manifest unknown", "repository does not exist", "name unknown", "no such image", "invalid reference format")),
    _s("registry-unreachable", 85, "the registry cannot be reached from the node",
       "check the registry address, DNS and the node's network; pulls are retried",
       ("RegistryUnreachable", "ImageSourceUnreachable", "ImagePullTimeout", "RegistryRateLimited"), ()),
    _s("disk-full", 94, "the node's disk is full",
       "free space on the node (images, volumes, logs) or move the workload",
       ("DiskFull",), ("no space left on device", "disk quota exceeded", "enospc")),
    _s("oom-kill", 91, "the kernel killed it for exceeding its memory limit",
       "raise resources.memoryMb (see `persysctl rightsize`) or fix the leak",
       ("OOMKilled", "OOMKill"), ("oomkilled", "oom-kill", "out of memory", "oom killer")),
    _s("missing-secret", 92, "a secret it references cannot be delivered",
       "create the secret (`persysctl apply -f secret.yaml`) or fix the reference",
       ("SecretUnavailable",), ("secret not found",)),
    _s("bad-command", 90, "its command cannot be run",
       "fix spec.process.command / the container's command (path, permissions, architecture)",
       # 127 and 126 are the shells' "command not found" and "not executable" (POSIX).
       (), ("not found or not executable", "executable file not found", "command not found", "exec format error",
            "no such file or directory", "exited with code 127", "exited with code 126")),
    _s("storage-unavailable", 89, "a volume it needs cannot be provided on its node",
       "install/configure the storage driver on the node or choose a storage class the nodes offer",
       ("VolumeUnavailable", "VolumeBusy"), ()),
    _s("runtime-unavailable", 88, "the runtime it needs does not work on its node",
       "repair the runtime on the node (`persysctl describe node` lists why it is unavailable)",
       ("RuntimeUnavailable", "HypervisorUnavailable", "VMStartFailed"), ("daemon not reachable",)),
    _s("port-conflict", 87, "a port it binds is already taken on its node",
       "choose another host port or move one of the workloads",
       ("PortConflict",), ("address already in use", "port is already allocated")),
    _s("network-unavailable", 86, "its network cannot be set up",
       "create the network or fix its name", ("NetworkUnavailable", "NetworkNotFound"), ()),
    _s("policy-violation", 86, "the node's policy refuses it",
       "change the spec to meet the policy (`persysctl get policy`)", ("PolicyViolation",), ()),
)

# A kill by SIGKILL (137 = 128 + 9) without the runtime saying OOM: most often the memory
# limit, which only the meter's memory series can corroborate (rules.oom_by_signal).
SIGKILL_WORDS = ("killed by signal 9", "exited with code 137", "signal: killed")


def classify(reason: str, text: str) -> list[Signature]:
    return [s for s in SIGNATURES if s.matches(reason, text)]
