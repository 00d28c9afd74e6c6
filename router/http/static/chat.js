"use strict";
// /chat: each model, its replicas and their state, and for each ready replica a link to a chat with it:
// the replica's own llama-server web UI through /chat/{model}/, or /talk where that build has none.
(() => {
  const { $, h, replace, api, fetchOk, setupKeyForm } = window.RouterPages;
  const POLL_MS = 3000;
  const webUi = new Map(); // model -> {replicas: "ids seen ready", has: true | false}

  // Whether the model's llama-server serves a web page at "/": ask for it through the pass-through and
  // drop the body as soon as the answer's head arrives. Only asked while a replica is ready, so the
  // question never loads a model; asked again when the set of ready replicas changes.
  async function probe(model, readyIds) {
    const seen = webUi.get(model);
    if (seen && seen.replicas === readyIds) return seen.has;
    const controller = new AbortController();
    let has = null;
    try {
      // A build without a web UI is answered with a redirect to /talk: not followed, it is an opaque answer.
      const response = await fetchOk(`chat/${encodeURIComponent(model)}/`, {
        signal: controller.signal,
        redirect: "manual",
      });
      has = response.type !== "opaqueredirect";
    } catch (err) {
      has = /^404\b/.test(err.message) ? false : null;
    } finally {
      controller.abort();
    }
    if (has !== null) webUi.set(model, { replicas: readyIds, has });
    return has;
  }

  function chatLink(model, has) {
    if (has === null) return h("span", { class: "hint", text: "checking…" });
    if (has) {
      return h("a", { class: "open", "data-kind": "webui", href: `chat/${encodeURIComponent(model)}/`,
        text: "open llama-server UI" });
    }
    return h("a", { class: "open", "data-kind": "talk", href: `talk?model=${encodeURIComponent(model)}`,
      text: "open chat" });
  }

  function replicaRow(r, link) {
    return h("tr", { class: "replica", "data-replica": r.id, "data-model": r.model, "data-state": r.state },
      h("td", { class: "mono", text: "#" + r.id }),
      h("td", {}, h("span", { class: "badge st-" + r.state, text: r.state })),
      h("td", { text: r.gpus.length ? "GPU " + r.gpus.join(", ") : "CPU" }),
      h("td", { class: "num", text: `${r.in_flight} / ${r.slots} busy` }),
      h("td", {}, r.state === "ready" ? link : null));
  }

  function card(model, replicas, has) {
    const link = chatLink(model.id, has);
    const rows = replicas.map((r) => replicaRow(r, link.cloneNode(true)));
    const state = model.state || (replicas.length ? "running" : "unloaded");
    return h("section", { class: "panel model", "data-model": model.id },
      h("div", { class: "panel-head" },
        h("h2", { text: model.id }),
        h("span", { class: "badge st-" + state + " model-state", text: state })),
      rows.length
        ? h("div", { class: "tablewrap" }, h("table", {}, h("tbody", {}, rows)))
        : h("p", { class: "empty", text: "No replica is running; the first request loads one." },
          " ", h("a", { class: "open", "data-kind": "talk", href: `talk?model=${encodeURIComponent(model.id)}`,
            text: "chat (loads it)" })));
  }

  async function refresh() {
    try {
      const [models, status] = await Promise.all([api("v1/models"), api("status")]);
      const cards = [];
      for (const model of (models.data || []).filter((m) => !m.pool && !m.alias_of)) {
        const replicas = status.replicas.filter((r) => r.model === model.id);
        const ready = replicas.filter((r) => r.state === "ready").map((r) => r.id).join(",");
        const has = ready ? await probe(model.id, ready) : null;
        cards.push(card(model, replicas, has));
      }
      replace($("models"), cards.length ? cards : h("p", { class: "empty", text: "No models are configured." }));
      $("state").textContent = "";
      document.body.dataset.ready = "1";
    } catch (err) {
      $("state").textContent = "could not load: " + err.message;
    }
  }

  setupKeyForm(refresh);
  refresh();
  setInterval(() => {
    if (!document.hidden) refresh();
  }, POLL_MS);
})();
