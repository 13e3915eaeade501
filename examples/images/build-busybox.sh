#!/usr/bin/env bash
# Build persys/busybox:latest locally from the host's static busybox (no registry needed). Idempotent.
set -euo pipefail

IMAGE="${1:-persys/busybox:latest}"
BUSYBOX="${BUSYBOX:-/bin/busybox}"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  echo "image $IMAGE: already present"
  exit 0
fi
if [[ ! -x "$BUSYBOX" ]]; then
  echo "image $IMAGE: $BUSYBOX missing (apt-get install busybox-static)" >&2
  exit 2
fi

ROOTFS="$(mktemp -d)"
trap 'rm -rf "$ROOTFS"' EXIT
mkdir -p "$ROOTFS"/{bin,etc,tmp,proc,sys,dev,root,var/www}
chmod 1777 "$ROOTFS/tmp"
cp "$BUSYBOX" "$ROOTFS/bin/busybox"
# One symlink per applet, so sh/sleep/httpd/... resolve on PATH=/bin.
for applet in $("$ROOTFS/bin/busybox" --list); do
  [[ "$applet" == busybox ]] || ln -sf busybox "$ROOTFS/bin/$applet"
done
echo 'root:x:0:0:root:/root:/bin/sh' >"$ROOTFS/etc/passwd"
echo 'root:x:0:' >"$ROOTFS/etc/group"
echo 'hello from persys/busybox' >"$ROOTFS/var/www/index.html"

tar -C "$ROOTFS" -c . | docker import -c 'ENV PATH=/bin' -c 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
echo "image $IMAGE: built"
