"""Pure: S3 bucket naming rules (the ones AWS documents for new buckets, which RGW enforces with
`rgw_relaxed_s3_bucket_names` off), checked before anything is asked of RGW: by `kind: Bucket` (model)
and by persys.storage.rgw."""

from __future__ import annotations

import ipaddress
import re

_CHARS = re.compile(r"^[a-z0-9][a-z0-9.-]*[a-z0-9]$")
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3")


def bucket_name_problem(name: object) -> str:
    """Why `name` is not a valid bucket name ("" when it is)."""
    if not isinstance(name, str):
        return "bucket: the name must be a string"
    if not 3 <= len(name) <= 63:
        return f"bucket: {name!r} must be 3 to 63 characters long"
    if not _CHARS.fullmatch(name):
        return (f"bucket: {name!r} may hold lowercase letters, digits, '.' and '-' only, and must begin "
                "and end with a letter or digit")
    if ".." in name:
        return f"bucket: {name!r} must not hold two periods in a row"
    if _is_ipv4(name):
        return f"bucket: {name!r} must not look like an IP address"
    prefix = next((p for p in _RESERVED_PREFIXES if name.startswith(p)), None)
    if prefix is not None:
        return f"bucket: {name!r} must not begin with the reserved prefix {prefix!r}"
    suffix = next((x for x in _RESERVED_SUFFIXES if name.endswith(x)), None)
    if suffix is not None:
        return f"bucket: {name!r} must not end with the reserved suffix {suffix!r}"
    return ""


def _is_ipv4(name: str) -> bool:
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        return False
    return True
