"use strict";
// The dashboard's placement panel: each model's verdict from /plan in words ("fits on GPU 0 at 32k",
// "refused: ..."), with buttons that load the model ahead of its requests or let it go (POST /models/load and
// /models/unload, with the dashboard's key: the same guards as any client of those endpoints). The plan
// changes only at start-up and on a reload, so it is read now and then.
(() => {
  const PLAN_MS = 30000;
  const RPC_BASE = 1000; // RPC devices' ids in the plan start here (router/deploy/rpc_devices.py)
  const KEY_STORE = "llama-router-key"; // the dashboard's key (dash.js asks for it on 401)
  const $ = (id) => document.getElementById(id);

  function ctxWords(ctx) {
    if (ctx === null || ctx === undefined) return null;
    if (ctx >= 1024) {
      const k = ctx / 1024;
      return (Number.isInteger(k) ? String(k) : k.toFixed(1)) + "k";
    }
    return String(ctx);
  }

  function whereWords(m) {
    const devices = Object.keys(m.need_by_gpu || {});
    const ids = devices.filter((d) => d !== "cpu").map(Number).sort((a, b) => a - b);
    const gpus = ids.filter((d) => d < RPC_BASE);
    const rpc = ids.length - gpus.length;
    const parts = [];
    if (gpus.length) parts.push((gpus.length === 1 ? "GPU " : "GPUs ") + gpus.join(", "));
    if (rpc) parts.push(rpc === 1 ? "an RPC device" : `${rpc} RPC devices`);
    if (!parts.length) return devices.length ? "the CPU" : null;
    return parts.join(" and ");
  }

  // One model's verdict as a sentence.
  function verdictWords(m) {
    const where = whereWords(m);
    const at = ctxWords(m.ctx);
    const place = [where ? "on " + where : null, at ? "at " + at : null].filter(Boolean).join(" ");
    const slots = m.parallel > 1 && m.ctx_per_slot ? ` (${m.parallel} slots of ${ctxWords(m.ctx_per_slot)})` : "";
    switch (m.verdict) {
      case "fits":
        return `fits ${place}${slots}`.trim();
      case "override":
        return `runs as configured ${place}${slots}` + (m.message ? ": " + m.message : "");
      case "refused":
        return "refused: " + (m.message || "it does not fit");
      case "unknown-budget":
        return "unknown budget: " + (m.message || "the GPU's memory is not known");
      case "error":
        return "no prediction: " + (m.message || "the model file could not be read");
      default:
        return `${m.verdict}: ${m.message || ""}`;
    }
  }

  function render(doc) {
    const list = $("plan");
    list.replaceChildren();
    for (const m of doc.models || []) {
      const li = document.createElement("li");
      li.className = "plan-row";
      li.dataset.model = m.name;
      li.dataset.verdict = m.verdict;
      const name = document.createElement("b");
      name.textContent = m.name;
      const words = document.createElement("span");
      words.className = "verdict";
      words.textContent = verdictWords(m);
      const said = document.createElement("span");
      said.className = "action-said";
      const load = button("Load", "load", m.name, said);
      if (m.verdict === "refused") {
        load.disabled = true;
        load.title = "the plan refuses this model";
      }
      li.append(name, words, actionsOf(load, button("Unload", "unload", m.name, said), said));
      list.append(li);
    }
    if (!list.children.length) {
      const li = document.createElement("li");
      li.className = "empty";
      li.textContent = "No models are configured.";
      list.append(li);
    }
    const refused = (doc.models || []).filter((m) => m.verdict === "refused" || m.verdict === "error").length;
    $("plan-hint").textContent = refused ? `${refused} cannot be placed` : "from /plan";
    list.dataset.ready = "1";
  }

  function actionsOf(...children) {
    const span = document.createElement("span");
    span.className = "actions";
    span.append(...children);
    return span;
  }

  function button(text, action, model, said) {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "action";
    b.dataset.action = action;
    b.textContent = text;
    b.title = `${action} ${model} now`;
    b.addEventListener("click", () => act(action, model, said));
    return b;
  }

  // ``headers`` with the dashboard's API key, when it has one.
  function keyHeaders(headers = {}) {
    const key = localStorage.getItem(KEY_STORE) || "";
    return key ? { ...headers, Authorization: "Bearer " + key } : headers;
  }

  // POST /models/{action} for one model; what the router answered goes beside the buttons.
  async function act(action, model, said) {
    const headers = keyHeaders({ "Content-Type": "application/json" });
    said.dataset.state = "sent";
    said.textContent = action === "load" ? "loading…" : "unloading…";
    try {
      const response = await fetch("models/" + action, { method: "POST", headers, body: JSON.stringify({ model }) });
      const doc = await response.json().catch(() => ({}));
      if (response.status === 401) $("key-form").hidden = false;
      if (!response.ok) throw new Error((doc.error && doc.error.message) || `answered ${response.status}`);
      said.dataset.state = "done";
      said.textContent = action === "load" ? "load asked" : "unload asked";
    } catch (err) {
      said.dataset.state = "failed";
      said.textContent = err.message;
    }
  }

  async function refresh() {
    try {
      const response = await fetch("plan", {
        headers: keyHeaders(),
        cache: "no-store",
      });
      if (!response.ok) throw new Error("/plan answered " + response.status);
      render(await response.json());
    } catch (err) {
      $("plan-hint").textContent = "could not load: " + err.message;
    }
  }

  refresh();
  setInterval(() => {
    if (!document.hidden) refresh();
  }, PLAN_MS);
  $("key-form").addEventListener("submit", () => setTimeout(refresh, 0));
})();
