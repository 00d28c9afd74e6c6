"use strict";
// The dashboard's RPC devices panel: each [rpc_devices.NAME] from /status with its state (in use,
// reachable, unreachable, unknown), the memory its replicas are predicted to use against its budget,
// and which models hold it. Hidden while no RPC device is configured.
(() => {
  const RPC_MS = 3000;
  const KEY_STORE = "llama-router-key"; // the dashboard's key (dash.js asks for it on 401)
  const $ = (id) => document.getElementById(id);
  const STATE_WORDS = {
    in_use: "in use",
    reachable: "reachable",
    unreachable: "unreachable",
    unknown: "not probed yet",
  };

  function fmtBytes(b) {
    if (b === null || b === undefined) return "–";
    if (b >= 1 << 30) return (b / (1 << 30)).toFixed(2) + " GiB";
    return (b / (1 << 20)).toFixed(0) + " MiB";
  }

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function card(d) {
    const article = el("article", "gpu rpc-device");
    article.dataset.rpc = d.name;
    article.dataset.state = d.state;
    const title = el("div", "gpu-title");
    title.append(el("h3", "", `RPC ${d.name}`), el("span", "gpu-name mono", d.endpoint));
    const badge = el("span", "badge rpc-" + d.state, STATE_WORDS[d.state] || d.state);
    badge.title = d.probe && d.probe.error ? d.probe.error : "TCP connect probe";
    title.append(badge);
    const scale = d.budget_bytes || 1;
    const bar = el("div", "membar" + (d.predicted_bytes > d.budget_bytes ? " over" : ""));
    const fill = el("div", "fill");
    fill.style.width = Math.min(100, (100 * d.predicted_bytes) / scale).toFixed(1) + "%";
    bar.append(fill);
    const nums = el("div", "gpu-nums");
    nums.append("predicted ", el("b", "", fmtBytes(d.predicted_bytes)), " of ", el("b", "", fmtBytes(d.budget_bytes)), " declared");
    if (d.probe && d.probe.reachable && d.probe.connect_ms !== null) nums.append(` · connect ${d.probe.connect_ms} ms`);
    if (d.probe && !d.probe.reachable && d.probe.error) nums.append(" · " + d.probe.error);
    const chips = el("div", "chips");
    for (const r of d.replicas) {
      const chip = el("span", "chip");
      chip.dataset.model = r.model;
      chip.dataset.state = r.state;
      chip.title = `replica ${r.id}`;
      chip.append(el("span", "", r.model), el("span", "state", r.state));
      chips.append(chip);
    }
    if (!d.replicas.length) chips.append(el("span", "empty", "idle: no replica holds it"));
    const models = el("div", "gpu-nums", d.models.length ? "used by " + d.models.join(", ") : "no model lists it");
    article.append(title, bar, nums, chips, models);
    return article;
  }

  function render(status) {
    const devices = status.rpc_devices || [];
    const panel = $("rpc-panel");
    panel.hidden = !devices.length;
    $("rpc-devices").replaceChildren(...devices.map(card));
    const down = devices.filter((d) => d.state === "unreachable").length;
    $("rpc-hint").textContent = down ? `${down} not answering` : "remote devices through rpc-server";
    $("rpc-devices").dataset.ready = "1";
  }

  async function refresh() {
    const key = localStorage.getItem(KEY_STORE) || "";
    try {
      const response = await fetch("status", {
        headers: key ? { Authorization: "Bearer " + key } : {},
        cache: "no-store",
      });
      if (!response.ok) throw new Error("/status answered " + response.status);
      render(await response.json());
    } catch (err) {
      $("rpc-hint").textContent = "could not load: " + err.message;
    }
  }

  refresh();
  setInterval(() => {
    if (!document.hidden) refresh();
  }, RPC_MS);
  $("key-form").addEventListener("submit", () => setTimeout(refresh, 0));
})();
