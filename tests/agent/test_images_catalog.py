"""The VM half of `persysctl image ls|rm` on the agent: registry entries listed with their users,
removal refused while an instance uses the image, the file kept while a VM disk is based on it
(the overlay's qcow2 header is written here by hand: no qemu-img needed). The container engine's
half runs against Docker in tests/gateway/test_node_images.py."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from persys.agent.images_catalog import CatalogError, based_on, qcow2_backing_file, remove_image
from persys.agent.runtimes.vm.images import ImageRegistry


def _overlay(path: Path, backing: str) -> None:
    """A qcow2 header (version 3) naming `backing` as its backing file."""
    name = backing.encode()
    head = b"QFI\xfb" + struct.pack(">IQI", 3, 104, len(name)) + b"\0" * (104 - 20)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + name)


def _exists(path: Path) -> bool:
    return path.is_file()


@pytest.fixture
def registry(tmp_path: Path) -> ImageRegistry:
    reg = ImageRegistry(tmp_path / "runtimes")
    raw = tmp_path / "disk.img"
    raw.write_bytes(b"\0" * 65536)
    reg.register("debian-12", raw)
    reg.register("debian-12-copy", raw)  # the same bytes under a second name share the file
    kernel = tmp_path / "vmlinuz"
    kernel.write_bytes(b"kernel")
    reg.register("my-kernel", kernel, kind="kernel")
    return reg


def test_the_header_reader(tmp_path: Path) -> None:
    _overlay(tmp_path / "a.qcow2", "/var/lib/persys/images/blobs/abc")
    assert qcow2_backing_file(tmp_path / "a.qcow2") == "/var/lib/persys/images/blobs/abc"
    (tmp_path / "raw").write_bytes(b"\0" * 100)
    assert qcow2_backing_file(tmp_path / "raw") == "" and qcow2_backing_file(tmp_path / "missing") == ""


async def test_removal_is_refused_while_used_and_keeps_a_based_on_file(tmp_path: Path,
                                                                       registry: ImageRegistry) -> None:
    vm_dir = tmp_path / "runtimes" / "vm"
    rec = registry.get("debian-12")
    assert rec is not None
    blob = Path(rec.path)
    used = {("disk", "debian-12"): ["web.0"]}
    with pytest.raises(CatalogError) as busy:
        await remove_image("disk", "debian-12", registry, used, vm_dir)
    assert busy.value.code == "InUse" and "web.0" in str(busy.value)
    with pytest.raises(CatalogError) as wrong:
        await remove_image("kernel", "debian-12", registry, {}, vm_dir)
    assert wrong.value.code == "InvalidArgument" and "--kind disk" in str(wrong.value)
    with pytest.raises(CatalogError) as missing:
        await remove_image("disk", "nope", registry, {}, vm_dir)
    assert missing.value.code == "NotFound"

    # Another name holds the same file: the name goes, the file stays.
    assert await remove_image("disk", "debian-12", registry, {}, vm_dir) == "disk debian-12 removed"
    assert registry.get("debian-12") is None and _exists(blob)
    # The last name, but a VM's disk is based on the file: it stays for that disk.
    _overlay(vm_dir / "old-vm.0" / "disk.qcow2", str(blob))
    assert based_on(blob, vm_dir) == ["old-vm.0"]
    detail = await remove_image("disk", "debian-12-copy", registry, {}, vm_dir)
    assert "its file stays" in detail and "old-vm.0" in detail and _exists(blob)
    # Nothing based on it any more: the kernel's name and file both go.
    kernel = registry.get("my-kernel")
    assert kernel is not None
    assert await remove_image("kernel", "my-kernel", registry, {}, vm_dir) == "kernel my-kernel removed"
    assert not _exists(Path(kernel.path))


async def test_bad_arguments_name_the_field(tmp_path: Path, registry: ImageRegistry) -> None:
    for kind, name, field in (("rootfs", "x", "kind"), ("disk", "", "name"), ("docker", "x" * 600, "name")):
        with pytest.raises(CatalogError) as err:
            await remove_image(kind, name, registry, {}, tmp_path)
        assert err.value.code == "InvalidArgument" and str(err.value).startswith(field + ":")
