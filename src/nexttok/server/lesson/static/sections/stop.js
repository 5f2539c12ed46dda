// Section 9 of the lesson, Stop: the stop tokens' probability at every step of the path (onPath of
// section 8), and why generation ended or would end.

import { on, tokenText } from "../app.js";
import { byId, h, note } from "../dom.js";
import { pct, quote } from "../format.js";
import * as Plot from "../plot.js";
import { onPath } from "./loop.js";

export function build() {
  byId("lesson-stop").append(
    note("A model learns to end a text with special stop tokens (end of text, end of turn). To the model they " +
         "are tokens like any other: each step gives them a probability. When the draw picks one, the engine " +
         "stops and reports finish_reason “stop”. A text also ends when it reaches the max_tokens cap the " +
         "caller sets (finish_reason “length”), or when the context window is full."),
    h("p", { id: "stop-tokens" }), h("div", { id: "stop-plot", className: "late-plot" }), h("p", { id: "stop-reason" }));
  on("step", renderStop);
  for (const event of ["session", "goto"]) {  // no step shown: the plot of the path so far, no reason
    on(event, () => { byId("stop-reason").replaceChildren(); renderStop(null); });
  }
}

function renderStop(view) {
  const loops = onPath(), plot = byId("stop-plot");
  plot.dataset.p = JSON.stringify(loops.map((r) => r.stop));
  if (loops.length) {  // in percent: short tick labels even when the chance is tiny
    Plot.lines(plot, [{ name: "p(stop) in %", points: loops.map((r) => [r.index + 1, 100 * r.stop]) }],
               { xLabel: "step", yLabel: "p(stop) in %", yMin: 0 });
  } else plot.replaceChildren();
  if (!view) return;
  const ids = view.stop.ids;
  byId("stop-tokens").textContent = ids.length
    ? `This model's stop token${ids.length > 1 ? "s" : ""}: ${ids.map((i) => `${quote(tokenText(i))} (id ${i})`).join(", ")}. ` +
      `The line: the chance of stopping at each step of this text (now ${pct(view.stop.p)}).`
    : "This model names no stop token: its texts end only at a length cap or a full window.";
  reason(view);
}

function reason(view) {
  const p = byId("stop-reason"), { used, limit } = view.context, token = quote(view.step.token_text);
  p.dataset.reason = view.stop.reason ?? "";
  p.textContent = view.stop.reason === "stop"
    ? `Ended: the step drew ${token}, a stop token. An engine stops here and answers finish_reason “stop”.`
    : view.stop.reason === "length"
      ? `Ended: ${used} of ${limit} tokens, the context window is full (finish_reason “length”).`
      : `Not ended: ${token} is not a stop token and the window has room for ${limit - 1 - used} more. The text ` +
        "goes on until a stop token is drawn, the caller's max_tokens is reached, or the window fills.";
}
