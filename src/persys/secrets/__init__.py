"""Secrets: one async store interface (`SecretStore`) with two backends, the built-in AES-GCM
envelope inside the state store (`builtin`) and Vault/OpenBao KV v2 (`openbao`), plus the pure
rules workloads' references follow (`refs`). Values are bytes; listings never carry them."""

from persys.secrets.base import (
    SecretExists,
    SecretInfo,
    SecretInvalid,
    SecretNotFound,
    SecretStore,
    SecretStoreError,
    SecretUnavailable,
)

__all__ = [
    "SecretExists",
    "SecretInfo",
    "SecretInvalid",
    "SecretNotFound",
    "SecretStore",
    "SecretStoreError",
    "SecretUnavailable",
]
