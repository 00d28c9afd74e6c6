"use strict";
// /talk?model=NAME: a plain chat with one model through /v1/chat/completions, for llama-server builds that
// serve no web UI of their own. The conversation lives in the page only; replies stream in; Stop aborts.
(() => {
  const { $, h, fillModels, setupKeyForm, streamChat } = window.RouterPages;
  const conversation = []; // {role, content}
  let running = null;

  function setState(state, text) {
    $("state").dataset.state = state;
    $("state").textContent = text;
  }

  function bubble(role, text) {
    const el = h("div", { class: "msg", "data-role": role },
      h("div", { class: "who", text: role === "user" ? "you" : $("model").value }),
      h("div", { class: "text", text }));
    $("messages").append(el);
    el.scrollIntoView({ block: "end" });
    return el.querySelector(".text");
  }

  async function send(event) {
    if (event) event.preventDefault();
    if (running) return;
    const text = $("prompt").value;
    const model = $("model").value;
    if (!text.trim() || !model) return;
    $("prompt").value = "";
    conversation.push({ role: "user", content: text });
    bubble("user", text);
    const out = bubble("assistant", "");
    out.parentElement.dataset.streaming = "1";
    running = new AbortController();
    $("send").disabled = true;
    $("stop").disabled = false;
    setState("running", `${model} is answering…`);
    let reply = "";
    try {
      await streamChat({
        model,
        messages: conversation.slice(),
        signal: running.signal,
        onDelta: (delta) => {
          reply += delta;
          out.textContent = reply;
        },
      });
      setState("done", "");
    } catch (err) {
      if (running.signal.aborted) setState("stopped", "stopped");
      else {
        setState("error", err.message);
        out.parentElement.dataset.error = "1";
        if (!reply) out.textContent = err.message;
      }
    } finally {
      if (reply) conversation.push({ role: "assistant", content: reply });
      else if (conversation.length && conversation[conversation.length - 1].role === "user") conversation.pop();
      delete out.parentElement.dataset.streaming;
      running = null;
      $("send").disabled = false;
      $("stop").disabled = true;
    }
  }

  $("compose").addEventListener("submit", send);
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) send(event);
  });
  $("stop").addEventListener("click", () => {
    if (running) running.abort();
  });
  $("clear").addEventListener("click", () => {
    if (running) running.abort();
    conversation.length = 0;
    $("messages").replaceChildren();
    setState("idle", "");
  });

  const wanted = new URLSearchParams(location.search).get("model");
  async function loadModels() {
    try {
      await fillModels($("model"), wanted);
      document.title = `${$("model").value} · chat · llama-router`;
    } catch (err) {
      setState("error", "could not list the models: " + err.message);
    }
  }
  setupKeyForm(loadModels);
  loadModels().then(() => {
    document.body.dataset.ready = "1";
  });
})();
