// Section 7 of the lesson, Sampling: the draw on the cumulative bar of the tokens the chain kept, and
// where the step's u lands. From the step's view, the redraws of moved dials, and (after a branch)
// a redraw of the chain's own pick (POST .../redraw).

import { sessionPath, viewRequests } from "../api.js";
import { dials, on, state, tokenText } from "../app.js";
import { byId, errorLine, h, note } from "../dom.js";
import { pct, quote, visible } from "../format.js";
import * as Plot from "../plot.js";

const { nextTicket, ask } = viewRequests();

const draw = { branch: null };  // the id of a table row just clicked: that step's token was chosen, not drawn

export function build() {
  byId("lesson-sampling").append(
    h("h3", {}, "The draw on the cumulative bar"),
    note("After the chain, the tokens it kept are lined up from most to least likely and laid end to end " +
         "along a line from 0 to 1, each as long as its probability. The sampler draws one random number u, " +
         "evenly spread between 0 and 1, and takes the token whose stretch u falls into. Likely tokens own long " +
         "stretches and are hit often; a cut token owns none. At temperature 0 nothing is drawn: the top token " +
         "is taken. (Tokens outside the table are drawn as one block at the end; with penalties on, one of them " +
         "may really sit earlier in the line.)"),
    h("div", { id: "draw-bar", className: "late-plot" }), h("p", { id: "draw-note" }),
    h("div", { className: "scroll" }, h("table", { id: "draw-table", className: "late" })), errorLine("draw"));
  byId("table").addEventListener("click", (event) => {  // capture: runs before app.js starts the step
    const tr = event.target.closest("tr[data-id]");
    if (tr && !tr.classList.contains("chosen")) draw.branch = Number(tr.dataset.id);
  }, true);
  on("step", drawOfStep);
  on("redraw", (drawn) => { nextTicket("draw"); renderDraw(drawn, state.view.step.token_id); });
  for (const event of ["session", "goto"]) on(event, clear);
}

// The segments in the sampler's order: kept rows by q, then the kept tokens outside the table.
function drawSegments(d) {
  const kept = d.rows.filter((r) => r.q > 0).sort((a, b) => b.q - a.q);
  const segments = kept.map((r) => ({ id: r.id, q: r.q, label: visible(r.text) }));
  const others = d.rest.kept - kept.length;
  if (others > 0 && d.rest.q > 0) segments.push({ id: null, q: d.rest.q, label: `everything else (${others} tokens)` });
  let start = 0;
  for (const segment of segments) { segment.start = start; start += segment.q; }
  return segments;
}

async function drawOfStep(view) {
  const forced = draw.branch !== null && view.step.token_id === draw.branch;
  draw.branch = null;
  if (!forced) { nextTicket("draw"); renderDraw(view, view.step.token_id); return; }
  // a clicked row continued the text with its token; the chain's own pick comes from a redraw
  const d = await ask("draw", sessionPath(state.session, "redraw"),
                      { ...dials(), node: view.node, top_n: view.rows.length });
  if (d && state.view === view) renderDraw(d, view.step.token_id);
}

function renderDraw(d, continued) {
  const segments = drawSegments(d), u = d.step.draw, picked = d.step.token_id;
  const hit = segments.find((g) => g.id === picked) ?? segments.find((g) => g.id === null) ?? null;
  const box = byId("draw-bar");
  Object.assign(box.dataset, { node: d.node, draw: u ?? "", picked, ids: JSON.stringify(segments.map((g) => g.id)) });
  const colour = (g) => (g === hit ? "#f59e0b" : g.id === null ? "#cbd5e1" : undefined);
  Plot.bar(box, segments.map((g) => ({ value: g.q, label: g.label, colour: colour(g) })),
           u === null ? {} : { mark: u, markLabel: `u=${u.toFixed(2)}` });
  byId("draw-table").replaceChildren(
    h("tr", {}, ...["token", "after dials", "from", "to"].map((t) => h("th", {}, t))),
    ...segments.map((g) => h("tr", { className: g === hit ? "hit" : "", dataset: { id: g.id ?? "rest", q: g.q } },
      h("td", { className: "tok" }, g.label), h("td", { className: "num" }, pct(g.q)),
      h("td", { className: "num" }, g.start.toFixed(4)), h("td", { className: "num" }, (g.start + g.q).toFixed(4)))));
  const name = quote(tokenText(picked));
  const said = u === null
    ? `Temperature 0: no number is drawn, the most likely token ${name} is taken, every time.`
    : `u = ${u.toFixed(4)} picks ${name}` + (hit ? `: it lands in ${hit.id === null ? "the block of tokens outside " +
      "the table" : "its stretch"}, from ${hit.start.toFixed(4)} to ${(hit.start + hit.q).toFixed(4)}` : "") +
      `. The chain kept ${d.rest.kept.toLocaleString("en-US")} tokens.`;
  const other = continued !== picked ? ` The text itself went on with ${quote(tokenText(continued))}.` : "";
  byId("draw-note").textContent = said + other;
}

function clear() {  // no step shown (a new session, or back at a node)
  for (const id of ["draw-bar", "draw-note", "draw-table"]) byId(id).replaceChildren();
}
