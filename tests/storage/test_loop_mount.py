"""Loop mounts through the kernel's calls (persys.storage.loop_mount) on real images and loop
devices: what is mounted and how, the device freed at the unmount, a device claimed by another
process meanwhile, and the `mount` binary where the calls cannot run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from persys.storage import loop_mount
from persys.storage import node_mounts as nm
from persys.storage.base import StorageError
from persys.storage.ext4_images import create_formatted


def _image(pool: Path, name: str = "v") -> tuple[Path, Path]:
    image, mnt = pool / f"{name}.img", pool / name
    create_formatted(image, 8, 60)
    mnt.mkdir()
    return image, mnt


def _bound_to(image: Path) -> list[nm.LoopDevice]:
    return nm.loops_backed_by({str(image)}, 30)


def _no_binary(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    ran: list[list[str]] = []
    monkeypatch.setattr(loop_mount, "run", lambda argv, **_: ran.append(list(argv)))
    return ran


@pytest.mark.parametrize("read_only", [False, True])
def test_mounted_through_the_kernels_calls_and_freed_at_the_unmount(loop_pool: Path, read_only: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    image, mnt = _image(loop_pool)
    ran = _no_binary(monkeypatch)
    loop_mount.mount_image(image, mnt, read_only=read_only, timeout=30)
    assert ran == []  # the fast path did it
    m = nm.mount_at(mnt)
    assert m is not None and m.fstype == "ext4" and m.read_only == read_only
    (loop,) = _bound_to(image)
    assert m.source == loop.name and loop.read_only == read_only
    line = next(x for x in Path("/proc/self/mountinfo").read_text().splitlines() if f" {mnt} " in x)
    assert {"nosuid", "nodev"} <= set(line.split()[5].split(","))  # the volume brings no setuid binary or device
    if read_only:
        with pytest.raises(OSError):
            (mnt / "x").write_text("x")
    else:
        (mnt / "x").write_text("x")
    nm.unmount(mnt, 30)
    assert _bound_to(image) == []  # autoclear: the unmount freed the device


def test_a_device_taken_between_asking_and_binding_is_asked_for_again(loop_pool: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    image, mnt = _image(loop_pool)
    other, _ = _image(loop_pool, "other")
    taken = subprocess.run(["losetup", "--find", "--show", str(other)], capture_output=True, text=True,
                           check=True).stdout.strip()  # a device bound by someone else
    asked: list[str] = []
    real = loop_mount._free_device

    def racing() -> str:
        asked.append(taken if not asked else real())
        return asked[-1]

    monkeypatch.setattr(loop_mount, "_free_device", racing)
    ran = _no_binary(monkeypatch)
    try:
        loop_mount.mount_image(image, mnt, read_only=False, timeout=30)
        (loop,) = _bound_to(image)
        assert ran == [] and len(asked) == 2 and loop.name == asked[1] != taken
        assert [d.back_file for d in nm.loop_devices(30) if d.name == taken] == [str(other)]  # left alone
        nm.unmount(mnt, 30)
    finally:
        nm.free_loop(taken, 30)


def test_where_the_calls_cannot_run_the_mount_binary_does_it(loop_pool: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    image, mnt = _image(loop_pool)
    monkeypatch.setattr(loop_mount, "LOOP_CONTROL", str(loop_pool / "no-loop-control"))
    loop_mount.mount_image(image, mnt, read_only=True, timeout=30)
    m = nm.mount_at(mnt)
    assert m is not None and m.read_only and len(_bound_to(image)) == 1
    nm.unmount(mnt, 30)
    assert _bound_to(image) == []


def test_an_image_that_is_no_filesystem_fails_with_the_binarys_message_and_binds_nothing(loop_pool: Path) -> None:
    image, mnt = loop_pool / "junk.img", loop_pool / "junk"
    image.write_bytes(b"\x01" * 1024 * 1024)
    mnt.mkdir()
    with pytest.raises(StorageError, match="mount"):
        loop_mount.mount_image(image, mnt, read_only=False, timeout=30)
    assert nm.mount_at(mnt) is None and _bound_to(image) == []
