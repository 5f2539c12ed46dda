// Section 6 of the lesson, Logits → softmax: the step's raw scores beside its probabilities, the rule
// softmax follows, and the share of everything outside the table. From the step's own view.

import { on } from "../app.js";
import { byId, h, note, svgElement as s, svgRoot } from "../dom.js";
import { pct, quote, visible } from "../format.js";
import * as Plot from "../plot.js";

export function build() {
  byId("lesson-logits").append(
    h("h3", {}, "Raw scores beside probabilities"),
    note("The last layer gives every token of the vocabulary one score, its logit. Logits have no fixed range " +
         "and can be negative; only their differences count. Softmax turns them into probabilities: raise e to " +
         "each logit, then divide by the total over the whole vocabulary, so that they add up to 1. A lead of 1 " +
         "in logit makes a token e ≈ 2.7 times as likely, a lead of 2.3 ten times: small gaps in score become " +
         "large gaps in probability."),
    h("div", { id: "logit-bars", className: "late-plot" }), h("p", { id: "logit-ratio" }),
    h("h3", {}, "The top rows and everything else"),
    h("div", { id: "logit-mass", className: "late-plot" }), h("p", { id: "logit-rest" }));
  on("step", renderLogits);
  for (const event of ["session", "goto"]) on(event, clear);
}

function renderLogits(view) {
  const box = byId("logit-bars");
  box.dataset.node = view.node;
  logitBars(box, view.rows);
  ratio(view.rows);
  mass(view);
}

// One line per row: its logit as a bar from zero (left of zero when negative), its p as a bar.
function logitBars(container, rows) {
  const width = 560, line = 22, top = 20, name = 110, area = 150;
  const logits = rows.map((r) => r.logit), pmax = Math.max(...rows.map((r) => r.p), 1e-12);
  const lo = Math.min(0, ...logits), hi = Math.max(0, ...logits), span = hi - lo || 1;
  const zero = name + ((0 - lo) / span) * area, pStart = name + area + 70;
  const root = svgRoot(width, top + rows.length * line + 4);
  root.append(s("text", { x: name, y: 12, "font-size": 12, "font-weight": 600 }, "logit (raw score)"),
              s("text", { x: pStart, y: 12, "font-size": 12, "font-weight": 600 }, "p = softmax(logits)"),
              s("line", { x1: zero, y1: top, x2: zero, y2: top + rows.length * line, stroke: "#94a3b8" }));
  rows.forEach((r, k) => {
    const y = top + k * line, x = name + ((Math.min(r.logit, 0) - lo) / span) * area;
    const g = s("g", { class: "logit-row", "data-id": r.id, "data-logit": r.logit, "data-p": r.p });
    g.append(s("title", {}, `${visible(r.text)}: logit ${r.logit.toFixed(3)}, p ${pct(r.p)}`),
             s("text", { x: name - 6, y: y + 15, "text-anchor": "end", "font-size": 12, class: "tok" },
               visible(r.text)),
             s("rect", { x, y: y + 4, width: Math.max((Math.abs(r.logit) / span) * area, 1), height: line - 8,
                         fill: r.logit < 0 ? "#dc2626" : "#64748b", class: "logit" }),
             s("text", { x: name + area + 6, y: y + 15, "font-size": 11 }, r.logit.toFixed(2)),
             s("rect", { x: pStart, y: y + 4, width: Math.max((r.p / pmax) * area, 1), height: line - 8,
                         fill: "#2563eb", class: "prob" }),
             s("text", { x: pStart + area + 6, y: y + 15, "font-size": 11 }, pct(r.p)));
    root.append(g);
  });
  container.replaceChildren(root);
}

// The rule softmax follows, checked on the top two rows: p1 / p2 = e^(logit1 - logit2).
function ratio(rows) {
  const p = byId("logit-ratio");
  if (rows.length < 2) { p.textContent = ""; return; }
  const [a, b] = rows, gap = a.logit - b.logit;
  Object.assign(p.dataset, { gap, odds: a.p / b.p });
  p.textContent = `${quote(a.text)} leads ${quote(b.text)} by ${gap.toFixed(3)} in logit, so softmax makes it ` +
    `e^${gap.toFixed(3)} = ${Math.exp(gap).toFixed(3)} times as likely; the model's probabilities agree: ` +
    `${pct(a.p)} / ${pct(b.p)} = ${(a.p / b.p).toFixed(3)}.`;
}

function mass(view) {
  const { rows, rest } = view, top = rows.reduce((sum, r) => sum + r.p, 0);
  Plot.bar(byId("logit-mass"), [...rows.map((r) => ({ value: r.p, label: visible(r.text) })),
    { value: rest.p, label: "everything else", colour: "#cbd5e1" }]);
  const p = byId("logit-rest");
  Object.assign(p.dataset, { tokens: rest.tokens, p: rest.p });
  p.textContent = `The ${rows.length} rows of the table hold ${pct(top)} together; the other ` +
    `${rest.tokens.toLocaleString("en-US")} tokens of the vocabulary share the remaining ${pct(rest.p)}. ` +
    "Every one of them keeps a chance above zero until a sampling dial cuts it.";
}

function clear() {  // no step shown (a new session, or back at a node)
  for (const id of ["logit-bars", "logit-mass", "logit-ratio", "logit-rest"]) byId(id).replaceChildren();
}
