// Section 10 of the lesson, Context window: a meter of the window's use, and a small window filled
// until the server refuses the next token.

import { on, state, step } from "../app.js";
import { byId, h, label, note, numberInput, row } from "../dom.js";
import { pct } from "../format.js";

const waiting = { error: null };  // set while the window demonstration steps: the step's refusal

export function build() {
  const size = numberInput("ctx-size", 24, 2, 4096);
  const fill = h("button", { id: "ctx-fill" }, "Fill a small window");
  fill.addEventListener("click", fillWindow);
  byId("lesson-context").append(
    note("Everything the model reads at once (the prompt, the conversation so far and its own answer) must fit " +
         "in its context window: the positions it was trained for, and the KV cache's memory."),
    h("meter", { id: "ctx-meter", min: 0, max: 1, value: 0 }), h("p", { id: "ctx-text" }),
    h("h3", {}, "When the text no longer fits"), row(label("window (tokens)", size), fill),
    note("This starts a new session of your prompt with that small window and steps until the server refuses."),
    h("p", { id: "ctx-result" }),
    note("Engines meet a full window in one of three ways: refuse (OpenAI-style APIs answer 400 with " +
         "context_length_exceeded, as this server does), cut the oldest tokens off and go on (a sliding window: " +
         "the model forgets the beginning), or, in chat apps, drop or summarise the oldest turns. That is why a " +
         "long chat can lose an instruction given at its start."));
  on("session", (data) => renderMeter(data.prompt.length, data.model.context));
  on("step", (view) => renderMeter(view.context.used, view.context.limit));
  on("goto", (view) => renderMeter(state.prompt.length + view.generated.length, state.model.context));
  on("error", (e) => { if (waiting.error) waiting.error(e); });
}

function renderMeter(used, limit) {
  const meter = byId("ctx-meter"), p = byId("ctx-text");
  Object.assign(meter, { max: limit, value: used });
  Object.assign(p.dataset, { used, limit });
  p.textContent = `${used} of the window's ${limit} positions used (${pct(used / limit)}).`;
}

// Start with the window size in the prompt box's context field, then Step until a refusal.
async function fillWindow() {
  const size = Number(byId("ctx-size").value), button = byId("ctx-fill"), result = byId("ctx-result");
  button.disabled = true;
  delete result.dataset.refused;
  result.textContent = `Starting a session with a window of ${size} tokens…`;
  const before = byId("context").value;
  byId("context").value = String(size);
  let refusal = await startSession();
  byId("context").value = before;  // the session keeps its small window; the next Start gets the usual one
  for (let i = 0; refusal === null && i <= size; i++) refusal = await stepOnce();
  result.dataset.refused = refusal === null ? "" : "1";
  result.dataset.message = refusal ?? "";
  result.replaceChildren(refusal === null ? "The window did not fill." : h("strong", {}, `Refused: ${refusal}`));
  button.disabled = false;
}

function startSession() {  // null once the session is there, or the server's refusal
  return new Promise((resolve) => {
    const status = byId("status"), before = state.session;
    const observer = new MutationObserver(() => {
      const text = status.textContent;
      if (text.startsWith("error:")) done(text.slice("error:".length).trim());
      else if (state.session !== before && text !== "loading…") done(null);
    });
    const done = (value) => { observer.disconnect(); resolve(value); };
    observer.observe(status, { childList: true, characterData: true, subtree: true });
    byId("start").click();
  });
}

async function stepOnce() {  // null, or the message of the step's refusal
  let refusal = null;
  waiting.error = (e) => { refusal = e.message; };
  await step();
  waiting.error = null;
  return refusal;
}
