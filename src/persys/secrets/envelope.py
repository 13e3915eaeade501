"""The built-in store's envelope (pure): each version's values are encrypted with AES-256-GCM
under a fresh data key, and the data key is encrypted (wrapped) under the master key.

Both encryptions take the secret's name and version as associated data, so a record copied to
another name or rolled back to an older version's slot fails to open instead of decrypting.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from persys.secrets.base import SecretStoreError

FORMAT = "persys-secret/v1"
KEY_BYTES = 32
NONCE_BYTES = 12


class EnvelopeError(SecretStoreError):
    """A record that does not open under this master key (wrong key, tampered or moved)."""


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: Any) -> bytes:
    if not isinstance(s, str):
        raise EnvelopeError("malformed record")
    return base64.b64decode(s, validate=True)


def _aad(purpose: str, name: str, version: int) -> bytes:
    return f"{FORMAT}\0{purpose}\0{name}\0{version}".encode()


def seal(master: bytes, name: str, version: int, data: Mapping[str, bytes]) -> dict[str, Any]:
    """The encrypted part of a record: wrapped data key and ciphertext, each with its nonce."""
    data_key = AESGCM.generate_key(bit_length=256)
    plain = json.dumps({k: _b64(v) for k, v in sorted(data.items())}, separators=(",", ":")).encode()
    nonce, key_nonce = os.urandom(NONCE_BYTES), os.urandom(NONCE_BYTES)
    return {
        "format": FORMAT,
        "keyNonce": _b64(key_nonce),
        "wrappedKey": _b64(AESGCM(master).encrypt(key_nonce, data_key, _aad("key", name, version))),
        "nonce": _b64(nonce),
        "ciphertext": _b64(AESGCM(data_key).encrypt(nonce, plain, _aad("data", name, version))),
    }


def open_sealed(master: bytes, name: str, version: int, sealed: Mapping[str, Any]) -> dict[str, bytes]:
    """The values of a record sealed for exactly this name and version; EnvelopeError otherwise."""
    if sealed.get("format") != FORMAT:
        raise EnvelopeError(f"secret {name}: unknown record format")
    try:
        data_key = AESGCM(master).decrypt(_unb64(sealed.get("keyNonce")), _unb64(sealed.get("wrappedKey")),
                                          _aad("key", name, version))
        plain = AESGCM(data_key).decrypt(_unb64(sealed.get("nonce")), _unb64(sealed.get("ciphertext")),
                                         _aad("data", name, version))
        doc = json.loads(plain)
    except (InvalidTag, ValueError) as err:
        raise EnvelopeError(f"secret {name} version {version} does not open under this master key "
                            f"(wrong key file, or the record was altered or moved): {type(err).__name__}") from None
    return {k: base64.b64decode(v) for k, v in doc.items()}
