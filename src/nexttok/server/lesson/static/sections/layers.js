// Section 5 of the lesson, Layers (logit lens): what each layer would predict if the model stopped
// there (POST .../lens). A capture view (captures.js): fetched only while the section is open.

import { sessionPath } from "../api.js";
import { on, state } from "../app.js";
import { byId, errorLine, h, isOpen, note, onOpen } from "../dom.js";
import { pct, quote, visible } from "../format.js";
import * as Plot from "../plot.js";
import { askCached, withNode } from "./captures.js";

export function build() {
  byId("lesson-layers").append(
    note("The vector of the last token passes through the layers one after another; each adds its part. The " +
         "lens stops the model after each layer and applies the final norm and the output matrix to the vector " +
         "as it is there: what would the model predict if it ended at this layer? Layer 0 is the embedding " +
         "alone; the last row is the model's real prediction (the top of the table in section 6)."),
    h("p", { id: "lens-title" }),
    h("div", { className: "scroll" }, h("table", { id: "lens-table", className: "early lens" })),
    h("div", { id: "lens-plot", className: "half" }), h("p", { id: "lens-summary" }), errorLine("lens"));
  onOpen("sec-layers", refreshLens);
  for (const event of ["session", "step", "goto"]) on(event, refreshLens);
}

async function refreshLens() {
  if (!isOpen("sec-layers") || !state.session) return;
  const d = await askCached("lens", sessionPath(state.session, "lens"), withNode({ top_n: 5 }));
  if (d) renderLens(d);
}

function renderLens(d) {
  const final = quote(d.final.text), last = d.layers.length - 1;
  byId("lens-title").textContent = `After ${quote(d.tokens[d.position].text)} (position ${d.position}): ` +
    `the model's own pick is ${final}.`;
  const table = byId("lens-table");
  Object.assign(table.dataset, { node: d.node, position: d.position, final: d.final.id });
  const header = h("tr", {}, h("th", {}, "layer"), ...d.layers[0].top.map((_, r) => h("th", {}, `top ${r + 1}`)),
                   h("th", {}, `p(${final})`), h("th", {}, "its rank"));
  const name = (l) => (l === 0 ? "0 embeddings" : l === last ? `${l} output` : String(l));
  table.replaceChildren(header, ...d.layers.map((l) => h("tr", {
    dataset: { layer: l.layer, finalP: l.final_p, finalRank: l.final_rank } },
  h("th", {}, name(l.layer)), ...l.top.map((t) => lensCell(t, d.final.id)),
  h("td", { className: "num" }, pct(l.final_p)), h("td", { className: "num" }, String(l.final_rank)))));
  const points = d.layers.map((l) => [l.layer, 100 * l.final_p]);  // percent: short tick labels
  Plot.lines(byId("lens-plot"), [{ name: `p(${final}) in %`, points }],
             { xLabel: "layer (0 = embeddings)", yLabel: "p (%)", yMin: 0 });
  lensSummary(d);
}

function lensCell(t, finalId) {
  return h("td", { className: t.id === finalId ? "lens-cell final" : "lens-cell", dataset: { id: t.id, p: t.p },
                   style: `background: rgba(37, 99, 235, ${(0.6 * t.p).toFixed(3)})` },
           h("span", { className: "tok" }, visible(t.text)), " ", h("small", {}, pct(t.p)));
}

function lensSummary(d) {
  const start = d.layers[0], last = d.layers.at(-1), first = d.layers.find((l) => l.final_rank === 1) ?? last;
  const rise = first.layer === last.layer ? "only wins at the last layer" : `first reaches rank 1 at layer ${first.layer}`;
  byId("lens-summary").textContent = `${quote(d.final.text)} starts at rank ${start.final_rank} ` +
    `(p ${pct(start.final_p)}) after the embeddings, ${rise}, and ends with p ${pct(last.final_p)}.`;
}
