#!/usr/bin/env bash
# Start virtlogd and the monolithic libvirtd if qemu:///system does not answer (no systemd on the
# dev/CI machine). Idempotent: a running daemon is reused, a stale pid file is ignored.
# The first start takes ~13 s because libvirtd probes QEMU's capabilities.
set -euo pipefail

LIBVIRTD="${LIBVIRTD:-/usr/sbin/libvirtd}"
VIRTLOGD="${VIRTLOGD:-/usr/sbin/virtlogd}"
LOG="${PERSYS_LIBVIRTD_LOG:-/tmp/persys-libvirtd.log}"
PIDFILE="${PERSYS_LIBVIRTD_PIDFILE:-/run/persys-libvirtd.pid}"
VIRTLOGD_PIDFILE="${PERSYS_VIRTLOGD_PIDFILE:-/run/persys-virtlogd.pid}"
TIMEOUT="${PERSYS_LIBVIRTD_TIMEOUT:-60}"
URI="qemu:///system"

answers() { virsh -c "$URI" version >/dev/null 2>&1; }

# Without udev, /dev/kvm stays root-only (0600). libvirt's cached QEMU capabilities then disagree
# with what its QEMU user may open, so it re-probes QEMU (~4 s) on every call that needs them
# (each domain start, getVersion). Apply what Debian's udev rule would: group kvm, mode 0660.
# Domains still only use KVM when persys's accelerator detection says it really works.
if [[ -c /dev/kvm ]] && getent group kvm >/dev/null 2>&1 && [[ "$(stat -c %G /dev/kvm)" != kvm ]]; then
  chgrp kvm /dev/kvm && chmod 0660 /dev/kvm && echo "libvirtd: /dev/kvm set to root:kvm 0660 (as udev would)"
fi

# pid file points at a live process whose command name matches.
alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null && grep -q "$2" "/proc/$(cat "$1")/comm" 2>/dev/null; }

if answers; then
  echo "libvirtd: already running"
  exit 0
fi

for bin in "$LIBVIRTD" "$VIRTLOGD"; do
  if [[ ! -x "$bin" ]]; then
    echo "libvirtd: $bin not found (apt-get install libvirt-daemon-system)" >&2
    exit 2
  fi
done

mkdir -p /run/libvirt /var/log/libvirt/qemu

# libvirtd hands QEMU's stdout/stderr to virtlogd; without it every domain start fails.
if ! pgrep -x virtlogd >/dev/null 2>&1; then
  "$VIRTLOGD" -d -p "$VIRTLOGD_PIDFILE"
  echo "libvirtd: started virtlogd (pid file $VIRTLOGD_PIDFILE)"
fi

if alive "$PIDFILE" libvirtd; then
  echo "libvirtd: pid $(cat "$PIDFILE") exists, waiting for it"
elif pgrep -x libvirtd >/dev/null 2>&1; then
  echo "libvirtd: a libvirtd not started by us exists, waiting for it"
else
  # libvirtd refuses to start while its own pid file names a live process; a stale one is harmless
  # but remove it so an unclean previous exit cannot confuse the next start.
  if [[ -f /run/libvirtd.pid ]] && ! kill -0 "$(cat /run/libvirtd.pid)" 2>/dev/null; then
    rm -f /run/libvirtd.pid
  fi
  nohup "$LIBVIRTD" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  echo "libvirtd: started pid $(cat "$PIDFILE"), log $LOG"
fi

for _ in $(seq 1 $((TIMEOUT * 4))); do
  if answers; then
    echo "libvirtd: ready"
    exit 0
  fi
  if [[ -f "$PIDFILE" ]] && ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null && ! pgrep -x libvirtd >/dev/null 2>&1; then
    echo "libvirtd: libvirtd exited; last log lines:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
  fi
  sleep 0.25
done
echo "libvirtd: $URI did not answer within ${TIMEOUT}s; see $LOG" >&2
exit 1
