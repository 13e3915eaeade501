#!/usr/bin/env bash
# Refresh the third-party browser code the dashboard ships (today: xterm.js for the browser
# terminal) from npm, pinned by web/package-lock.json, into the Python package. Run by hand when
# bumping a version; the copies are committed, so neither the build nor the gateway needs npm or
# the network.
set -euo pipefail
cd "$(dirname "$0")/../web"
npm ci --ignore-scripts --no-audit --no-fund
out=../src/persys/gateway/dashboard/static/vendor
mkdir -p "$out"
cp node_modules/@xterm/xterm/lib/xterm.js "$out/xterm.js"
cp node_modules/@xterm/xterm/css/xterm.css "$out/xterm.css"
cp node_modules/@xterm/xterm/LICENSE "$out/xterm.LICENSE"
echo "==> vendored @xterm/xterm $(node -p 'require("./node_modules/@xterm/xterm/package.json").version') into $out"
