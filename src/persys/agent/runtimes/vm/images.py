"""The agent's registry of VM base images, kernels and initrds (`<state_dir>/images/`).

A VM never boots its base image: it boots a qcow2 overlay whose backing file is the registered
blob. Blobs are therefore content-addressed (`blobs/<sha256>`) and never rewritten: registering a
name again with new content points the name at a new blob, while overlays of running VMs keep
their old, unchanged backing file. The format is detected once at registration and always passed
explicitly to QEMU (`-F`), so a raw guest disk can never be re-probed as qcow2 with a backing file.

Register from the command line on the node:

    python -m persys.agent.runtimes.vm.images --state-dir /var/lib/persys/agent register debian-12 disk.qcow2
    python -m persys.agent.runtimes.vm.images --state-dir ... register --kind kernel my-kernel vmlinuz
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal

ImageKind = Literal["disk", "kernel", "initrd"]
KINDS: tuple[ImageKind, ...] = ("disk", "kernel", "initrd")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.xz", ".txz", ".tar.bz2", ".tbz2")
_CHUNK = 1 << 20


class ImageError(Exception):
    """A name that is not registered, a source that cannot be registered, or a broken blob."""


@dataclass(frozen=True)
class ImageRecord:
    name: str
    kind: ImageKind
    format: str  # qemu-img format of disks ("qcow2", "raw", ...); "raw" for kernels and initrds
    sha256: str  # "" for an unregistered absolute path (hashing a large disk on every start is too slow)
    size: int  # bytes on disk
    virtual_size: int  # guest-visible size of a disk; equals size otherwise
    path: str  # the blob (or the absolute path given in the spec)
    source: str = ""
    registered_at: float = 0.0


def _qemu_img_info(path: Path) -> dict[str, object] | None:
    exe = shutil.which("qemu-img")
    if exe is None:
        return None
    proc = subprocess.run(
        [exe, "info", "--output=json", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise ImageError(f"qemu-img info {path}: {proc.stderr.strip()}")
    info: dict[str, object] = json.loads(proc.stdout)
    return info


def probe_disk(path: Path) -> tuple[str, int]:
    """(format, virtual size) of a disk image; refuses images that depend on a backing file."""
    info = _qemu_img_info(path)
    if info is None:
        # Without qemu-img (which overlays need anyway) only tell qcow2 from raw by its magic.
        with open(path, "rb") as f:
            head = f.read(32)
        if head[:4] == b"QFI\xfb":
            if int.from_bytes(head[8:16], "big"):
                raise ImageError(f"{path} is a qcow2 overlay with a backing file, not a standalone base image")
            return "qcow2", int.from_bytes(head[24:32], "big")
        return "raw", path.stat().st_size
    if info.get("backing-filename"):
        # A base that itself has a backing file would make the chain depend on a path we do not manage.
        raise ImageError(f"{path} has a backing file ({info['backing-filename']}); flatten it first (qemu-img convert)")
    fmt = str(info.get("format", "raw"))
    vsize = info.get("virtual-size", 0)
    return fmt, int(vsize) if isinstance(vsize, int) else 0


class ImageRegistry:
    """Named, checksummed files the VM runtime boots from. Safe to share between processes:
    every write is a rename of a complete file."""

    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir) / "images"
        self._blobs = self.root / "blobs"
        self._names = self.root / "names"

    def _ensure_dirs(self) -> None:
        # World-searchable: QEMU runs as libvirt-qemu and must reach the blobs through these dirs.
        for d in (self.root, self._blobs, self._names):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)

    @staticmethod
    def _check_name(name: str) -> None:
        if not NAME_RE.match(name) or ".." in name:
            raise ImageError(f"invalid image name {name!r}: use lowercase letters, digits, '.', '_' and '-'")

    def _record_path(self, name: str) -> Path:
        self._check_name(name)
        return self._names / f"{name}.json"

    # ---- writing -------------------------------------------------------------------------------

    def register(
        self,
        name: str,
        source: str | Path,
        *,
        kind: ImageKind = "disk",
        member: str | None = None,
        link: bool = False,
    ) -> ImageRecord:
        """Copy (or hard-link) `source` into the registry under `name`.

        `source` may be a tar archive (by suffix) holding the file: its only regular member, or
        `member`. `link=True` hard-links instead of copying (same filesystem only); the source must
        then never be modified in place, since running VMs read it as their backing file.
        """
        if kind not in KINDS:
            raise ImageError(f"kind must be one of {', '.join(KINDS)}")
        self._record_path(name)  # the name's check, before anything is copied
        src = Path(source)
        if not src.is_file():
            raise ImageError(f"{src} is not a file")
        self._ensure_dirs()
        fd, tmp_name = tempfile.mkstemp(dir=self._blobs, prefix=".incoming-")
        tmp = Path(tmp_name)
        try:
            if src.name.endswith(TAR_SUFFIXES):
                os.close(fd)
                digest = self._extract(src, member, tmp)
            elif link:
                os.close(fd)
                tmp.unlink()
                try:
                    os.link(src, tmp)
                except OSError as exc:
                    raise ImageError(f"cannot hard-link {src} into {self._blobs}: {exc}") from exc
                digest = _sha256_file(tmp)
            else:
                with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
                    digest = _copy_hashing(fin, fout)
            return self._adopt(tmp, digest, name=name, kind=kind, immutable=not link,
                               source=str(src.resolve()) + (f"#{member}" if member else ""))
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def incoming(self) -> Path:
        """A new empty file in the blob directory for a blob being written (then `adopt` it)."""
        self._ensure_dirs()
        fd, name = tempfile.mkstemp(dir=self._blobs, prefix=".incoming-")
        os.close(fd)
        return Path(name)

    def adopt(self, tmp: Path, digest: str, *, name: str, kind: ImageKind, source: str) -> ImageRecord:
        """Register `tmp` (from `incoming`, whose content hashes to `digest`) under `name`."""
        self._record_path(name)  # the name's check, before anything moves
        try:
            return self._adopt(tmp, digest, name=name, kind=kind, immutable=True, source=source)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    def _adopt(self, tmp: Path, digest: str, *, name: str, kind: ImageKind, immutable: bool,
               source: str) -> ImageRecord:
        blob = self._blobs / digest
        if kind == "disk":
            fmt, vsize = probe_disk(tmp)
        else:
            fmt, vsize = "raw", tmp.stat().st_size
        if blob.exists():
            tmp.unlink()  # same content registered before (maybe under another name): share it
        else:
            if immutable:
                tmp.chmod(0o444)  # a base image is immutable; QEMU only ever opens it read-only
            tmp.rename(blob)
        rec = ImageRecord(name=name, kind=kind, format=fmt, sha256=digest, size=blob.stat().st_size,
                          virtual_size=vsize, path=str(blob), source=source, registered_at=time.time())
        _write_atomic(self._record_path(name), json.dumps(asdict(rec), indent=2).encode())
        return rec

    @staticmethod
    def _extract(archive: Path, member: str | None, dest: Path) -> str:
        try:
            with tarfile.open(archive, "r:*") as tar:
                files = [m for m in tar.getmembers() if m.isfile()]
                if member is not None:
                    files = [m for m in files if m.name.lstrip("./") == member.lstrip("./")]
                if len(files) != 1:
                    names = ", ".join(m.name for m in files[:10]) or "none"
                    raise ImageError(f"{archive}: need exactly one regular file (or member=), found: {names}")
                fin = tar.extractfile(files[0])
                if fin is None:
                    raise ImageError(f"{archive}: cannot read {files[0].name}")
                # Stream the member's bytes ourselves: no path from the archive is ever written to.
                with fin, open(dest, "wb") as fout:
                    return _copy_hashing(fin, fout)
        except tarfile.TarError as exc:
            raise ImageError(f"{archive}: {exc}") from exc

    def unregister(self, name: str, *, delete_blob: bool = False) -> None:
        """Forget `name`. The blob stays unless asked, because overlays of existing VMs may still
        use it as their backing file; only delete it when no VM was created from it."""
        rec = self.get(name)
        self._record_path(name).unlink(missing_ok=True)
        if delete_blob and rec is not None and not any(r.sha256 == rec.sha256 for r in self.list()):
            Path(rec.path).unlink(missing_ok=True)

    # ---- reading -------------------------------------------------------------------------------

    def get(self, name: str) -> ImageRecord | None:
        try:
            doc = json.loads(self._record_path(name).read_text())
            return ImageRecord(**doc)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            raise ImageError(f"image record {name!r} is unreadable: {exc}") from exc

    def list(self) -> list[ImageRecord]:
        if not self._names.is_dir():
            return []
        out = []
        for p in sorted(self._names.glob("*.json")):
            rec = self.get(p.stem)
            if rec is not None:
                out.append(rec)
        return out

    def resolve(self, ref: str, kind: ImageKind = "disk") -> ImageRecord:
        """A registered name, or an absolute path that exists on this node."""
        if ref.startswith("/"):
            path = Path(ref)
            if not path.is_file():
                raise ImageError(f"{ref} does not exist on this node")
            fmt, vsize = probe_disk(path) if kind == "disk" else ("raw", path.stat().st_size)
            return ImageRecord(
                name=ref,
                kind=kind,
                format=fmt,
                sha256="",
                size=path.stat().st_size,
                virtual_size=vsize,
                path=str(path),
            )
        rec = self.get(ref)
        if rec is None:
            raise ImageError(f"image {ref!r} is not registered on this node (see {self.root})")
        if rec.kind != kind:
            raise ImageError(f"image {ref!r} is a {rec.kind}, not a {kind}")
        if not Path(rec.path).is_file():
            raise ImageError(f"image {ref!r}: blob {rec.path} is missing")
        return rec

    def verify(self, name: str) -> bool:
        """Re-hash a registered blob (slow for big disks, so never done on the start path)."""
        rec = self.get(name)
        if rec is None:
            raise ImageError(f"image {name!r} is not registered on this node")
        return _sha256_file(Path(rec.path)) == rec.sha256


def _copy_hashing(fin: IO[bytes], fout: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := fin.read(_CHUNK):
        h.update(chunk)
        fout.write(chunk)
    fout.flush()
    os.fsync(fout.fileno())
    return h.hexdigest()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m persys.agent.runtimes.vm.images", description=__doc__.split("\n")[0])
    ap.add_argument("--state-dir", default="/var/lib/persys/agent", help="the agent's --state-dir")
    sub = ap.add_subparsers(dest="cmd", required=True)
    reg = sub.add_parser("register", help="copy a disk image, kernel or initrd into the registry")
    reg.add_argument("name")
    reg.add_argument("source", help="a file, or a tar archive holding it")
    reg.add_argument("--kind", choices=KINDS, default="disk")
    reg.add_argument("--member", help="the file inside a tar archive with several")
    reg.add_argument("--link", action="store_true", help="hard-link instead of copying")
    sub.add_parser("list", help="show registered images")
    unreg = sub.add_parser("unregister", help="forget a name")
    unreg.add_argument("name")
    unreg.add_argument("--delete-blob", action="store_true")
    args = ap.parse_args(argv)
    registry = ImageRegistry(args.state_dir)
    try:
        if args.cmd == "register":
            rec = registry.register(args.name, args.source, kind=args.kind, member=args.member, link=args.link)
            print(f"{rec.name}: {rec.kind} {rec.format} sha256:{rec.sha256} -> {rec.path}")
        elif args.cmd == "list":
            for rec in registry.list():
                print(f"{rec.name}\t{rec.kind}\t{rec.format}\t{rec.virtual_size}\tsha256:{rec.sha256[:16]}")
        else:
            registry.unregister(args.name, delete_blob=args.delete_blob)
    except ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
