"""Node commands the drivers run (mkfs, mount, losetup, qemu-img): bounded, and their failures
turned into StorageError with the command's own words."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence

from persys.storage.base import StorageError

DEFAULT_TIMEOUT = 60.0
_STDERR_CUT = 400  # enough to show the cause, not a screenful


class CommandFailed(StorageError):
    def __init__(self, argv: Sequence[str], returncode: int, output: str) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        super().__init__(f"{argv[0]} failed ({returncode}): {output[:_STDERR_CUT]}".rstrip(": "))


class ToolMissing(StorageError):
    pass


def run(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT, check: bool = True,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `argv` without a shell, bounded by `timeout`. Never give it a secret in argv."""
    if shutil.which(argv[0]) is None:
        raise ToolMissing(f"{argv[0]} missing on this node (not on PATH)")
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, input=input_text,
                             stdin=None if input_text is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise StorageError(f"{argv[0]} did not finish within {timeout:.0f} s") from e
    if check and res.returncode != 0:
        raise CommandFailed(argv, res.returncode, (res.stderr or res.stdout).strip())
    return res
