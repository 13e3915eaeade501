"""Device discovery: the node's NVIDIA GPUs, from `nvidia-smi`.

`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits` prints one
line per GPU (`0, GPU-8f6c..., NVIDIA A100-SXM4-40GB, 40960`). No `nvidia-smi` on PATH means
no NVIDIA GPU (nothing advertised); one that fails or prints nonsense is logged and advertises
nothing rather than guessing. NVML through a Python binding would answer the same; the CLI is
what every NVIDIA driver installs, and what tests can stand in for: a fake `nvidia-smi` on PATH
is the only stand-in the test suite uses (this machine has no GPU). MIG slices are not
detected yet (each GPU counts whole)."""

from __future__ import annotations

import csv
import logging
import shutil
import subprocess

from persys.model.devices import MAX_NODE_DEVICES, Device

log = logging.getLogger(__name__)

QUERY = ["--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"]
TIMEOUT_SECONDS = 10.0
MAX_OUTPUT_BYTES = 64 * 1024


def parse_nvidia_smi(text: str) -> list[Device]:
    """The GPUs `nvidia-smi --query-gpu=index,uuid,name,memory.total` listed (pure). Raises
    ValueError naming the line that is not index, uuid, name, memory."""
    out: list[Device] = []
    for n, row in enumerate(csv.reader(text.splitlines()), 1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 4:
            raise ValueError(f"nvidia-smi line {n}: expected index, uuid, name, memory.total; got {row!r}")
        index, uuid, name, memory = (part.strip() for part in row)
        try:
            out.append(Device(id=uuid, vendor="nvidia", model=name[:128], index=int(index),
                              memory_mb=int(float(memory)) if memory not in ("", "[N/A]") else 0))
        except ValueError as err:
            raise ValueError(f"nvidia-smi line {n}: {err}") from None
    if len(out) > MAX_NODE_DEVICES:
        raise ValueError(f"nvidia-smi listed {len(out)} GPUs, more than the {MAX_NODE_DEVICES} a node may advertise")
    return out


def discover_nvidia() -> list[Device]:
    """The NVIDIA GPUs of this host ([] without `nvidia-smi`, or when it fails)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        done = subprocess.run([exe, *QUERY], capture_output=True, timeout=TIMEOUT_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        log.warning("nvidia-smi failed: %s; advertising no GPU", err)
        return []
    if done.returncode != 0:
        log.warning("nvidia-smi exited %d: %s; advertising no GPU", done.returncode,
                    done.stderr.decode(errors="replace").strip()[:300])
        return []
    try:
        return parse_nvidia_smi(done.stdout[:MAX_OUTPUT_BYTES].decode(errors="replace"))
    except ValueError as err:
        log.warning("%s; advertising no GPU", err)
        return []

