"""What `persysctl cp` moves: a tar archive with one file or folder at its top, and where it lands.

Docker's archive API (like `docker cp`) archives a path under its base name. Copying to a
destination that is an existing folder puts the entry into it; any other destination names the
copy itself, so the top entry is renamed to the destination's base name. The agent decides that for
uploads (it can ask the container whether the destination is a folder), persysctl for downloads.
Pure functions over names, and one over tar streams; shared by both sides, so they live here.
"""

from __future__ import annotations

import posixpath
import re
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from typing import IO

from persys.model.names import NAME_RE

_REMOTE = re.compile(r"^(?P<name>[a-z0-9][-a-z0-9]*(\.[0-9]{1,9})?):(?P<path>.*)$")


class CopyError(ValueError):
    """A copy that cannot be done as asked; the message is the one line to show."""


@dataclass(frozen=True, slots=True)
class CopyArgs:
    """`persysctl cp SRC DST` understood: which way, the workload (or instance) and both paths."""

    upload: bool  # local -> workload
    name: str
    remote: str  # absolute path in the container
    local: str


def parse_cp_args(src: str, dst: str) -> CopyArgs:
    """Exactly one side names a workload, as NAME:/abs/path; a local path with a colon is written
    ./a:b (anything starting with . or / is local)."""
    src_remote, dst_remote = _remote(src), _remote(dst)
    if (src_remote is None) == (dst_remote is None):
        raise CopyError("name exactly one side as NAME:/path (e.g. persysctl cp web:/etc/hostname ./hostname)")
    name, path = src_remote or dst_remote or ("", "")
    local = dst if src_remote else src
    if not local:
        raise CopyError("the local path is empty")
    base = name.split(".", 1)[0]
    if not NAME_RE.match(base):
        raise CopyError(f"{name!r} is not a workload name")
    if not path.startswith("/"):
        raise CopyError(f"the path in the workload must be absolute: {name}:/{path.lstrip('/')}")
    return CopyArgs(upload=dst_remote is not None, name=name, remote=path, local=local)


def _remote(arg: str) -> tuple[str, str] | None:
    if arg.startswith((".", "/")):
        return None
    m = _REMOTE.match(arg)
    return (m.group("name"), m.group("path")) if m else None


def top_entry(names: Iterable[str]) -> str:
    """The one entry at the top of an archive (what `docker cp` and persysctl put there)."""
    tops = {n.lstrip("/").removeprefix("./").split("/", 1)[0] for n in names}
    tops.discard("")
    if len(tops) != 1:
        raise CopyError(f"the archive must hold one file or folder at its top, not {len(tops)}")
    top = tops.pop()
    if top in (".", ".."):
        raise CopyError(f"the archive's top entry may not be {top!r}")
    return top


def landing(dest: str, dest_is_dir: bool, top: str) -> tuple[str, str]:
    """(folder to unpack into, the entry's name there) for a copy of `top` to `dest`."""
    if dest_is_dir:
        return dest, top
    folder, base = posixpath.split(dest.rstrip("/") if dest != "/" else dest)
    if not base or dest.endswith("/"):
        raise CopyError(f"{dest} is not a folder")
    return folder or ".", base


def renamed(name: str, top: str, new_top: str) -> str:
    """`name` with its top component `top` replaced by `new_top`."""
    rest = name.lstrip("/").removeprefix("./")
    head, sep, tail = rest.partition("/")
    if head != top:
        raise CopyError(f"archive entry {name!r} is outside {top!r}")
    return new_top + sep + tail


def rewrite(src: IO[bytes], dst: IO[bytes], top: str, new_top: str) -> None:
    """Copy a tar stream with its top entry renamed (link targets inside it too)."""
    with tarfile.open(fileobj=src, mode="r|") as tin, tarfile.open(fileobj=dst, mode="w|") as tout:
        for member in tin:
            member.name = renamed(member.name, top, new_top)
            if member.islnk():
                member.linkname = renamed(member.linkname, top, new_top)
            tout.addfile(member, tin.extractfile(member) if member.isfile() else None)


# -- what a downloaded archive may hold ----------------------------------------------------------
# Checked here, member by member, before anything is written: tarfile's own extraction filter
# (filter="data") is missing or wrong on older Python 3.11 and 3.10 releases a client may run.

MAX_MEMBERS = 100_000


@dataclass(frozen=True, slots=True)
class Member:
    """One tar member as the checks see it: `kind` is file, dir, symlink, hardlink, or what else
    tar says it is (chardev, blockdev, fifo, ...)."""

    name: str
    kind: str
    linkname: str = ""
    size: int = 0


_KINDS = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.CONTTYPE: "file", tarfile.DIRTYPE: "dir",
          tarfile.SYMTYPE: "symlink", tarfile.LNKTYPE: "hardlink", tarfile.CHRTYPE: "chardev",
          tarfile.BLKTYPE: "blockdev", tarfile.FIFOTYPE: "fifo"}


def member_of(info: tarfile.TarInfo) -> Member:
    return Member(info.name, _KINDS.get(info.type, f"type {info.type!r}"), info.linkname, info.size)


def _path_problem(path: str, what: str) -> str:
    if not path or "\0" in path:
        return f"{what} is empty or holds a NUL"
    if path.startswith("/"):
        return f"{what} {path!r} is absolute"
    if ".." in path.split("/"):
        return f"{what} {path!r} climbs out with '..'"
    return ""


def _inside(path: str, top: str) -> bool:
    norm = posixpath.normpath(path)
    return norm == top or norm.startswith(top + "/")


def _link_problem(m: Member, name: str, top: str, seen_files: set[str]) -> str:
    if m.kind == "symlink":
        target = m.linkname
        if target.startswith("/") or not top or not _inside(posixpath.join(posixpath.dirname(name), target), top):
            return f"symbolic link {name!r} -> {target!r} leads out of {top or 'the archive'!r}"
    if m.kind == "hardlink":
        target = m.linkname.removeprefix("./")
        problem = _path_problem(target, f"hard link {name!r} to")
        if problem or target not in seen_files:
            return problem or f"hard link {name!r} -> {target!r} is not to a file before it in the archive"
    return ""


def _member_problem(m: Member, name: str, top: str, links: set[str], seen_files: set[str], max_bytes: int) -> str:
    problem = _path_problem(name, "member")
    if problem:
        return problem
    if m.kind not in ("file", "dir", "symlink", "hardlink"):
        return f"member {name!r} is a {m.kind}, not a file, folder or link"
    if any(name == s or name.startswith(s + "/") for s in links):
        return f"member {name!r} lies below a symbolic link of the archive"
    if m.size < 0 or m.size > max_bytes:
        return f"member {name!r} is {m.size} bytes, more than {max_bytes}"
    return _link_problem(m, name, top, seen_files)


def member_problems(members: Iterable[Member], max_bytes: int, max_members: int = MAX_MEMBERS) -> list[str]:
    """Why an archive from a workload may not be unpacked on the client ([] when it may): every
    member a plain file, folder or link under the one top entry, no absolute path, no '..', no
    link (symbolic or hard) leading out of the top entry, no member below a symbolic link, no
    device, FIFO or other special file, at most `max_bytes` in all and `max_members` members."""
    items = list(members)
    if len(items) > max_members:
        return [f"the archive holds {len(items)} members, more than {max_members}"]
    out: list[str] = []
    links: set[str] = set()
    seen_files: set[str] = set()
    tops = {m.name.removeprefix("./").split("/", 1)[0] for m in items if m.name}
    top = next(iter(tops)) if len(tops) == 1 else ""
    total = 0
    for m in items:
        name = m.name.removeprefix("./").rstrip("/")
        problem = _member_problem(m, name, top, links, seen_files, max_bytes)
        if problem:
            out.append(problem)
            continue
        total += m.size
        if m.kind == "symlink":
            links.add(name)
        elif m.kind == "file":
            seen_files.add(name)
    if total > max_bytes:
        out.append(f"the archive's files hold {total} bytes, more than {max_bytes}")
    return out
