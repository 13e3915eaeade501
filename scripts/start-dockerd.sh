#!/usr/bin/env bash
# Start a local Docker daemon if none answers (no systemd on the dev/CI machine). Idempotent.
set -euo pipefail

DOCKERD="${DOCKERD:-/usr/sbin/dockerd}"
LOG="${PERSYS_DOCKERD_LOG:-/tmp/persys-dockerd.log}"
PIDFILE="${PERSYS_DOCKERD_PIDFILE:-/tmp/persys-dockerd.pid}"
TIMEOUT="${PERSYS_DOCKERD_TIMEOUT:-60}"

if docker info >/dev/null 2>&1; then
  echo "docker: already running"
  exit 0
fi

if [[ ! -x "$DOCKERD" ]]; then
  echo "docker: $DOCKERD not found" >&2
  exit 2
fi

# A stale pid file from a previous run only counts when that pid is still dockerd.
if [[ -f "$PIDFILE" ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null \
   && grep -q dockerd "/proc/$(cat "$PIDFILE")/comm" 2>/dev/null; then
  echo "docker: dockerd pid $(cat "$PIDFILE") exists, waiting for it"
else
  # dockerd refuses to start with a leftover pid file of its own.
  rm -f /var/run/docker.pid
  nohup "$DOCKERD" >"$LOG" 2>&1 &
  echo $! >"$PIDFILE"
  echo "docker: started dockerd pid $(cat "$PIDFILE"), log $LOG"
fi

for _ in $(seq 1 $((TIMEOUT * 4))); do
  if docker info >/dev/null 2>&1; then
    # Containers need forwarding for published ports; the default policy may be DROP.
    if command -v iptables >/dev/null 2>&1; then
      iptables -C FORWARD -j ACCEPT 2>/dev/null || iptables -I FORWARD -j ACCEPT 2>/dev/null || true
    fi
    echo "docker: ready"
    exit 0
  fi
  if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "docker: dockerd exited; last log lines:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
  fi
  sleep 0.25
done
echo "docker: dockerd did not answer within ${TIMEOUT}s; see $LOG" >&2
exit 1
