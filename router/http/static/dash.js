"use strict";
// The llama-router dashboard: polls /status, /dash/timeline, /history and /usage and draws them. No build
// step, no libraries: DOM and SVG only.
(() => {
  const POLL_MS = 2000;
  const HISTORY_MS = 5000;
  const MODELS_MS = 30000;
  const USAGE_MS = 15000;
  const DAY_S = 86400;
  const SVGNS = "http://www.w3.org/2000/svg";
  const KEY_STORE = "llama-router-key";

  const $ = (id) => document.getElementById(id);
  const store = {
    status: null,
    history: null,
    cacheRows: [],
    models: [],
    skew: 0, // server wall clock minus browser wall clock, seconds
    t: [],
    gpus: new Map(),
    window: 3600,
    measured: false,
    serverNow: 0,
    queue: [],
    usage: null,
    got: { status: false, timeline: false, history: false },
  };
  let apiKey = localStorage.getItem(KEY_STORE) || "";

  // ------------------------------------------------------------------------------------------- helpers
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    setAttrs(el, attrs);
    append(el, kids);
    return el;
  }

  function s(tag, attrs, ...kids) {
    const el = document.createElementNS(SVGNS, tag);
    setAttrs(el, attrs);
    append(el, kids);
    return el;
  }

  function setAttrs(el, attrs) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
  }

  function append(el, kids) {
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
  }

  function replace(el, ...kids) {
    el.replaceChildren();
    append(el, kids);
  }

  const GIB = 1024 ** 3;
  const MIB = 1024 ** 2;

  function fmtBytes(b) {
    if (b === null || b === undefined) return "–";
    if (b >= 100 * GIB) return (b / GIB).toFixed(0) + " GiB";
    if (b >= GIB) return (b / GIB).toFixed(1) + " GiB";
    if (b >= MIB) return (b / MIB).toFixed(0) + " MiB";
    return b + " B";
  }

  function fmtDur(sec) {
    if (sec === null || sec === undefined) return "–";
    if (sec < 1) return Math.round(sec * 1000) + " ms";
    if (sec < 10) return sec.toFixed(2) + " s";
    if (sec < 60) return sec.toFixed(1) + " s";
    const m = Math.floor(sec / 60);
    if (m < 60) return m + " m " + Math.floor(sec % 60) + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " m";
  }

  function fmtAge(sec) {
    if (sec < 60) return Math.max(0, Math.floor(sec)) + " s";
    return fmtDur(sec);
  }

  function fmtClock(epoch, seconds = true) {
    const d = new Date(epoch * 1000);
    const pad = (n) => String(n).padStart(2, "0");
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (seconds ? ":" + pad(d.getSeconds()) : "");
  }

  function fmtInt(n) {
    return n === null || n === undefined ? "–" : Number(n).toLocaleString();
  }

  function serverNow() {
    return Date.now() / 1000 + store.skew;
  }

  // Distinct hues that stay clear of the red used for budgets and failures.
  const PALETTE = ["#3b9ede", "#2fb59a", "#9b6ee8", "#e39a2d", "#d957a8", "#5a78e8", "#7cb342", "#c08457", "#26a6b8", "#b06fd0"];
  const assigned = new Map();
  function colorOf(model) {
    if (!assigned.has(model)) {
      let hash = 0;
      for (const ch of model) hash = (hash * 31 + ch.codePointAt(0)) >>> 0;
      let pick = hash % PALETTE.length;
      const used = new Set(assigned.values());
      for (let i = 0; i < PALETTE.length && used.has(PALETTE[pick]); i++) pick = (pick + 1) % PALETTE.length;
      assigned.set(model, PALETTE[pick]);
    }
    return assigned.get(model);
  }

  function swatch(model) {
    return h("span", { class: "swatch", style: `background:${colorOf(model)}` });
  }

  function statusClass(code) {
    return "badge s" + String(code)[0];
  }

  // ----------------------------------------------------------------------------------------------- api
  async function api(path) {
    const headers = apiKey ? { Authorization: "Bearer " + apiKey } : {};
    const response = await fetch(path, { headers, cache: "no-store" });
    if (response.status === 401) {
      $("key-form").hidden = false;
      throw new Error("an API key is needed");
    }
    if (!response.ok) throw new Error(path + " answered " + response.status);
    return response.json();
  }

  // How far a loading replica has come, from what its process read of its weights (" 62% 14 s").
  function loadWords(r) {
    if (r.load) return ` ${r.load.percent}% ${fmtAge(r.load.seconds)}`;
    return r.started_at ? " " + fmtAge(serverNow() - r.started_at) : "";
  }

  // A replica's llama-server log (/logs/{id}) in a new tab; with an API key the text is fetched with it.
  function logLink(r, text) {
    return h("a", { class: "log", href: r.log_url, target: "_blank", rel: "noopener",
      title: `llama-server log of replica ${r.id}`, text, onclick: openLog });
  }

  async function openLog(event) {
    if (!apiKey) return;
    event.preventDefault();
    const href = event.currentTarget.href;
    const tab = window.open("", "_blank");
    const response = await fetch(href, { headers: { Authorization: "Bearer " + apiKey }, cache: "no-store" });
    const url = URL.createObjectURL(new Blob([await response.text()], { type: "text/plain;charset=utf-8" }));
    if (tab) tab.location = url;
    else window.location = url;
  }

  // ---------------------------------------------------------------------------------------- live logs
  // A pane per followed replica under the replica table: its log as it is written (/logs/{id}?follow=1,
  // read with fetch so that the API key goes along; an EventSource could not send it). A loading replica's
  // pane opens by itself and closes when the replica is ready; one that fails keeps its pane, whose last
  // line says why. Any replica's pane opens with its "live" button; × closes it and stops the stream.
  const LOG_TAIL = 40;
  const LOG_KEEP = 400; // lines a pane keeps
  const LOG_PANES = 4; // panes shown at once: opening another closes the oldest (an ended one first)
  const logPanes = new Map(); // replica id -> {el, pre, controller, auto, state}
  const dismissed = new Set(); // replicas whose pane was closed by hand: not opened by itself again

  function openPane(r, auto) {
    if (logPanes.has(r.id)) return;
    if (logPanes.size >= LOG_PANES) {
      const panes = [...logPanes.entries()];
      const [oldest] = panes.find(([, p]) => p.el.dataset.state !== "following") || panes[0];
      closePane(oldest, false);
    }
    const pre = h("pre", { class: "log-lines", "aria-live": "polite" });
    const said = h("span", { class: "hint log-state", text: "following" });
    const close = h("button", { class: "log-close", type: "button", title: "stop following", text: "×",
      onclick: () => closePane(r.id, true) });
    const el = h("div", { class: "log-pane", "data-replica": r.id, "data-state": "following" },
      h("div", { class: "log-head" },
        h("span", { class: "chip" }, swatch(r.model), r.model), h("b", { text: ` #${r.id}` }), said, close),
      pre);
    const pane = { el, pre, said, controller: new AbortController(), auto };
    logPanes.set(r.id, pane);
    $("replica-logs").append(el);
    followLog(r.id, pane);
  }

  function closePane(id, byHand) {
    const pane = logPanes.get(id);
    if (!pane) return;
    pane.controller.abort();
    pane.el.remove();
    logPanes.delete(id);
    if (byHand) dismissed.add(id);
  }

  function paneState(pane, state, words) {
    pane.el.dataset.state = state;
    pane.said.textContent = words;
  }

  function addLines(pane, lines) {
    if (!lines.length) return;
    const pre = pane.pre;
    const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(...lines.map((line) => line + "\n")); // a text node a line, so that old lines can go
    while (pre.childNodes.length > LOG_KEEP) pre.firstChild.remove();
    if (atEnd) pre.scrollTop = pre.scrollHeight;
  }

  async function followLog(id, pane) {
    const headers = apiKey ? { Authorization: "Bearer " + apiKey } : {};
    try {
      const response = await fetch(`logs/${id}?follow=1&lines=${LOG_TAIL}`,
        { headers, cache: "no-store", signal: pane.controller.signal });
      if (!response.ok) throw new Error("answered " + response.status);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let rest = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const parts = (rest + value).split("\n");
        rest = parts.pop();
        addLines(pane, parts);
      }
      if (rest) addLines(pane, [rest]);
      paneState(pane, "ended", "ended");
    } catch (err) {
      if (!pane.controller.signal.aborted) paneState(pane, "failed", "stopped: " + err.message);
    }
  }

  // After each /status: open a pane for each loading replica, close the ones opened that way once ready.
  function syncLogPanes(replicas) {
    const byId = new Map(replicas.map((r) => [r.id, r]));
    for (const r of replicas) if (r.state === "loading" && !dismissed.has(r.id)) openPane(r, true);
    for (const [id, pane] of logPanes) {
      const r = byId.get(id);
      if (pane.auto && r && r.state !== "loading" && pane.el.dataset.state === "following") closePane(id, false);
    }
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    apiKey = $("key-input").value.trim();
    localStorage.setItem(KEY_STORE, apiKey);
    $("key-form").hidden = true;
    refresh();
    refreshHistory();
    refreshModels();
    refreshUsage();
  });

  function setLive(ok, text) {
    $("live-dot").className = "dot " + (ok ? "on" : "off");
    $("live-text").textContent = text;
  }

  // ------------------------------------------------------------------------------------------ timeline
  function mergeTimeline(doc) {
    store.window = doc.window || 3600;
    store.measured = !!doc.measured;
    store.serverNow = doc.now;
    store.skew = doc.now - Date.now() / 1000;
    store.queue = doc.queue || [];
    const fresh = store.t.length === 0;
    for (const gpu of doc.gpus) {
      if (!store.gpus.has(gpu.id) || fresh) {
        store.gpus.set(gpu.id, { budget: [], predicted: [], used: [], total: [], util: [], residents: [] });
      }
      const col = store.gpus.get(gpu.id);
      for (const key of Object.keys(col)) col[key].push(...gpu[key]);
    }
    store.t.push(...doc.t);
    const oldest = doc.now - store.window;
    let drop = 0;
    while (drop < store.t.length && store.t[drop] < oldest) drop++;
    if (drop) {
      store.t.splice(0, drop);
      for (const col of store.gpus.values()) for (const key of Object.keys(col)) col[key].splice(0, drop);
    }
  }

  function niceStep(max, count) {
    const raw = max / count;
    const mag = 10 ** Math.floor(Math.log10(raw));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }

  // Seconds between the time labels of a chart spanning `span` seconds.
  function tickStep(span) {
    return span > 2400 ? 900 : span > 1200 ? 600 : span > 600 ? 300 : span > 240 ? 60 : span > 90 ? 30 : span > 40 ? 10 : 5;
  }

  function drawChart(box, id) {
    const col = store.gpus.get(id);
    const t = store.t;
    const width = Math.max(260, Math.floor(box.clientWidth || 520));
    const residentModels = [];
    for (const list of col.residents) for (const [model] of list) if (!residentModels.includes(model)) residentModels.push(model);
    const laneH = 9;
    const left = 46, right = 36, top = 8, chartH = 128;
    const stripTop = top + chartH + 20;
    const height = stripTop + Math.max(1, residentModels.length) * (laneH + 3) + 4;
    const now = store.serverNow || serverNow();
    const x1 = now;
    const x0 = Math.min(t.length ? Math.max(t[0], now - store.window) : now - 60, now - 10);
    const X = (v) => left + ((v - x0) / (x1 - x0)) * (width - left - right);
    const values = [];
    for (const key of ["budget", "predicted", "used", "total"]) for (const v of col[key]) if (v) values.push(v);
    const yMax = Math.max(GIB, ...values) * 1.08;
    const gStep = niceStep(yMax / GIB, 4) * GIB;
    const Y = (v) => top + chartH - (v / yMax) * chartH;
    const U = (v) => top + chartH - (v / 100) * chartH;

    const svg = s("svg", {
      class: "timeline",
      "data-gpu": id,
      width,
      height,
      viewBox: `0 0 ${width} ${height}`,
      role: "img",
      "aria-label": `GPU ${id} memory and utilisation over time`,
    });
    const axis = s("g", { class: "axis" });
    for (let v = 0; v <= yMax; v += gStep) {
      axis.append(s("line", { class: "grid", x1: left, x2: width - right, y1: Y(v), y2: Y(v) }));
      axis.append(s("text", { x: left - 6, y: Y(v) + 3, "text-anchor": "end", text: v ? fmtBytes(v) : "0" }));
    }
    const tick = tickStep(x1 - x0);
    for (let v = Math.ceil(x0 / tick) * tick; v <= x1; v += tick) {
      axis.append(
        s("text", { x: X(v), y: top + chartH + 13, "text-anchor": "middle", text: fmtClock(v, tick < 60) }),
      );
    }
    if (store.measured) {
      axis.append(s("text", { x: width - right + 6, y: U(100) + 3, text: "100%" }));
      axis.append(s("text", { x: width - right + 6, y: U(0) + 3, text: "0%" }));
    }
    svg.append(axis);

    // predicted use: a step line, with the area under it shaded
    let line = "";
    let points = 0;
    for (let i = 0; i < t.length; i++) {
      const x = X(t[i]);
      const y = Y(col.predicted[i] || 0);
      line += i === 0 ? `M${x.toFixed(1)},${y.toFixed(1)}` : `H${x.toFixed(1)}V${y.toFixed(1)}`;
      points++;
    }
    if (t.length) {
      line += `H${X(x1).toFixed(1)}`;
      const area = line + `V${Y(0).toFixed(1)}H${X(t[0]).toFixed(1)}Z`;
      svg.append(s("path", { class: "area-predicted", d: area }));
    }
    svg.append(s("path", { class: "line-predicted", d: line, "data-points": points }));

    const budget = col.budget.length ? col.budget[col.budget.length - 1] : null;
    if (budget) svg.append(s("line", { class: "line-budget", x1: left, x2: width - right, y1: Y(budget), y2: Y(budget) }));
    const polyline = (cls, key, scale) => {
      let d = "";
      let n = 0;
      for (let i = 0; i < t.length; i++) {
        const v = col[key][i];
        if (v === null || v === undefined) continue;
        d += (n === 0 ? "M" : "L") + X(t[i]).toFixed(1) + "," + scale(v).toFixed(1);
        n++;
      }
      if (n) svg.append(s("path", { class: cls, d, "data-points": n }));
    };
    polyline("line-used", "used", Y);
    polyline("line-util", "util", U);

    // residency lanes: one per model seen in the window; faint while loading, hatched while draining
    const strip = s("g", { class: "residency", "data-gpu": id });
    residentModels.forEach((model, lane) => {
      const y = stripTop + lane * (laneH + 3);
      strip.append(s("text", { x: left - 6, y: y + laneH - 1, "text-anchor": "end", text: model.length > 8 ? model.slice(0, 7) + "…" : model }));
      let i = 0;
      while (i < t.length) {
        const here = col.residents[i].find((r) => r[0] === model);
        if (!here) { i++; continue; }
        let j = i;
        while (j + 1 < t.length) {
          const next = col.residents[j + 1].find((r) => r[0] === model);
          if (!next || next[1] !== here[1]) break;
          j++;
        }
        const xa = X(t[i]);
        const xb = j + 1 < t.length ? X(t[j + 1]) : X(x1);
        const opacity = { loading: 0.4, ready: 1, draining: 0.65, stopping: 0.3 }[here[1]] ?? 1;
        strip.append(
          s("rect", {
            class: "lane",
            "data-model": model,
            "data-state": here[1],
            x: xa.toFixed(1),
            y,
            width: Math.max(1.5, xb - xa).toFixed(1),
            height: laneH,
            rx: 2,
            fill: colorOf(model),
            "fill-opacity": opacity,
          }),
        );
        i = j + 1;
      }
    });
    if (!residentModels.length) {
      strip.append(s("text", { x: left, y: stripTop + laneH - 1, text: "no model resident in this window" }));
    }
    svg.append(strip);

    const cursor = s("line", { class: "cursor", y1: top, y2: top + chartH, visibility: "hidden" });
    svg.append(cursor);
    const hit = s("rect", { x: left, y: top, width: width - left - right, height: chartH, fill: "transparent" });
    svg.append(hit);
    const tip = $("tip");
    const show = (event) => {
      if (!t.length) return;
      const rect = svg.getBoundingClientRect();
      const at = x0 + ((event.clientX - rect.left - left) / (width - left - right)) * (x1 - x0);
      let best = 0;
      for (let i = 1; i < t.length; i++) if (Math.abs(t[i] - at) < Math.abs(t[best] - at)) best = i;
      const x = X(t[best]);
      cursor.setAttribute("x1", x);
      cursor.setAttribute("x2", x);
      cursor.setAttribute("visibility", "visible");
      const rows = [h("b", { text: fmtClock(t[best]) }), h("br"), `predicted ${fmtBytes(col.predicted[best])}`];
      if (col.budget[best]) rows.push(` of ${fmtBytes(col.budget[best])}`);
      if (col.used[best] !== null && col.used[best] !== undefined) {
        rows.push(h("br"), `measured ${fmtBytes(col.used[best])} of ${fmtBytes(col.total[best])}`);
      }
      if (col.util[best] !== null && col.util[best] !== undefined) rows.push(h("br"), `utilisation ${col.util[best]}%`);
      for (const [model, state] of col.residents[best]) rows.push(h("br"), `${model}: ${state}`);
      replace(tip, ...rows);
      tip.hidden = false;
      tip.style.left = Math.min(event.clientX + 14, window.innerWidth - 290) + "px";
      tip.style.top = event.clientY + 14 + "px";
    };
    hit.addEventListener("pointermove", show);
    hit.addEventListener("pointerdown", show);
    hit.addEventListener("pointerleave", () => {
      cursor.setAttribute("visibility", "hidden");
      tip.hidden = true;
    });
    return svg;
  }

  // ----------------------------------------------------------------------------------------------- GPUs
  function renderGpus() {
    const status = store.status;
    const root = $("gpus");
    if (!status) return;
    const replicasOn = (id) => status.replicas.filter((r) => r.gpus.includes(id));
    const cards = status.gpus.map((gpu) => {
      const col = store.gpus.get(gpu.id);
      const last = (key) => (col && col[key].length ? col[key][col[key].length - 1] : null);
      const used = last("used");
      const total = last("total");
      const util = last("util");
      const budget = gpu.budget_bytes;
      const scale = budget || total || Math.max(gpu.used_bytes, GIB);
      const bar = h("div", { class: "membar" + (budget && gpu.used_bytes > budget ? " over" : "") },
        h("div", { class: "fill", style: `width:${Math.min(100, (100 * gpu.used_bytes) / scale).toFixed(1)}%` }),
        used !== null ? h("div", { class: "measured", title: "measured", style: `left:${Math.min(99.5, (100 * used) / scale).toFixed(1)}%` }) : null,
      );
      const nums = h("div", { class: "gpu-nums" },
        "predicted ", h("b", { text: fmtBytes(gpu.used_bytes) }),
        budget ? [" of ", h("b", { text: fmtBytes(budget) }), " budget"] : " (budget unknown)",
        gpu.measured && gpu.measured.foreign_bytes ? [" · other processes ", h("b", { text: fmtBytes(gpu.measured.foreign_bytes) })] : null,
        used !== null ? [" · measured ", h("b", { text: fmtBytes(used) }), " / ", fmtBytes(total)] : null,
        util !== null ? [" · util ", h("b", { text: util + "%" })] : null,
      );
      const chips = replicasOn(gpu.id).map((r) => {
        let state = r.state;
        if (r.state === "loading") state += loadWords(r);
        if (r.state === "ready") state += ` ${r.in_flight}/${r.slots}`;
        return h("span", { class: "chip", "data-model": r.model, "data-state": r.state, title: `replica ${r.id}` },
          swatch(r.model), h("span", { text: r.model }), h("span", { class: "state", text: state }), logLink(r, "log"));
      });
      const chart = h("div", { class: "chart" });
      const card = h("article", { class: "gpu", "data-gpu": gpu.id },
        h("div", { class: "gpu-title" },
          h("h3", { text: `GPU ${gpu.id}` }),
          gpu.name ? h("span", { class: "gpu-name", text: gpu.name + (gpu.bus_id ? ` · ${gpu.bus_id}` : ""), title: "name and PCI bus id" }) : null,
          h("span", { class: "gpu-nums", text: `${gpu.residents.length} / ${gpu.max_models} resident` })),
        bar,
        nums,
        gpu.warning ? h("div", { class: "gpu-warning", role: "note", text: gpu.warning }) : null,
        h("div", { class: "chips residency-now", "data-gpu": gpu.id },
          chips.length ? chips : h("span", { class: "empty", text: "idle: no model resident" })),
        chart,
        h("div", { class: "legend" },
          h("span", {}, h("i", { style: "background:var(--accent)" }), "predicted"),
          budget ? h("span", {}, h("i", { style: "background:var(--bad)" }), "budget") : null,
          store.measured ? h("span", {}, h("i", { style: "background:var(--text)" }), "measured") : null,
          store.measured ? h("span", {}, h("i", { style: "background:var(--util)" }), "utilisation") : null),
      );
      return { card, chart, id: gpu.id };
    });
    replace(root, ...cards.map((c) => c.card));
    for (const c of cards) if (store.gpus.has(c.id)) c.chart.append(drawChart(c.chart, c.id));
    $("gpu-hint").textContent = store.measured
      ? "measured by the GPU driver · last hour"
      : "predicted use against declared budgets (no NVML) · last hour";
  }

  // ---------------------------------------------------------------------------------------- summary
  function stat(label, value, sub, bad) {
    return h("div", { class: "stat" + (bad ? " bad" : "") },
      h("div", { class: "label", text: label }),
      h("div", { class: "value", text: value }),
      h("div", { class: "sub", text: sub || "\u00a0" }));
  }

  function renderSummary() {
    const st = store.status;
    if (!st) return;
    const ready = st.replicas.filter((r) => r.state === "ready");
    const loading = st.replicas.filter((r) => r.state === "loading").length;
    const busy = st.replicas.reduce((n, r) => n + r.in_flight, 0);
    const slots = ready.reduce((n, r) => n + r.slots, 0);
    const queue = store.queue.length ? store.queue : st.queue;
    const oldest = queue.reduce((m, q) => Math.max(m, q.age_s), 0);
    const hist = store.history;
    const last = hist && hist.last_5_min ? hist.last_5_min : { requests: 0, errors: 0, complete: 1 };
    const errors = last.errors;
    replace($("summary"),
      stat("Replicas ready", String(ready.length), loading ? `${loading} loading` : `${st.replicas.length} in all`),
      stat("Slots busy", `${busy} / ${slots}`, "requests on replicas"),
      stat("Queue", String(queue.length), queue.length ? `oldest ${fmtAge(oldest)}` : "nothing waiting"),
      stat("Requests, 5 min", (last.complete ? "" : "≥ ") + fmtInt(last.requests), errors ? `${fmtInt(errors)} failed` : "no failures", errors > 0),
      hist ? stat("History", fmtInt(hist.written), hist.lost ? `${fmtInt(hist.lost)} rows lost` : "rows written", hist.lost > 0) : null,
      st.shutting_down ? stat("Router", "draining", "shutting down", true) : null,
    );
  }

  // ------------------------------------------------------------------------------------- tables
  function table(head, rows, empty) {
    if (!rows.length) return h("div", { class: "empty", text: empty });
    return h("div", { class: "tablewrap" },
      h("table", {},
        h("thead", {}, h("tr", {}, head.map(([text, cls]) => h("th", { class: cls || null, text })))),
        h("tbody", {}, rows)));
  }

  function renderQueue() {
    const st = store.status;
    const queue = store.queue.length || !st ? store.queue : st.queue;
    const rows = queue.map((q, i) =>
      h("tr", { class: "queue-row", "data-target": q.target },
        h("td", { class: "num", text: String(i + 1) }),
        h("td", {}, h("span", { class: "chip" }, swatch(q.target), q.target)),
        h("td", { class: "num", text: fmtAge(q.age_s) }),
        h("td", { class: "queue-client", text: (q.key || "anonymous") + " · " + (q.class || "standard") }),
        h("td", { class: "num wide", text: q.tokens === null ? "–" : fmtInt(q.tokens) }),
        h("td", { class: "mono wide", text: "#" + q.id })));
    replace($("queue"), table([["#", "num"], ["waits for"], ["age", "num"], ["client · class"], ["tokens", "num wide"], ["request", "wide"]], rows, "Nothing waiting."));
    $("queue-hint").textContent = queue.length ? `${queue.length} waiting` : "";
  }

  function renderReplicas() {
    const st = store.status;
    if (!st) return;
    const now = serverNow();
    const rows = st.replicas.map((r) =>
      h("tr", { class: "replica-row", "data-state": r.state },
        h("td", { class: "mono" }, logLink(r, "#" + r.id), " ",
          h("button", { class: "follow", type: "button", "data-replica": r.id, title: "follow its log here",
            text: "live", onclick: () => openPane(r, false) })),
        h("td", {}, h("span", { class: "chip" }, swatch(r.model), r.model)),
        h("td", {}, h("span", { class: "badge st-" + r.state, text: r.state + (r.state === "loading" ? loadWords(r) : "") })),
        h("td", { text: r.gpus.length ? r.gpus.join(", ") : "cpu" }),
        h("td", { class: "num", text: `${r.in_flight} / ${r.slots}` }),
        h("td", { class: "num wide", text: r.started_at ? fmtAge(now - r.started_at) : "–" }),
        h("td", { class: "mono wide", text: r.port ? ":" + r.port : "–" }),
        h("td", { class: "mono wide", text: r.pid || "–" })));
    replace($("replicas"), table(
      [["id"], ["model"], ["state"], ["GPUs"], ["busy", "num"], ["up", "num wide"], ["port", "wide"], ["pid", "wide"]],
      rows, "No replica is running; the first request for a model loads it."));
    $("replica-hint").textContent = st.replicas.length ? `${st.replicas.length} running` : "";
    syncLogPanes(st.replicas);
  }

  function renderPeers() {
    const st = store.status;
    const peers = (st && st.peers) || [];
    $("peers-panel").hidden = !peers.length;
    if (!peers.length) return;
    const now = Date.now() / 1000;
    const rows = peers.map((p) =>
      h("tr", { class: "peer-row", "data-state": p.state },
        h("td", {}, h("span", { class: "chip" }, p.name)),
        h("td", { class: "mono wide", text: p.url }),
        h("td", {}, h("span", { class: "badge " + (p.state === "up" ? "k-ready" : p.state === "down" ? "k-load_failed" : "k-load"), text: p.state })),
        h("td", { text: p.models.length ? p.models.join(", ") : "–" }),
        h("td", { class: "num", text: `${p.in_flight} / ${p.max_in_flight}` }),
        h("td", { class: "num wide", text: p.checked_at ? fmtAge(now - p.checked_at) + " ago" : "–" }),
        h("td", { class: "wide", text: p.reason || "" })));
    replace($("peers"), table(
      [["peer"], ["url", "wide"], ["state"], ["models"], ["in flight", "num"], ["read", "num wide"], ["why", "wide"]],
      rows, "No peer."));
    const down = peers.filter((p) => p.state === "down").length;
    $("peers-hint").textContent = `${peers.length} configured` + (down ? `, ${down} down` : "");
  }

  const KIND = { load: "loading", ready: "ready", load_failed: "load failed", load_refused: "load refused", stop: "stopped", exited: "exited" };

  function renderEvents() {
    const st = store.status;
    if (!st) return;
    const items = st.recent.slice(0, 60).map((e) => {
      let label = KIND[e.kind] || e.kind;
      if (e.kind === "stop" && e.cause === "evicted") label = "evicted";
      return h("li", { class: "event", "data-kind": e.kind },
        h("time", { datetime: new Date(e.at * 1000).toISOString(), text: fmtClock(e.at) }),
        h("span", { class: "kind" }, h("span", { class: "badge k-" + e.kind, text: label })),
        h("span", { class: "what" },
          h("span", { class: "clamp", title: e.reason },
            h("b", { text: e.model }), ` #${e.replica} `, h("span", { class: "reason", text: e.reason }))));
    });
    replace($("events"), items.length ? items : h("li", { class: "empty", text: "No loads yet." }));
  }

  function renderHistory() {
    const hist = store.history;
    if (!hist) return;
    const rows = hist.rows.map((r) => {
      const model = r.model_served && r.model_asked && r.model_served !== r.model_asked
        ? [r.model_asked, " → ", r.model_served]
        : [r.model_served || r.model_asked || "–"];
      const tokens = r.prompt_tokens === null && r.generated_tokens === null
        ? "–"
        : `${fmtInt(r.prompt_tokens)} → ${fmtInt(r.generated_tokens)}`;
      return h("tr", { class: "hist-row", "data-status": r.status, "data-model": r.model_served || r.model_asked || "" },
        h("td", { text: fmtClock(r.at) }),
        h("td", {}, r.model_served ? swatch(r.model_served) : null, " ", ...model),
        h("td", { class: "mono wide" }, r.endpoint, r.stream ? h("span", { class: "tag", text: "stream" }) : null),
        h("td", {}, h("span", { class: statusClass(r.status), text: r.status })),
        h("td", { class: "num wide", text: fmtDur(r.queue_wait) }),
        h("td", { class: "num", text: fmtDur(r.ttft) }),
        h("td", { class: "num", text: fmtDur(r.duration) }),
        h("td", { class: "num", text: tokens }),
        h("td", { class: "num wide", text: fmtInt(r.cached_tokens) }),
        h("td", { class: "mono wide", text: r.client }),
        h("td", { class: "err" }, r.error ? h("span", { class: "clamp", title: r.error, text: r.error }) : null));
    });
    replace($("history"), table(
      [["time"], ["model"], ["endpoint", "wide"], ["status"], ["queued", "num wide"], ["first token", "num"],
        ["total", "num"], ["tokens in → out", "num"], ["cached", "num wide"], ["client", "wide"], ["error"]],
      rows, "No requests match."));
    const parts = [`${hist.rows.length} shown`];
    if (hist.source === "memory") parts.push("database unavailable: showing recent requests from memory");
    if (hist.lost) parts.push(`${fmtInt(hist.lost)} rows lost`);
    $("history-hint").textContent = parts.join(" · ");
  }

  // What each client key used over the last 24 hours (/usage sums the request history, so it survives restarts).
  function renderUsage() {
    const doc = store.usage;
    if (!doc) return;
    const rows = Object.entries(doc.keys || {}).map(([key, u]) =>
      h("tr", { class: "usage-row", "data-key": key, "data-requests": u.requests },
        h("td", { text: key || "anonymous" }),
        h("td", { class: "num", text: fmtInt(u.requests) }),
        h("td", { class: "num", text: fmtInt(u.errors) }),
        h("td", { class: "num", text: fmtInt(u.prompt_tokens) }),
        h("td", { class: "num", text: fmtInt(u.completion_tokens) }),
        h("td", { class: "num wide", text: fmtInt(u.cached_tokens) }),
        h("td", { class: "num wide", text: fmtDur(u.queue_seconds) }),
        h("td", { class: "num", text: fmtDur(u.replica_seconds) })));
    replace($("usage"), table(
      [["key"], ["requests", "num"], ["errors", "num"], ["prompt", "num"], ["completion", "num"],
        ["cached", "num wide"], ["queued", "num wide"], ["replica time", "num"]],
      rows, "No requests in the last 24 hours."));
    $("usage-hint").textContent =
      "last 24 h, from /usage" + (doc.source === "memory" ? " (recent requests only)" : "");
    $("usage").dataset.ready = "1";
  }

  function renderModels() {
    const select = $("f-model");
    const chosen = select.value;
    const canonical = store.models.filter((m) => !m.alias_of); // an alias has an entry of its own too
    const names = canonical.map((m) => m.id);
    replace(select, h("option", { value: "", text: "all" }), names.map((n) => h("option", { value: n, text: n })));
    select.value = names.includes(chosen) ? chosen : "";
    const chat = canonical.filter((m) => !m.pool).map((m) => h("a", { href: `chat/${encodeURIComponent(m.id)}/`, text: `chat: ${m.id}` }));
    replace($("chat-links"), chat);
  }

  // ------------------------------------------------------------------------------------ prompt cache
  // Share of prompt tokens each model served from its replicas' prompt cache, per minute of the last
  // hour, from the request history (rows that report both counts).
  const CACHE_BUCKET = 60;

  function cacheSeries(rows, x0) {
    const byModel = new Map();
    for (const r of rows) {
      if (!r.model_served || !r.prompt_tokens || r.cached_tokens === null || r.cached_tokens === undefined) continue;
      if (r.at < x0) continue;
      if (!byModel.has(r.model_served)) byModel.set(r.model_served, new Map());
      const key = Math.floor(r.at / CACHE_BUCKET) * CACHE_BUCKET;
      const buckets = byModel.get(r.model_served);
      const b = buckets.get(key) || { prompt: 0, cached: 0, requests: 0 };
      b.prompt += r.prompt_tokens;
      b.cached += Math.min(r.cached_tokens, r.prompt_tokens);
      b.requests += 1;
      buckets.set(key, b);
    }
    return [...byModel.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([model, buckets]) => ({
      model,
      points: [...buckets.entries()].sort((a, b) => a[0] - b[0]),
    }));
  }

  function renderCache() {
    const box = $("cache");
    const now = store.serverNow || serverNow();
    const x1 = now;
    const series = cacheSeries(store.cacheRows, now - store.window);
    const first = Math.min(...series.map((m) => m.points[0][0]), now);
    const x0 = Math.min(Math.max(first, now - store.window), now - 10 * CACHE_BUCKET);
    const width = Math.max(260, Math.floor(box.clientWidth || 520));
    const left = 46, right = 36, top = 8, chartH = 110;
    const height = top + chartH + 20;
    const X = (v) => left + ((v - x0) / (x1 - x0)) * (width - left - right);
    const Y = (share) => top + chartH - share * chartH;
    const svg = s("svg", { class: "cache-chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
      "aria-label": "share of prompt tokens served from the prompt cache, per model, over time" });
    const axis = s("g", { class: "axis" });
    for (const v of [0, 0.25, 0.5, 0.75, 1]) {
      axis.append(s("line", { class: "grid", x1: left, x2: width - right, y1: Y(v), y2: Y(v) }));
      axis.append(s("text", { x: left - 6, y: Y(v) + 3, "text-anchor": "end", text: Math.round(v * 100) + "%" }));
    }
    const tick = Math.max(60, tickStep(x1 - x0));
    for (let v = Math.ceil(x0 / tick) * tick; v <= x1; v += tick) {
      axis.append(s("text", { x: X(v), y: top + chartH + 13, "text-anchor": "middle", text: fmtClock(v, false) }));
    }
    svg.append(axis);
    const legend = [];
    for (const { model, points } of series) {
      const color = colorOf(model);
      let d = "";
      let prompt = 0, cached = 0;
      const dots = s("g", { class: "dots-cache" });
      points.forEach(([at, b], i) => {
        const x = X(Math.min(at + CACHE_BUCKET / 2, x1)).toFixed(1);
        const y = Y(b.cached / b.prompt).toFixed(1);
        d += (i === 0 ? "M" : "L") + x + "," + y;
        prompt += b.prompt;
        cached += b.cached;
        dots.append(s("circle", { class: "dot-cache", cx: x, cy: y, r: 2.6, fill: color },
          s("title", { text: `${model} ${fmtClock(at, false)}: ${Math.round((100 * b.cached) / b.prompt)}% of ` +
            `${fmtInt(b.prompt)} prompt tokens cached (${b.requests} requests)` })));
      });
      svg.append(s("path", { class: "line-cache", d, stroke: color, "data-model": model, "data-points": points.length,
        "data-prompt": prompt, "data-cached": cached }));
      svg.append(dots);
      legend.push(h("span", { class: "cache-share", "data-model": model }, swatch(model),
        `${model} ${Math.round((100 * cached) / prompt)}%`));
    }
    if (!series.length) {
      svg.append(s("text", { x: left + 6, y: top + chartH / 2, text: "no prompt tokens reported in this window" }));
    }
    replace(box, svg);
    replace($("cache-legend"), legend);
    $("cache-hint").textContent = "cached prompt tokens / prompt tokens, per minute · last hour";
  }

  function markReady() {
    if (store.got.status && store.got.timeline && store.got.history) document.body.dataset.ready = "1";
  }

  // --------------------------------------------------------------------------------------- polling
  let since = null;
  async function refresh() {
    try {
      const [status, timeline] = await Promise.all([
        api("status"),
        api("dash/timeline" + (since === null ? "" : "?since=" + since)),
      ]);
      store.status = status;
      mergeTimeline(timeline);
      if (store.t.length) since = store.t[store.t.length - 1];
      store.got.status = store.got.timeline = true;
      renderSummary();
      renderGpus();
      renderQueue();
      renderReplicas();
      renderPeers();
      renderEvents();
      setLive(true, "live · " + fmtClock(serverNow()));
      markReady();
    } catch (err) {
      setLive(false, "offline: " + err.message);
    }
  }

  async function refreshHistory() {
    const params = new URLSearchParams({ limit: $("f-limit").value });
    if ($("f-model").value) params.set("model", $("f-model").value);
    if ($("f-status").value) params.set("status", $("f-status").value);
    try {
      const [history, recent] = await Promise.all([api("history?" + params), api("history?limit=1000&status=ok")]);
      store.history = history;
      store.cacheRows = recent.rows;
      store.got.history = true;
      renderHistory();
      renderCache();
      renderSummary();
      markReady();
    } catch (err) {
      $("history-hint").textContent = "could not load: " + err.message;
    }
  }

  async function refreshUsage() {
    try {
      store.usage = await api("usage?since=" + (Math.floor(serverNow()) - DAY_S));
      renderUsage();
    } catch (err) {
      $("usage-hint").textContent = "could not load: " + err.message;
    }
  }

  async function refreshModels() {
    try {
      store.models = (await api("v1/models")).data || [];
      renderModels();
    } catch (err) {
      /* the model list only feeds the filter and the chat links */
    }
  }

  for (const id of ["f-model", "f-status", "f-limit"]) $(id).addEventListener("change", refreshHistory);
  $("filters").addEventListener("submit", (e) => e.preventDefault());

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => {
      renderGpus();
      renderCache();
    }, 150);
  });

  function every(ms, fn) {
    setInterval(() => {
      if (!document.hidden) fn();
    }, ms);
  }

  refresh();
  refreshHistory();
  refreshModels();
  refreshUsage();
  every(POLL_MS, refresh);
  every(HISTORY_MS, refreshHistory);
  every(MODELS_MS, refreshModels);
  every(USAGE_MS, refreshUsage);
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) {
      refresh();
      refreshHistory();
    }
  });
})();
