"use strict";
// /translate: the text goes to /v1/chat/completions with an instruction to translate it; the reply streams
// into the page as it is generated, and Stop aborts the request.
(() => {
  const { $, fillModels, setupKeyForm, streamChat } = window.RouterPages;
  const LANG_STORE = "llama-router-translate-into";
  const MODEL_STORE = "llama-router-translate-model";
  let running = null; // the AbortController of the translation in progress

  function setState(state, text) {
    const el = $("state");
    el.dataset.state = state;
    el.textContent = text;
  }

  function instruction(language) {
    return (
      `Translate the text the user sends into ${language}. Answer with the translation alone: no notes, ` +
      "no quotation marks, no explanation. Keep the meaning, tone, paragraphs and formatting of the original."
    );
  }

  async function loadModels() {
    try {
      await fillModels($("model"), localStorage.getItem(MODEL_STORE));
      if (!running) setState("idle", "");
    } catch (err) {
      setState("error", "could not list the models: " + err.message);
    }
  }

  async function translate(event) {
    event.preventDefault();
    if (running) return;
    const model = $("model").value;
    const language = $("target").value.trim();
    const text = $("source").value;
    if (!model || !language || !text.trim()) return;
    localStorage.setItem(LANG_STORE, language);
    localStorage.setItem(MODEL_STORE, model);
    const output = $("output");
    output.textContent = "";
    output.dataset.pieces = "0";
    running = new AbortController();
    $("go").disabled = true;
    $("stop").disabled = false;
    setState("running", `translating into ${language} with ${model}…`);
    const started = performance.now();
    let pieces = 0;
    try {
      await streamChat({
        model,
        signal: running.signal,
        messages: [
          { role: "system", content: instruction(language) },
          { role: "user", content: text },
        ],
        onDelta: (delta) => {
          pieces += 1;
          output.textContent += delta;
          output.dataset.pieces = String(pieces);
        },
      });
      const seconds = (performance.now() - started) / 1000;
      setState("done", `done in ${seconds.toFixed(1)} s`);
    } catch (err) {
      if (running.signal.aborted) setState("stopped", "stopped");
      else setState("error", err.message);
    } finally {
      running = null;
      $("go").disabled = false;
      $("stop").disabled = true;
    }
  }

  $("translate-form").addEventListener("submit", translate);
  $("stop").addEventListener("click", () => {
    if (running) running.abort();
  });
  $("copy").addEventListener("click", () => {
    const text = $("output").textContent;
    if (text && navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
  });
  const remembered = localStorage.getItem(LANG_STORE);
  if (remembered) $("target").value = remembered;
  setupKeyForm(loadModels);
  loadModels().then(() => {
    document.body.dataset.ready = "1";
  });
})();
