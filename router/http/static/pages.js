"use strict";
// What the router's own pages share: DOM building, the API key (the dashboard's, kept in local storage),
// same-origin API calls and a streamed chat completion. No libraries, no build step.
window.RouterPages = (() => {
  const KEY_STORE = "llama-router-key"; // the dashboard keeps its key under the same name

  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  function replace(el, ...kids) {
    el.replaceChildren(...Array.from(h("span", {}, ...kids).childNodes));
  }

  // ------------------------------------------------------------------------------------------ API key
  let apiKey = localStorage.getItem(KEY_STORE) || "";
  const onKeyChange = [];

  function headers(extra) {
    const out = Object.assign({}, extra || {});
    if (apiKey) out.Authorization = "Bearer " + apiKey;
    return out;
  }

  function askForKey() {
    const form = $("key-form");
    if (form) form.hidden = false;
  }

  // The page's key form (id "key-form", input "key-input"): a key typed there is kept and used from then on.
  function setupKeyForm(callback) {
    if (callback) onKeyChange.push(callback);
    const form = $("key-form");
    if (!form || form.dataset.bound) return;
    form.dataset.bound = "1";
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      apiKey = $("key-input").value.trim();
      localStorage.setItem(KEY_STORE, apiKey);
      form.hidden = true;
      for (const fn of onKeyChange) fn();
    });
  }

  async function errorText(response) {
    try {
      const doc = await response.json();
      if (doc && doc.error && doc.error.message) return `${response.status}: ${doc.error.message}`;
    } catch (err) {
      /* not JSON */
    }
    return `the router answered ${response.status}`;
  }

  async function fetchOk(path, options) {
    const init = Object.assign({ cache: "no-store" }, options || {});
    init.headers = headers(init.headers);
    const response = await fetch(path, init);
    if (response.status === 401) {
      askForKey();
      throw new Error("this router needs an API key");
    }
    if (response.type === "opaqueredirect") return response; // asked not to follow it (redirect: "manual")
    if (!response.ok) throw new Error(await errorText(response));
    return response;
  }

  async function api(path) {
    return (await fetchOk(path)).json();
  }

  // ----------------------------------------------------------------------------------------- models
  async function modelNames() {
    const doc = await api("v1/models");
    return (doc.data || []).map((m) => m.id);
  }

  // Fills a <select> with the router's models and pools, keeping the choice (or taking `wanted`).
  async function fillModels(select, wanted) {
    const names = await modelNames();
    const chosen = wanted || select.value;
    select.replaceChildren(...names.map((n) => h("option", { value: n, text: n })));
    if (names.includes(chosen)) select.value = chosen;
    return names;
  }

  // ------------------------------------------------------------------------------------- streaming
  // POSTs a streamed chat completion and calls onDelta(text) for each piece of content as it arrives.
  // `signal` (an AbortSignal) stops it: the fetch is aborted and the router sees the client leave.
  async function streamChat({ model, messages, signal, onDelta, extra }) {
    const body = Object.assign({ model, messages, stream: true }, extra || {});
    const response = await fetchOk("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal,
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    let finished = false;
    const take = (line) => {
      if (!line.startsWith("data:")) return; // comments (keep-alives), event names, blank lines
      const data = line.slice(5).trim();
      if (data === "[DONE]") {
        finished = true;
        return;
      }
      const doc = JSON.parse(data);
      if (doc.error) throw new Error(doc.error.message || "the stream ended with an error");
      const choice = (doc.choices || [])[0];
      const text = choice && choice.delta ? choice.delta.content : null;
      if (text) onDelta(text);
      if (choice && choice.finish_reason) finished = true;
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      const lines = pending.split(/\r?\n/);
      pending = lines.pop();
      for (const line of lines) take(line);
    }
    if (pending) take(pending);
    return finished;
  }

  return { $, h, replace, headers, setupKeyForm, api, fetchOk, modelNames, fillModels, streamChat };
})();
