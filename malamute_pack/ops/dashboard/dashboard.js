/*
 * The broker's dashboard (index.html): polls the management API every 2 s
 * (relative URLs: it works behind a path prefix) and updates the page in
 * place. Every string from the API goes into text nodes, never markup.
 * No framework and no build step; the chart is SVG drawn here.
 * Tests: tests/test_ops_dashboard.py.
 */
"use strict";
(() => {
  const INTERVAL = 2000; // ms between refreshes
  const TIMEOUT = 5000; // ms before a request counts as failed
  const WINDOW = 300; // seconds of history in the chart
  const SECTIONS = ["overview", "history", "clients", "streams", "mailboxes", "services",
    "consumers", "journal", "pack", "pair", "bridges"];
  const SERIES = [
    ["stream_messages", "stream messages", "--c1"],
    ["stream_deliveries", "deliveries", "--c2"],
    ["mailbox_messages", "mailbox", "--c3"],
    ["service_requests", "service", "--c4"],
  ];
  const SVG = "http://www.w3.org/2000/svg";
  const $ = (id) => document.getElementById(id);

  // Formatting: thousands separators, rates as /s, bytes in binary units.
  const whole = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
  const one = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1 });
  const compact = new Intl.NumberFormat(undefined, { notation: "compact", maximumFractionDigits: 1 });
  const NONE = "—";
  const int = (v) => (v == null ? NONE : whole.format(v));
  const rate = (v) => (v == null ? NONE : (Math.abs(v) >= 100 ? whole : one).format(v) + "/s");
  const yesno = (v) => (v == null ? NONE : v ? "yes" : "no");
  function bytes(v) {
    if (v == null) return NONE;
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (Math.abs(v) >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return (i ? one : whole).format(v) + " " + units[i];
  }
  function dur(s) {
    if (s == null) return NONE;
    s = Math.max(0, Math.floor(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600);
    const m = Math.floor((s % 3600) / 60), x = s % 60;
    if (d) return `${d}d ${h}h`;
    if (h) return `${h}h ${m}m`;
    if (m) return `${m}m ${x}s`;
    return `${x}s`;
  }
  const clock = (t) => new Date(t).toLocaleTimeString();
  // A start time: the time of day if today, else the date too.
  function startedAt(t) {
    const d = new Date(t), short = { hour: "2-digit", minute: "2-digit" };
    if (d.toDateString() === new Date().toDateString()) return d.toLocaleTimeString(undefined, short);
    return d.toLocaleString(undefined, { month: "short", day: "numeric", ...short });
  }
  const text = (v) => (v == null || v === "" ? NONE : String(v));

  // Builds an element; children that are strings become text nodes.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
    e.append(...children);
    return e;
  }
  function setText(node, value) {
    if (node.textContent !== value) node.textContent = value;
  }

  // A table whose rows are kept by key and updated in place; sortable by header.
  // cols: {label, get(row), fmt(value)?, num?, cls(value, row)?}
  class Table {
    constructor(id, cols, key, opts = {}) {
      this.table = $(id);
      this.cols = cols;
      this.key = key;
      this.name = opts.name || key;
      this.rowClass = opts.rowClass || (() => "");
      this.sortBy = opts.sortBy ?? 0;
      this.dir = opts.dir || 1;
      this.rows = new Map();
      this.list = [];
      const head = el("tr");
      this.heads = cols.map((c, i) => {
        const th = el("th", { scope: "col", class: c.num ? "n" : "" }, c.label);
        th.addEventListener("click", () => {
          if (this.sortBy === i) this.dir = -this.dir;
          else { this.sortBy = i; this.dir = c.num ? -1 : 1; }
          this.render(this.list);
        });
        head.append(th);
        return th;
      });
      this.body = el("tbody");
      this.empty = el("tr", {}, el("td", { class: "empty", colspan: String(cols.length) }, opts.empty || "none"));
      this.table.append(el("thead", {}, head), this.body);
    }

    sorted(list) {
      const col = this.cols[this.sortBy];
      if (!col) return list;
      const dir = this.dir;
      return [...list].sort((a, b) => {
        const x = col.get(a), y = col.get(b);
        if (x == null || y == null) return x == null ? (y == null ? 0 : 1) : -1;
        const c = typeof x === "number" && typeof y === "number" ? x - y
          : String(x).localeCompare(String(y), undefined, { numeric: true });
        return c * dir;
      });
    }

    render(list) {
      this.list = list;
      this.heads.forEach((th, i) => {
        if (i === this.sortBy) th.setAttribute("aria-sort", this.dir > 0 ? "ascending" : "descending");
        else th.removeAttribute("aria-sort");
      });
      const seen = new Set();
      if (this.empty.parentNode) this.empty.remove();
      this.sorted(list).forEach((row, i) => {
        const k = String(this.key(row));
        seen.add(k);
        let tr = this.rows.get(k);
        if (!tr) {
          tr = el("tr");
          for (const c of this.cols) tr.append(el("td", { class: c.num ? "n" : "" }));
          this.rows.set(k, tr);
        }
        const name = String(this.name(row));
        if (tr.dataset.name !== name) tr.dataset.name = name;
        const cls = this.rowClass(row);
        if (tr.className !== cls) tr.className = cls;
        this.cols.forEach((c, j) => {
          const td = tr.children[j], v = c.get(row);
          setText(td, (c.fmt || text)(v));
          const tdClass = [c.num ? "n" : "", c.cls ? c.cls(v, row) : ""].join(" ").trim();
          if (td.className !== tdClass) td.className = tdClass;
        });
        if (this.body.children[i] !== tr) this.body.insertBefore(tr, this.body.children[i] || null);
      });
      for (const [k, tr] of this.rows) {
        if (!seen.has(k)) { tr.remove(); this.rows.delete(k); }
      }
      if (!list.length) this.body.append(this.empty);
    }
  }

  const hot = (v) => (v ? "hot" : "");
  const good = (v) => (v == null ? "" : v ? "yes" : "no");
  const col = (label, key, fmt, num, cls) => ({ label, get: (r) => r[key], fmt, num, cls });

  const tables = {
    clients: new Table("clients-table", [
      { label: "address", get: (r) => r.address || null, fmt: (v) => v || "(anonymous)", cls: () => "name" },
      col("user", "user"),
      { label: "ver", get: (r) => r.version, fmt: (v) => (v == null ? NONE : "v" + v), num: true },
      { label: "credit", get: (r) => (r.credit == null ? Infinity : r.credit), fmt: (v) => (v === Infinity ? "∞" : int(v)), num: true },
      col("subscriptions", "subscriptions", int, true),
      col("queued", "queued", int, true, hot),
      col("held", "held", int, true),
      col("connected", "connected_s", dur, true),
    ], (r) => r.id, { name: (r) => r.address || r.id, rowClass: (r) => (r.internal ? "internal" : ""), empty: "no clients" }),
    streams: new Table("streams-table", [
      { label: "stream", get: (r) => r.name, cls: () => "name" },
      col("writers", "writers", int, true),
      col("readers", "readers", int, true),
      col("messages", "messages", int, true),
      col("deliveries", "deliveries", int, true),
      col("rate", "rate", rate, true),
      col("first", "first_seq", int, true),
      col("last", "last_seq", int, true),
      col("retained", "retained_records", int, true),
      col("size", "retained_bytes", bytes, true),
    ], (r) => r.name, { empty: "no streams" }),
    mailboxes: new Table("mailboxes-table", [
      { label: "address", get: (r) => r.address, cls: () => "name" },
      col("depth", "depth", int, true, hot),
      col("bytes", "bytes", bytes, true),
      col("oldest", "oldest_s", dur, true),
      col("connected", "connected", yesno, false, (v) => (v ? "yes" : "off")),
    ], (r) => r.address, { sortBy: 1, dir: -1, empty: "no mailboxes" }),
    services: new Table("services-table", [
      { label: "service", get: (r) => r.name, cls: () => "name" },
      col("queued", "depth", int, true, hot),
      col("bytes", "bytes", bytes, true),
      col("oldest", "oldest_s", dur, true),
      { label: "workers", get: (r) => r.workers, fmt: int, num: true, cls: (v) => (v ? "" : "no") },
      col("offers", "offers", int, true),
    ], (r) => r.name, { empty: "no services" }),
    consumers: new Table("consumers-table", [
      { label: "consumer", get: (r) => r.stream + " / " + r.name, cls: () => "name" },
      col("position", "position", int, true),
      col("lag", "lag", int, true, hot),
      col("idle", "idle_s", dur, true),
      col("connected", "connected", yesno, false, (v) => (v ? "yes" : "off")),
    ], (r) => r.stream + "/" + r.name, { sortBy: 2, dir: -1, empty: "no consumers" }),
    pack: new Table("pack-table", [
      { label: "member", get: (r) => r.name, cls: () => "name" },
      col("id", "id"),
      col("endpoint", "endpoint"),
      col("streams", "streams", int, true),
      col("addresses", "addresses", int, true),
    ], (r) => r.id ?? r.name, { empty: "no other members seen" }),
  };

  // Overview cards: [id, label, value(data), detail(data)].
  const CARDS = [
    ["version", "broker", (d) => text(d.overview.version),
      (d) => `pid ${d.overview.pid ?? NONE} · ${int(d.overview.counters.malformed)} malformed`],
    ["uptime", "uptime", (d) => dur(d.overview.uptime_s),
      (d) => (d.overview.started ? "since " + startedAt(d.overview.started * 1000) : "")],
    ["clients", "clients", (d) => int(d.overview.clients),
      (d) => `${int(d.overview.counters.refused)} refused · ${int(d.overview.counters.expired_clients)} expired`],
    ["streams", "streams", (d) => int(d.overview.streams), (d) => rate(d.overview.rates.stream_messages) + " in"],
    ["deliveries", "deliveries", (d) => rate(d.overview.rates.stream_deliveries),
      (d) => int(d.overview.counters.stream_deliveries) + " total"],
    ["mailboxes", "mailboxes", (d) => int(d.overview.mailboxes), (d) => rate(d.overview.rates.mailbox_messages)],
    ["services", "services", (d) => int(d.overview.services), (d) => rate(d.overview.rates.service_requests)],
    ["memory", "memory", (d) => bytes(d.overview.rss_bytes), () => "resident"],
    ["journal", "journal", (d) => journalValue(d), (d) => journalDetail(d)],
  ];
  function journalValue(d) {
    if (!d.overview.journal) return "off";
    return d.journal ? bytes(d.journal.size_bytes) : "on";
  }
  function journalDetail(d) {
    const j = d.journal;
    if (!d.overview.journal || !j) return "";
    const p99 = j.commit_latency_ms ? `p99 ${one.format(j.commit_latency_ms.p99)} ms` : "no commits";
    return `${p99} · ${bytes(j.pending_bytes)} pending`;
  }
  const cards = {};
  for (const [id, label] of CARDS) {
    const v = el("div", { class: "v" }, NONE), s = el("div", { class: "s" });
    $("overview").append(el("div", { class: "card", id: "card-" + id }, el("div", { class: "k" }, label), v, s));
    cards[id] = { v, s };
  }
  const legend = {};
  for (const [key, label, color] of SERIES) {
    const b = el("b");
    $("legend").append(el("li", { style: `--sw: var(${color})` }, label, b));
    legend[key] = b;
  }

  function renderOverview(d) {
    for (const [id, , value, detail] of CARDS) {
      setText(cards[id].v, value(d));
      setText(cards[id].s, detail(d));
    }
    setText($("endpoints"), (d.overview.endpoints || []).join("  "));
    for (const [key] of SERIES) setText(legend[key], rate(d.overview.rates[key]));
    document.title = `Malamute · ${int(d.overview.clients)} clients`;
  }

  // The chart: one polyline per series over the last WINDOW seconds.
  let lastHistory = [];
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  }
  function niceMax(v) {
    if (!(v > 1)) return 1;
    const p = 10 ** Math.floor(Math.log10(v));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= v) return m * p;
    return 10 * p;
  }
  function renderChart(history) {
    lastHistory = history;
    const box = $("chart");
    const W = Math.max(200, box.clientWidth), H = Math.max(100, box.clientHeight);
    const L = 58, R = 8, T = 8, B = 20;
    const s = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "message rates per second" });
    const end = history.length ? history[history.length - 1].t : Date.now() / 1000;
    const start = end - WINDOW;
    const points = history.filter((h) => h.t >= start);
    let max = 0;
    for (const h of points) for (const [key] of SERIES) max = Math.max(max, h[key] || 0);
    max = niceMax(max);
    const x = (t) => L + ((t - start) / WINDOW) * (W - L - R);
    const y = (v) => T + (1 - v / max) * (H - T - B);
    for (let i = 0; i <= 4; i++) {
      const v = (max * i) / 4, yy = y(v).toFixed(1);
      s.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: yy, y2: yy }));
      const label = svg("text", { x: L - 6, y: Number(yy) + 4, "text-anchor": "end" });
      label.textContent = compact.format(v) + "/s";
      s.append(label);
    }
    for (let m = 0; m <= WINDOW / 60; m++) {
      const t = start + m * 60;
      const label = svg("text", { x: x(t).toFixed(1), y: H - 4, "text-anchor": m === 0 ? "start" : m === WINDOW / 60 ? "end" : "middle" });
      label.textContent = m === WINDOW / 60 ? "now" : `−${WINDOW / 60 - m}m`;
      s.append(label);
    }
    if (!points.length) {
      const note = svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
      note.textContent = "collecting samples…";
      s.append(note);
    }
    for (const [key, , color] of SERIES) {
      const pts = points.map((h) => `${x(h.t).toFixed(1)},${y(h[key] || 0).toFixed(1)}`).join(" ");
      // Deliveries often equal messages: dashed, so that both lines show.
      const dash = key === "stream_deliveries" ? "; stroke-dasharray: 6 4" : "";
      s.append(svg("polyline", { class: "series", points: pts, style: `stroke: var(${color})${dash}` }));
    }
    box.replaceChildren(s);
  }
  let resizing = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizing);
    resizing = setTimeout(() => renderChart(lastHistory), 150);
  });

  // Pair: every fact it gives, as label and value.
  function renderPair(pair) {
    $("pair-panel").hidden = !(pair && pair.enabled);
    if ($("pair-panel").hidden) return;
    const facts = Object.entries(pair).filter(([k]) => k !== "enabled").map(([k, v]) => {
      const shown = typeof v === "boolean" ? yesno(v) : typeof v === "number" ? int(v)
        : v && typeof v === "object" ? JSON.stringify(v) : text(v);
      const dd = el("dd", { class: typeof v === "boolean" ? good(v) : "" }, shown);
      return el("div", {}, el("dt", {}, k.replace(/_/g, " ")), dd);
    });
    $("pair").replaceChildren(...facts);
  }

  function renderPack(pack) {
    $("pack-panel").hidden = !(pack && pack.enabled);
    if ($("pack-panel").hidden) return;
    setText($("pack-name"), text(pack.name) + (pack.endpoint ? " · " + pack.endpoint : ""));
    const counters = Object.entries(pack.counters || {}).map(([k, v]) => `${k.replace(/_/g, " ")} ${int(v)}`);
    setText($("pack-note"), pack.running === false ? "not running" : counters.join(" · "));
    tables.pack.render(pack.members || []);
  }

  // Bridges: columns from the keys they give (their counters vary by kind).
  function genericTable(id, title, list) {
    const table = $(id);
    if (!list || !list.length) { table.replaceChildren(); return; }
    const keys = [...new Set(list.flatMap((r) => Object.keys(r)))];
    const shown = (v) => (typeof v === "number" ? int(v) : v && typeof v === "object"
      ? int(Object.keys(v).length) : text(v));
    const head = el("tr", {}, ...keys.map((k) => el("th", { scope: "col", class: typeof list[0][k] === "number" ? "n" : "" }, k.replace(/_/g, " "))));
    const rows = list.map((r) => el("tr", { "data-name": text(r.url) },
      ...keys.map((k) => el("td", { class: typeof r[k] === "number" ? "n" : "" }, shown(r[k])))));
    table.replaceChildren(el("caption", { class: "dim" }, title), el("thead", {}, head), el("tbody", {}, ...rows));
  }
  function renderBridges(bridges) {
    $("bridges-panel").hidden = !(bridges && bridges.enabled);
    if ($("bridges-panel").hidden) return;
    genericTable("bridges-out-table", "outbound", bridges.outbound);
    genericTable("bridges-in-table", "inbound", bridges.inbound);
  }

  // Clients: the broker's own connections only when asked for.
  const showInternal = $("show-internal");
  // localStorage may be refused (privacy settings): the choice is then not kept.
  const remember = (value) => { try { localStorage.setItem("malamute.internal", value); } catch (e) { /* not kept */ } };
  try { showInternal.checked = localStorage.getItem("malamute.internal") === "1"; } catch (e) { /* default */ }
  let lastClients = [];
  function renderClients(list) {
    lastClients = list;
    const shown = showInternal.checked ? list : list.filter((c) => !c.internal);
    tables.clients.render(shown);
    const hidden = list.length - shown.length;
    setText($("clients-count"), int(shown.length) + (hidden ? ` (+${int(hidden)} internal)` : ""));
  }
  showInternal.addEventListener("change", () => {
    remember(showInternal.checked ? "1" : "0");
    renderClients(lastClients);
  });

  function render(d) {
    const parts = [
      () => renderOverview(d),
      () => renderChart(d.history || []),
      () => renderClients(d.clients || []),
      ...["streams", "mailboxes", "services", "consumers"].map((name) => () => {
        tables[name].render(d[name] || []);
        setText($(name + "-count"), int((d[name] || []).length));
      }),
      () => renderPack(d.pack),
      () => renderPair(d.pair),
      () => renderBridges(d.bridges),
    ];
    // One section's surprise must not blank the others.
    for (const part of parts) {
      try { part(); } catch (e) { console.error(e); }
    }
  }

  // Polling: one round at a time, the next INTERVAL after the last ends.
  async function getJSON(path) {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT);
    try {
      const response = await fetch(path, { cache: "no-store", credentials: "same-origin", signal: abort.signal });
      if (!response.ok) throw new Error(`${path}: HTTP ${response.status}`);
      return await response.json();
    } finally {
      clearTimeout(timer);
    }
  }
  const status = $("status");
  let failures = 0, since = null;
  function showStatus(kind, message) {
    if (status.className !== "status " + kind) status.className = "status " + kind;
    setText(status, message);
    document.body.classList.toggle("stale", kind === "bad");
  }
  async function refresh() {
    // While the broker is unreachable, only the overview is asked for.
    const names = failures ? ["overview"] : SECTIONS;
    const results = await Promise.allSettled(names.map((name) => getJSON("api/" + name)));
    const data = {};
    names.forEach((name, i) => { if (results[i].status === "fulfilled") data[name] = results[i].value; });
    if (data.overview && failures) {
      failures = 0;
      since = null;
      refresh(); // back: everything, now
      return;
    }
    if (data.overview) {
      render(data);
      const now = new Date();
      showStatus("ok", "live");
      status.title = "";
      setText($("updated"), "updated " + clock(now));
    } else {
      failures += 1;
      since = since || new Date();
      const reason = results[0].reason;
      const why = reason && reason.name === "AbortError" ? "no answer" : String((reason && reason.message) || reason);
      showStatus("bad", `broker unreachable (${why}) since ${clock(since)} · retrying (${failures})`);
      status.title = why;
      document.title = "⚠ Malamute unreachable";
    }
    setTimeout(refresh, INTERVAL);
  }
  refresh();
})();
