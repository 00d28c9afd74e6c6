"use strict";
// The dashboard's placement panel: each model's verdict from /plan in words ("fits on GPU 0 at 32k",
// "refused: ..."). The plan changes only at start-up and on a reload, so it is read now and then.
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
      li.append(name, words);
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

  async function refresh() {
    const key = localStorage.getItem(KEY_STORE) || "";
    try {
      const response = await fetch("plan", {
        headers: key ? { Authorization: "Bearer " + key } : {},
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
