// Persys dashboard: one live connection per tab (Server-Sent Events, /ui/live), carrying every
// topic the page shows. Event rows are prepended to the page's event tables; a change notice
// re-fetches only the sections it makes stale (?part=<id>). No framework, no other origin.
(() => {
  "use strict";
  const body = document.body;
  const topics = (body.dataset.topics || "").split(",").filter(Boolean);
  const liveState = document.getElementById("live-state");
  const MAX_ROWS = 200;
  let last = body.dataset.lastEvent || "";
  let source = null;
  let retryMs = 1000;
  let received = 0;

  function setState(s) {
    if (liveState) { liveState.textContent = s; liveState.dataset.state = s; }
    body.dataset.live = s;
  }

  function partUrl(id) {
    const u = new URL(window.location.href);
    u.searchParams.set("part", id);
    return u.pathname + u.search;
  }

  // Stale sections are re-fetched together: one request (?part=a,b,c) builds the page once.
  const pending = new Set();
  let timer = null;
  let inflight = false;

  function typingIn(section) {
    const active = document.activeElement;
    return active && active !== document.body && section.contains(active);
  }

  async function flush() {
    timer = null;
    if (inflight) { timer = setTimeout(flush, 200); return; }
    const ids = [];
    const later = [];
    pending.forEach((id) => {
      const s = document.getElementById(id);
      if (!s) return;
      (typingIn(s) ? later : ids).push(id);  // someone is typing in it: later
    });
    pending.clear();
    later.forEach((id) => pending.add(id));
    if (later.length) timer = setTimeout(flush, 500);
    if (!ids.length) return;
    inflight = true;
    try {
      const resp = await fetch(partUrl(ids.join(",")), { credentials: "same-origin", headers: { "x-persys-part": "1" } });
      if (resp.status === 401) { window.location.assign("/ui/signin?next=" + encodeURIComponent(location.pathname)); return; }
      if (!resp.ok) return;
      const t = document.createElement("template");
      t.innerHTML = (await resp.text()).trim();
      Array.from(t.content.children).forEach((fresh) => {
        const now = fresh.id && document.getElementById(fresh.id);
        if (now) { now.replaceWith(fresh); wire(fresh); }
      });
      body.dataset.refreshes = String(Number(body.dataset.refreshes || "0") + 1);
    } catch (e) {
      ids.forEach((id) => pending.add(id));
      if (!timer) timer = setTimeout(flush, 1000);
    } finally {
      inflight = false;
    }
  }

  function schedule(id, ms) {
    pending.add(id);
    if (!timer) timer = setTimeout(flush, ms);
  }

  function touched(names) {
    document.querySelectorAll("section[data-live]").forEach((s) => {
      if (s.dataset.live.split(" ").some((t) => names.has(t))) schedule(s.id, 150);
    });
  }

  function addRow(html) {
    document.querySelectorAll("table[data-events] tbody").forEach((tbody) => {
      const t = document.createElement("template");
      t.innerHTML = html.trim();
      const row = t.content.firstElementChild;
      if (!row) return;
      tbody.prepend(row);
      while (tbody.rows.length > MAX_ROWS) tbody.deleteRow(tbody.rows.length - 1);
    });
  }

  // Followed logs: lines [time, text] appended once each. The agent's times for the newest output
  // are not stable (a file's lines are timed by when the agent first noted them), so each new
  // stream is asked from a little before the newest line shown and aligned on the text: its lines
  // are held until the last lines shown are found among them (then only what follows is shown),
  // or, failing that, until one is clearly newer, 600 are held or the stream is quiet for 1.5 s
  // (then those not older than the newest shown are).
  const MAX_LOG_LINES = 2000;
  const ALIGN_ON = 3;
  let shownTail = null;
  let aligning = false;
  let held = [];
  let alignTimer = null;

  function ms(t) { return Date.parse(t.slice(0, 23) + "Z"); }

  function show(lines) {
    const pre = document.getElementById("log-lines");
    if (!pre || !lines.length) return;
    let at = pre.dataset.logAt || "";
    let text = "";
    lines.forEach(([t, line]) => { if (t > at) at = t; text += line + "\n"; shownTail.push(line); });
    shownTail = shownTail.slice(-ALIGN_ON);
    pre.dataset.logAt = at;
    const bottom = pre.scrollHeight - pre.scrollTop - pre.clientHeight < 20;
    pre.append(text);
    const all = pre.textContent.split("\n");
    if (all.length > MAX_LOG_LINES + 1) pre.textContent = all.slice(all.length - MAX_LOG_LINES - 1).join("\n");
    if (bottom) pre.scrollTop = pre.scrollHeight;
    body.dataset.logLines = String(Number(body.dataset.logLines || "0") + lines.length);
  }

  function giveUp() {
    const pre = document.getElementById("log-lines");
    const at = (pre && pre.dataset.logAt) || "";
    aligning = false;
    clearTimeout(alignTimer);
    const rest = held.filter(([t]) => !t || t >= at);
    held = [];
    show(rest);
  }

  function align() {
    const k = shownTail.length;
    for (let i = held.length - 1; i >= k - 1 && k > 0; i--) {
      let same = true;
      for (let j = 0; j < k && same; j++) same = held[i - k + 1 + j][1] === shownTail[j];
      if (same) {
        const rest = held.slice(i + 1);
        held = [];
        aligning = false;
        clearTimeout(alignTimer);
        show(rest);
        return;
      }
    }
    const pre = document.getElementById("log-lines");
    const at = ms((pre && pre.dataset.logAt) || "1970-01-01T00:00:00.000Z");
    if (!k || held.length > 600 || held.some(([t]) => t && ms(t) > at + 3000)) { giveUp(); return; }
    clearTimeout(alignTimer);
    alignTimer = setTimeout(giveUp, 1500);
  }

  function appendLog(lines) {
    const pre = document.getElementById("log-lines");
    if (!pre) return;
    if (shownTail === null) shownTail = pre.textContent.split("\n").filter((x, i, a) => i < a.length - 1).slice(-ALIGN_ON);
    if (!aligning) { show(lines); return; }
    held = held.concat(lines);
    align();
  }

  function connect() {
    if (!topics.length) { setState("off"); return; }
    const params = new URLSearchParams({ topics: topics.join(",") });
    if (body.dataset.subject) params.set("subject", body.dataset.subject);
    if (last) params.set("last", last);
    if (body.dataset.version) params.set("version", body.dataset.version);
    const logs = document.getElementById("log-lines");
    if (logs && topics.includes("logs")) params.set("logsince", logs.dataset.logAt || "");
    source = new EventSource("/ui/live?" + params.toString());
    setState("connecting");
    source.onopen = () => { setState("live"); retryMs = 1000; aligning = true; held = []; };
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) {  // refused (not a drop): try again ourselves
        setState("offline");
        source = null;
        setTimeout(connect, retryMs);
        retryMs = Math.min(retryMs * 2, 15000);
      } else {
        setState("reconnecting");  // the browser reconnects itself, sending Last-Event-ID
      }
    };
    source.addEventListener("ev", (m) => {
      last = m.lastEventId || last;
      const d = JSON.parse(m.data);
      received += 1;
      body.dataset.received = String(received);
      addRow(d.html);
      touched(new Set(["events", d.subject]));
    });
    source.addEventListener("change", (m) => {
      const d = JSON.parse(m.data);
      if (d.all) {  // the page is older than the live view: every live section is re-fetched
        document.querySelectorAll("section[data-live]").forEach((s) => schedule(s.id, 50));
      } else {
        touched(new Set(d.topics));
      }
      if (d.version !== undefined) body.dataset.version = String(d.version);
    });
    source.addEventListener("log", (m) => appendLog(JSON.parse(m.data).lines));
    source.addEventListener("logend", (m) => {
      const state = document.getElementById("log-state");
      if (state) { state.textContent = "not following: " + JSON.parse(m.data).reason; state.dataset.state = "ended"; }
    });
    source.addEventListener("gap", (m) => {
      const d = JSON.parse(m.data);
      const gap = document.getElementById("gap");
      if (gap) {
        gap.textContent = "Some events were lost while disconnected (" + d.gap + "); the tables were reloaded.";
        gap.hidden = false;
      }
      document.querySelectorAll("section[data-live]").forEach((s) => schedule(s.id, 50));
    });
  }

  // Live drop for tests and for a user who wants to pause: window.persysLive.drop() / .resume([after id]).
  window.persysLive = {
    drop() { if (source) { source.close(); source = null; setState("paused"); } },
    resume(fromId) { if (fromId) last = String(fromId); if (!source) connect(); },
    get last() { return last; },
  };

  function wire(root) {
    root.querySelectorAll("form[data-confirm]").forEach((f) => {
      f.addEventListener("submit", (e) => { if (!window.confirm(f.dataset.confirm)) e.preventDefault(); });
    });
    root.querySelectorAll("input[data-filter]").forEach((input) => {
      const apply = () => {
        const q = input.value.trim().toLowerCase();
        let shown = 0;
        document.querySelectorAll(input.dataset.filter).forEach((el) => {
          const hit = !q || (el.dataset.search || "").includes(q);
          el.hidden = !hit;
          if (hit) shown += 1;
        });
        input.setAttribute("aria-description", shown + " shown");
      };
      input.addEventListener("input", apply);
      apply();
    });
  }

  wire(document);
  connect();
})();
