// The browser terminal and a VM's serial console: xterm.js (vendored, web/package-lock.json) over the gateway's terminal
// WebSocket. Binary frames are the terminal's bytes both ways; text frames are JSON control
// messages ({"ready"}, {"ended", "exitCode"}, {"error"} from the gateway; {"cols", "rows"} to it).
(() => {
  "use strict";
  const box = document.getElementById("terminal");
  const form = document.getElementById("term-form");
  const status = document.getElementById("term-status");
  if (!box || !form || !window.Terminal) return;
  const term = new window.Terminal({ cols: 100, rows: 28, convertEol: false, fontSize: 14 });
  term.open(box);
  const encoder = new TextEncoder();
  let ws = null;

  function say(text, state) {
    status.textContent = text;
    status.dataset.state = state;
  }

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (ws) ws.close();
    const params = new URLSearchParams();
    const console_ = box.dataset.mode === "console";  // a VM's serial console: no command, no size
    const command = document.getElementById("term-command");
    if (command) command.value.trim().split(/\s+/).filter(Boolean).forEach((w) => params.append("command", w));
    const inst = document.getElementById("term-instance").value;
    if (inst) params.set("instance", inst);
    if (!console_) {
      params.set("cols", String(term.cols));
      params.set("rows", String(term.rows));
    }
    const url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host +
      "/v1/workloads/" + encodeURIComponent(box.dataset.workload) + (console_ ? "/console?" : "/terminal?") +
      params.toString();
    ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    say("connecting", "connecting");
    ws.onmessage = (m) => {
      if (typeof m.data !== "string") { term.write(new Uint8Array(m.data)); return; }
      const d = JSON.parse(m.data);
      if (d.ready) { say("connected to " + d.instance + " on " + d.node, "connected"); term.focus(); }
      if (d.ended) say(console_ ? "detached: " + (d.detail || "the console closed") : "ended, exit code " + d.exitCode,
        "ended");
      if (d.error) say("error: " + d.error, "error");
    };
    ws.onclose = (e) => { if (status.dataset.state === "connecting") say("refused (" + e.code + ")", "error"); ws = null; };
  });
  term.onData((d) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(encoder.encode(d)); });
  term.onResize((s) => { if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify(s)); });
})();
