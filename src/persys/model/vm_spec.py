"""What a `vm` or `microvm` workload boots: a libvirt/QEMU machine from a registered image, a node
path or an http(s) URL with its checksum (with an optional cloud-init seed), or a microVM
straight from a kernel."""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from persys.model.base import Model
from persys.model.documents import DocumentError, load_yaml
from persys.model.limits import MAX_QUANTITY


class CloudInit(Model):
    """A cloud-init NoCloud seed (an ISO9660 volume `cidata` attached to the VM as a cdrom).

    meta-data always carries `instance-id` (workload id + revision, so a new revision runs the
    per-instance modules again) and `local-hostname`; keys given in `metaData` override them.
    """

    user_data: StrictStr = ""  # written verbatim: `#cloud-config`, a script, or MIME multipart
    meta_data: StrictStr = ""  # a YAML mapping
    network_config: StrictStr = ""  # a YAML mapping (network config v1 or v2)
    vendor_data: StrictStr = ""

    @field_validator("meta_data", "network_config")
    @classmethod
    def _yaml_mapping(cls, v: str) -> str:
        if v.strip():
            try:
                doc = load_yaml(v)  # no aliases, bounded nesting: the scheduler validates this too
            except DocumentError as exc:
                raise ValueError(f"not valid YAML: {exc}") from None
            if not isinstance(doc, dict):
                raise ValueError("must be a YAML mapping")
        return v


IMAGE_URL_MAX_CHARS = 2048


def is_image_url(ref: str) -> bool:
    return ref.startswith(("http://", "https://"))


def image_url_problem(ref: str) -> str:
    """Why `ref`, an http(s) image URL, cannot be fetched ("" if fine, or not a URL). Pure."""
    if not is_image_url(ref):
        return ""
    parts = urlsplit(ref)
    try:
        _ = parts.port
    except ValueError:
        return f"{ref[:200]!r} has an invalid port"
    if not parts.hostname:
        return f"{ref[:200]!r} names no host"
    if parts.username is not None or parts.password is not None:
        return "credentials in an image URL would be stored in the spec and shown; serve the image without them"
    if any(c.isspace() or ord(c) < 0x20 for c in ref):
        return "an image URL may not hold spaces or control characters"
    return ""


class VMSpec(Model):
    """A full virtual machine (libvirt/QEMU) booting a copy-on-write overlay of a base image.

    `image`, `kernel` and `initrd` name images registered on the node (`persys.agent.runtimes.vm.images`)
    or are absolute paths on the node. `image` may also be an http(s) URL with its `imageSha256`:
    the node downloads it once and keeps it by checksum (the workload policy's `allowedImageUrls`
    says which servers). `networks` entries: `user` (QEMU user-mode NAT, no host setup),
    `bridge:<host bridge>`, `network:<libvirt network>`, or a bare libvirt network name; none means
    no NIC at all.
    """

    image: Annotated[StrictStr, Field(min_length=1, max_length=IMAGE_URL_MAX_CHARS)]
    # The SHA-256 (hex) of the disk an http(s) `image` URL serves; required with a URL, which is
    # only ever used when its bytes hash to this. Unset stays out of the revision hash.
    image_sha256: Annotated[StrictStr, Field(pattern=r"^[0-9a-f]{64}$")] | None = None
    vcpus: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    memory_mb: Annotated[StrictInt, Field(ge=32, le=MAX_QUANTITY)] = 256
    kernel: StrictStr = ""  # direct kernel boot instead of the image's bootloader
    initrd: StrictStr = ""
    cmdline: StrictStr = ""
    networks: list[StrictStr] = Field(default_factory=list)
    cloud_init: CloudInit | None = None

    _NETWORK_RE: ClassVar[re.Pattern[str]] = re.compile(
        r"^(user|(bridge|network):[A-Za-z0-9_.:-]{1,64}|[A-Za-z0-9_.-]{1,64})$"
    )

    @field_validator("networks")
    @classmethod
    def _network_syntax(cls, v: list[str]) -> list[str]:
        bad = [n for n in v if not cls._NETWORK_RE.match(n)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not `user`, `bridge:<name>`, `network:<name>` or a network name")
        return v

    @model_validator(mode="after")
    def _kernel_for_initrd(self) -> VMSpec:
        if (self.initrd or self.cmdline) and not self.kernel:
            raise ValueError("initrd and cmdline need kernel (direct kernel boot)")
        return self

    @model_validator(mode="after")
    def _url_with_checksum(self) -> VMSpec:
        if image_url_problem(self.image):
            raise ValueError(f"image: {image_url_problem(self.image)}")
        if is_image_url(self.image) and not self.image_sha256:
            raise ValueError("an image URL needs imageSha256 (the SHA-256 of the disk it serves, 64 hex digits)")
        if self.image_sha256 and not is_image_url(self.image):
            raise ValueError("imageSha256 is for an http(s) image URL; a registered image or node path has its own")
        return self

    def image_url(self) -> str:
        """The http(s) URL the disk image comes from ("" for a registered name or node path)."""
        return self.image if is_image_url(self.image) else ""


class MicroVMSpec(Model):
    """A lightweight VM booted straight from a kernel (Firecracker, or QEMU's `microvm` machine)."""

    kernel: Annotated[StrictStr, Field(min_length=1)]  # uncompressed vmlinux (Firecracker) or bzImage
    rootfs: StrictStr = ""  # a raw disk image used as the root drive (copied on write, never modified)
    initrd: StrictStr = ""
    cmdline: StrictStr = "console=ttyS0 reboot=k panic=1"
    vcpus: Annotated[StrictInt, Field(ge=1, le=32)] = 1
    memory_mb: Annotated[StrictInt, Field(ge=32, le=MAX_QUANTITY)] = 128
    hypervisor: Literal["auto", "firecracker", "qemu"] = "auto"  # auto: Firecracker if installed, else QEMU
    # Existing host tap devices, one virtio-net interface each (eth0, eth1, ... in the guest).
    tap_devices: list[Annotated[StrictStr, Field(pattern=r"^[A-Za-z0-9_.-]{1,15}$")]] = Field(default_factory=list)
