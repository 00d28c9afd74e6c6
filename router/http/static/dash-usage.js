"use strict";
// The dashboard's usage panel: what each client key used over the last 24 hours, from /usage (summed from
// the request history, so it survives restarts).
(() => {
  const USAGE_MS = 15000;
  const DAY_S = 86400;
  const KEY_STORE = "llama-router-key"; // the dashboard's key (dash.js asks for it on 401)
  const $ = (id) => document.getElementById(id);

  function cell(text, cls) {
    const td = document.createElement("td");
    if (cls) td.className = cls;
    td.textContent = text;
    return td;
  }

  function whole(n) {
    return Math.round(n).toLocaleString("en-US");
  }

  function seconds(s) {
    if (s < 60) return s.toFixed(1) + " s";
    if (s < 3600) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function render(doc) {
    const holder = $("usage");
    const keys = Object.entries(doc.keys || {});
    holder.replaceChildren();
    if (!keys.length) {
      const empty = document.createElement("div");
      empty.className = "empty";
      empty.textContent = "No requests in the last 24 hours.";
      holder.append(empty);
    } else {
      const heads = [["key"], ["requests", "num"], ["errors", "num"], ["prompt", "num"], ["completion", "num"],
        ["cached", "num wide"], ["queued", "num wide"], ["replica time", "num"]];
      const table = document.createElement("table");
      const head = document.createElement("tr");
      for (const [text, cls] of heads) {
        const th = document.createElement("th");
        if (cls) th.className = cls;
        th.textContent = text;
        head.append(th);
      }
      const thead = document.createElement("thead");
      thead.append(head);
      const tbody = document.createElement("tbody");
      for (const [key, u] of keys) {
        const tr = document.createElement("tr");
        tr.className = "usage-row";
        tr.dataset.key = key;
        tr.dataset.requests = String(u.requests);
        tr.append(cell(key || "anonymous"), cell(whole(u.requests), "num"), cell(whole(u.errors), "num"),
          cell(whole(u.prompt_tokens), "num"), cell(whole(u.completion_tokens), "num"),
          cell(whole(u.cached_tokens), "num wide"), cell(seconds(u.queue_seconds), "num wide"),
          cell(seconds(u.replica_seconds), "num"));
        tbody.append(tr);
      }
      table.append(thead, tbody);
      const wrap = document.createElement("div");
      wrap.className = "tablewrap";
      wrap.append(table);
      holder.append(wrap);
    }
    $("usage-hint").textContent = "last 24 h, from /usage" + (doc.source === "memory" ? " (recent requests only)" : "");
    holder.dataset.ready = "1";
  }

  async function refresh() {
    const key = localStorage.getItem(KEY_STORE) || "";
    const since = Math.floor(Date.now() / 1000) - DAY_S;
    try {
      const response = await fetch("usage?since=" + since, {
        headers: key ? { Authorization: "Bearer " + key } : {},
        cache: "no-store",
      });
      if (!response.ok) throw new Error("/usage answered " + response.status);
      render(await response.json());
    } catch (err) {
      $("usage-hint").textContent = "could not load: " + err.message;
    }
  }

  refresh();
  setInterval(() => {
    if (!document.hidden) refresh();
  }, USAGE_MS);
  $("key-form").addEventListener("submit", () => setTimeout(refresh, 0));
})();
