"""A small ctypes binding of libnfs (Debian's libnfs13, 4.0) for what qemu-img cannot do on an
export: list, stat, mkdir, create an empty file, rename, unlink, rmdir. Userspace NFSv4, so it
works on nodes without a kernel NFS client. Synchronous calls, each bounded by the context's
timeout; one context per `NfsSession` (libnfs contexts are not thread-safe)."""

from __future__ import annotations

import ctypes
import os
import stat as stat_mod
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

from persys.storage.base import StorageError, StorageUnavailable

ENOENT = 2
EEXIST = 17
ENOTEMPTY = 39
O_RDONLY = 0
COPY_CHUNK = 1024 * 1024


class NfsError(StorageError):
    def __init__(self, op: str, path: str, code: int, text: str) -> None:
        self.code = code  # a negative errno, as libnfs returns it
        super().__init__(f"nfs {op} {path}: {text or f'error {code}'}")


class _Url(ctypes.Structure):
    _fields_ = [("server", ctypes.c_char_p), ("path", ctypes.c_char_p), ("file", ctypes.c_char_p)]


class _Stat64(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "dev", "ino", "mode", "nlink", "uid", "gid", "rdev", "size", "blksize", "blocks",
        "atime", "mtime", "ctime", "atime_nsec", "mtime_nsec", "ctime_nsec", "used")]


class _Dirent(ctypes.Structure):
    pass


_Dirent._fields_ = [("next", ctypes.POINTER(_Dirent)), ("name", ctypes.c_char_p)]  # leading fields only


@cache
def _lib() -> Any:
    # libnfs13 is libnfs 4.0, whose signatures are below (5.0, libnfs14, swapped read/write's
    # buffer and count): load that soname only, never whatever find_library would pick.
    try:
        lib = ctypes.CDLL("libnfs.so.13")
    except OSError as e:
        raise StorageUnavailable("libnfs 4.0 missing on this node (install libnfs13)") from e
    vp, cp, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    sigs: dict[str, tuple[Any, list[Any]]] = {
        "nfs_init_context": (vp, []),
        "nfs_destroy_context": (None, [vp]),
        "nfs_set_timeout": (None, [vp, i]),
        "nfs4_set_client_name": (None, [vp, cp]),
        "nfs4_set_verifier": (None, [vp, cp]),
        "nfs_get_error": (cp, [vp]),
        "nfs_parse_url_dir": (ctypes.POINTER(_Url), [vp, cp]),
        "nfs_destroy_url": (None, [ctypes.POINTER(_Url)]),
        "nfs_mount": (i, [vp, cp, cp]),
        "nfs_umount": (i, [vp]),
        "nfs_stat64": (i, [vp, cp, ctypes.POINTER(_Stat64)]),
        "nfs_lstat64": (i, [vp, cp, ctypes.POINTER(_Stat64)]),
        "nfs_open": (i, [vp, cp, i, ctypes.POINTER(vp)]),
        "nfs_read": (i, [vp, vp, ctypes.c_uint64, ctypes.c_void_p]),
        "nfs_write": (i, [vp, vp, ctypes.c_uint64, ctypes.c_void_p]),
        "nfs_readlink": (i, [vp, cp, ctypes.c_char_p, i]),
        "nfs_symlink": (i, [vp, cp, cp]),
        "nfs_chown": (i, [vp, cp, i, i]),
        "nfs_chmod": (i, [vp, cp, i]),
        "nfs_mkdir": (i, [vp, cp]),
        "nfs_rmdir": (i, [vp, cp]),
        "nfs_unlink": (i, [vp, cp]),
        "nfs_rename": (i, [vp, cp, cp]),
        "nfs_link": (i, [vp, cp, cp]),
        "nfs_creat": (i, [vp, cp, i, ctypes.POINTER(vp)]),
        "nfs_close": (i, [vp, vp]),
        "nfs_opendir": (i, [vp, cp, ctypes.POINTER(vp)]),
        "nfs_readdir": (ctypes.POINTER(_Dirent), [vp, vp]),
        "nfs_closedir": (None, [vp, vp]),
    }
    for fn, (res, args) in sigs.items():
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


@dataclass(frozen=True, slots=True)
class Entry:
    name: str
    is_dir: bool
    size: int
    mode: int = 0
    uid: int = 0
    gid: int = 0


class NfsSession:
    """One mounted libnfs context. Paths are absolute inside the export ("/persys/x.img")."""

    def __init__(self, ctx: int, lib: Any) -> None:
        self._ctx = ctx
        self._lib = lib

    def _err(self, op: str, path: str, rc: int) -> NfsError:
        raw = self._lib.nfs_get_error(self._ctx) or b""
        return NfsError(op, path, rc, raw.decode(errors="replace"))

    def stat(self, path: str, *, follow: bool = True) -> Entry | None:
        st = _Stat64()
        fn = self._lib.nfs_stat64 if follow else self._lib.nfs_lstat64
        rc = fn(self._ctx, path.encode(), ctypes.byref(st))
        if rc == -ENOENT:
            return None
        if rc < 0:
            raise self._err("stat", path, rc)
        return Entry(path.rsplit("/", 1)[-1], stat_mod.S_ISDIR(st.mode), int(st.size), int(st.mode), int(st.uid),
                     int(st.gid))

    def mkdir(self, path: str) -> None:
        rc = self._lib.nfs_mkdir(self._ctx, path.encode())
        if rc < 0 and rc != -EEXIST:
            raise self._err("mkdir", path, rc)

    def unlink(self, path: str) -> None:
        rc = self._lib.nfs_unlink(self._ctx, path.encode())
        if rc < 0 and rc != -ENOENT:
            raise self._err("unlink", path, rc)

    def rmdir(self, path: str) -> None:
        rc = self._lib.nfs_rmdir(self._ctx, path.encode())
        if rc < 0 and rc != -ENOENT:
            raise self._err("rmdir", path, rc)

    def rename_new(self, old: str, new: str) -> bool:
        """Rename `old` to `new` (replacing a file or an empty folder), unless `new` is a folder
        with something in it: False then, and nothing changed."""
        rc = self._lib.nfs_rename(self._ctx, old.encode(), new.encode())
        if rc in (-ENOTEMPTY, -EEXIST):
            return False
        if rc < 0:
            raise self._err("rename", old, rc)
        return True

    def link_new(self, old: str, new: str) -> bool:
        """Give file `old` the name `new` too, unless `new` exists: False then, and nothing
        changed. Unlike a rename, it never replaces what another client published meanwhile."""
        rc = self._lib.nfs_link(self._ctx, old.encode(), new.encode())
        if rc == -EEXIST:
            return False
        if rc < 0:
            raise self._err("link", new, rc)
        return True

    def touch(self, path: str, mode: int = 0o600) -> None:
        """Create an empty file (an existing one is left as it is)."""
        if self.stat(path) is not None:
            return
        fh = ctypes.c_void_p()
        rc = self._lib.nfs_creat(self._ctx, path.encode(), mode, ctypes.byref(fh))
        if rc < 0 and rc != -EEXIST:
            raise self._err("create", path, rc)
        if rc >= 0:
            self._lib.nfs_close(self._ctx, fh)

    def listdir(self, path: str) -> list[str]:
        """Names in `path` (without . and ..); a missing folder lists as empty."""
        handle = ctypes.c_void_p()
        rc = self._lib.nfs_opendir(self._ctx, path.encode(), ctypes.byref(handle))
        if rc == -ENOENT:
            return []
        if rc < 0:
            raise self._err("opendir", path, rc)
        names = []
        try:
            while True:
                ent = self._lib.nfs_readdir(self._ctx, handle)
                if not ent:
                    break
                name = (ent.contents.name or b"").decode(errors="surrogateescape")
                if name not in (".", ".."):
                    names.append(name)
        finally:
            self._lib.nfs_closedir(self._ctx, handle)
        return sorted(names)

    def remove_tree(self, path: str) -> None:
        """Remove a file or a folder with everything in it (symbolic links themselves, never
        what they point to); missing: nothing to do."""
        entry = self.stat(path, follow=False)
        if entry is None:
            return
        if not entry.is_dir:
            self.unlink(path)
            return
        for name in self.listdir(path):
            self.remove_tree(f"{path}/{name}")
        self.rmdir(path)

    def copy_tree(self, src: str, dst: str) -> None:
        """Copy a folder with its files, folders and symbolic links, modes and owners (the
        caller builds `dst` under a temporary name and renames it)."""
        entry = self.stat(src, follow=False)
        if entry is None:
            raise NfsError("copy", src, -ENOENT, "no such file or folder")
        kind = stat_mod.S_IFMT(entry.mode)
        if kind == stat_mod.S_IFDIR:
            self.mkdir(dst)
            for name in self.listdir(src):
                self.copy_tree(f"{src}/{name}", f"{dst}/{name}")
        elif kind == stat_mod.S_IFLNK:
            self._copy_link(src, dst)
        elif kind == stat_mod.S_IFREG:
            self._copy_file(src, dst)
        else:
            raise StorageError(f"nfs copy {src}: a special file (only files, folders and links are copied)")
        if kind != stat_mod.S_IFLNK:  # a link keeps the copier's owner: libnfs' NFSv4 lchown follows it
            self._check("chown", dst, self._lib.nfs_chown(self._ctx, dst.encode(), entry.uid, entry.gid))
            self._check("chmod", dst, self._lib.nfs_chmod(self._ctx, dst.encode(), stat_mod.S_IMODE(entry.mode)))

    def _check(self, op: str, path: str, rc: int) -> int:
        if rc < 0:
            raise self._err(op, path, rc)
        return rc

    def _copy_link(self, src: str, dst: str) -> None:
        buf = ctypes.create_string_buffer(4096)
        self._check("readlink", src, self._lib.nfs_readlink(self._ctx, src.encode(), buf, len(buf)))
        self._check("symlink", dst, self._lib.nfs_symlink(self._ctx, buf.value, dst.encode()))

    def _copy_file(self, src: str, dst: str) -> None:
        fin, fout = ctypes.c_void_p(), ctypes.c_void_p()
        self._check("open", src, self._lib.nfs_open(self._ctx, src.encode(), O_RDONLY, ctypes.byref(fin)))
        try:
            self._check("create", dst, self._lib.nfs_creat(self._ctx, dst.encode(), 0o600, ctypes.byref(fout)))
            try:
                buf = ctypes.create_string_buffer(COPY_CHUNK)
                while (got := self._check("read", src, self._lib.nfs_read(self._ctx, fin, COPY_CHUNK, buf))) > 0:
                    done = 0
                    while done < got:
                        done += self._check("write", dst, self._lib.nfs_write(
                            self._ctx, fout, got - done, ctypes.byref(buf, done)))
            finally:
                self._lib.nfs_close(self._ctx, fout)
        finally:
            self._lib.nfs_close(self._ctx, fin)


@contextmanager
def session(url: str, timeout: float) -> Iterator[NfsSession]:
    """Mount the export `url` (nfs://server/export?version=4&nfsport=N) in userspace."""
    lib = _lib()
    ctx = lib.nfs_init_context()
    if not ctx:
        raise StorageError("libnfs could not create a context")
    try:
        lib.nfs_set_timeout(ctx, int(timeout * 1000))
        # An NFSv4 client identity of its own: libnfs names every context of a process alike, and
        # two sessions at once (a node's attach beside its report, the controller beside the
        # node in `persys dev`) then fail with NFS4ERR_STALE_CLIENTID as the server confuses them.
        nonce = uuid.uuid4()
        lib.nfs4_set_client_name(ctx, f"persys-{os.getpid()}-{nonce.hex[:16]}".encode())
        lib.nfs4_set_verifier(ctx, nonce.bytes[:8])
        parsed = lib.nfs_parse_url_dir(ctx, url.encode())
        if not parsed:
            raise StorageError(f"bad NFS URL {url}: {(lib.nfs_get_error(ctx) or b'').decode(errors='replace')}")
        try:
            rc = lib.nfs_mount(ctx, parsed.contents.server, parsed.contents.path)
        finally:
            lib.nfs_destroy_url(parsed)
        if rc < 0:
            why = (lib.nfs_get_error(ctx) or b"").decode(errors="replace")
            raise StorageUnavailable(f"NFS export {url.split('?')[0]} unreachable: {why or f'error {rc}'}")
        try:
            yield NfsSession(ctx, lib)
        finally:
            lib.nfs_umount(ctx)
    finally:
        lib.nfs_destroy_context(ctx)
