"""Variables a compose workload may not set: those that configure Compose, Docker or the tools
they run, rather than fill a `${VAR}` in the document.

The agent hands `spec.compose.env` and the secret env to Compose's process environment, above
its own. `DOCKER_HOST=ssh://root@other-node` would make Compose drive another engine with the
agent's SSH agent; `COMPOSE_EXPERIMENTAL_GIT_REMOTE=1` with `GIT_SSH_COMMAND` would make it run a
command on the node to fetch an `include`; `PATH`, `HOME` or `LD_PRELOAD` change which programs
and configuration it uses. None of these is an interpolation variable, so all are refused.
"""

from __future__ import annotations

# Git reads dozens of GIT_* (GIT_SSH_COMMAND, GIT_CONFIG_KEY_0=core.fsmonitor, ...) and buildx
# runs git in a build context: the whole prefix, though `GIT_SHA` for an image tag is harmless
# (name it APP_GIT_SHA).
_PREFIXES = ("DOCKER_", "COMPOSE_", "BUILDKIT_", "BUILDX_", "GIT_", "SSH_", "LD_", "XDG_")
_NAMES = frozenset({"PATH", "HOME", "TMPDIR", "TMP", "TEMP", "SHELL", "USER", "HTTP_PROXY", "HTTPS_PROXY",
                    "NO_PROXY", "ALL_PROXY", "FTP_PROXY", "KUBECONFIG", "SSL_CERT_FILE", "SSL_CERT_DIR",
                    "GODEBUG", "GOTRACEBACK", "GOMAXPROCS", "GOGC", "GOMEMLIMIT"})
_ALLOWED = frozenset({"COMPOSE_PROFILES"})  # chooses which of the document's services run: judged anyway


def reserved(name: str) -> bool:
    """Whether `name` configures Compose or the programs it runs (case-insensitive, as proxies are)."""
    upper = name.upper()
    return upper not in _ALLOWED and (upper in _NAMES or upper.startswith(_PREFIXES))


MESSAGE = "configures Compose or the programs it runs (the engine, git, ssh), not a ${VARIABLE} of the document"
