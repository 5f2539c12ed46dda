// Section 4b of the lesson, Mixture of experts: the MLP half of each layer. For a mixture-of-experts
// model, the router's choice at every step (the step's view.experts: per sparse layer the chosen
// experts, their weights and every expert's score) as a layers × experts grid, and why routing is
// fast in this model's own numbers (the session's model.moe). A dense model gets one sentence.
// What the grid shows is in data-* attributes a test reads: #moe-grid[data-node], tr[data-layer],
// td[data-expert][data-p] and, on the chosen cells, .chosen[data-weight].

import { on, state } from "../app.js";
import { byId, h, note } from "../dom.js";
import { bytes, count, quote } from "../format.js";

// share(0.25) "25%", share(0.0625) "6.25%": a share of the experts, without trailing zeros.
const share = (p) => `${Number((100 * p).toPrecision(3))}%`;

// How each kind of router (config.router, models/moe.py) turns its scores into k weights.
const ROUTERS = {
  softmax: (e, k, renormalised) => `a softmax turns the router's ${e} scores into probabilities, and the ${k} ` +
    `most likely experts are kept; their probabilities${renormalised ? `, rescaled to add up to 1,` : ""} are ` +
    "the weights",
  topk_softmax: (e, k) => `the ${k} experts with the highest of the router's ${e} scores are kept, and a ` +
    `softmax over those ${k} gives their weights`,
  sigmoid: (e, k) => `each of the ${e} experts gets a score between 0 and 1 (a sigmoid), the ${k} best are ` +
    "kept (among the best groups of experts), and their scores, rescaled, are the weights (Σ weights shows " +
    "what they add up to)",
};

export function build() {
  byId("lesson-experts").append(
    h("p", { id: "moe-kind" }), h("div", { id: "moe-about" }), h("p", { id: "moe-caption" }),
    h("div", { className: "scroll" }, h("table", { id: "moe-grid", className: "early moe" })));
  on("session", (data) => { renderModel(data.model); renderGrid(null); });
  on("step", renderGrid);
  on("goto", () => renderGrid(null));  // no step shown
}

function renderModel(model) {
  const kind = byId("moe-kind"), moe = model.moe;
  kind.dataset.kind = moe ? "moe" : "dense";
  if (!moe) {
    kind.textContent = "This model is dense: each layer has one MLP that every token goes through (no router, " +
      "no experts).";
    byId("moe-about").replaceChildren();
    return;
  }
  byId("sec-experts").open = true;  // the model's own routing is worth a look: shown from the start
  kind.textContent = `This model is a mixture of experts: ${moe.experts} experts in each of its ` +
    `${moe.sparse_layers} sparse layers${moe.dense_layers ? ` (and ${moe.dense_layers} dense layer` +
    `${moe.dense_layers > 1 ? "s" : ""} with one MLP)` : ""}, ${moe.experts_per_token} chosen for each token.`;
  byId("moe-about").replaceChildren(
    note("Each layer has two halves. Attention (section 4) lets each token gather what it needs from the " +
         "tokens before it; then an MLP works on each token on its own, and holds most of the model's weights. " +
         "In a mixture of experts that MLP is split into many smaller MLPs, the experts. For every token a " +
         "router (one small matrix) scores all the experts, only the best few are run, and the layer's output is " +
         "the sum of their outputs, each times the weight the router gave it. The next layer, and the next " +
         "token, may pick other experts."),
    h("p", { id: "moe-router" }, `Here ${ROUTERS[moe.router]?.(moe.experts, moe.experts_per_token,
                                                                moe.renormalised) ?? `the router is “${moe.router}”`}.`),
    h("h3", {}, "Why it is fast"), speed(moe));
}

// The model's numbers: total vs active parameters, and the share of the expert weights a token reads.
function speed(moe) {
  const always = moe.router_parameters + moe.shared + moe.dense;
  const parts = ["the routers", moe.shared ? "the shared experts" : null,
                 moe.dense ? "the dense layers' MLPs" : null].filter(Boolean).join(", ");
  const p = h("p", { id: "moe-speed", dataset: { total: moe.total, active: moe.active, share: moe.read_share } },
    "To produce a token, the computer reads every weight the token uses from memory, and that reading, more " +
    "than the arithmetic, sets the speed of a step. ",
    h("strong", {}, `This model reads ${moe.experts_per_token} of ${moe.experts} experts: ` +
                    `${share(moe.read_share)} of the expert weights per token.`),
    ` Its MLPs hold ${count(moe.total)} parameters, but one token uses ${count(moe.active)} of them ` +
    `(${share(moe.active / moe.total)}): ${count(moe.routed_active)} of the ${count(moe.routed)} in the ` +
    `experts, plus ${count(always)} that every token goes through (${parts}). The experts take ` +
    `${bytes(moe.expert_bytes)} of memory; a decode step (one new token) reads about ` +
    `${bytes(moe.read_bytes)} of them. That is how a model with many parameters can run at the speed of a ` +
    "much smaller one: it still needs the memory to hold them all.");
  return p;
}

function renderGrid(view) {
  const moe = state.model?.moe, grid = byId("moe-grid"), caption = byId("moe-caption");
  delete grid.dataset.node;
  if (!moe || !view || !view.experts) {
    grid.replaceChildren();
    caption.textContent = moe ? "Press Step: the grid shows the router's choice at each step." : "";
    return;
  }
  grid.dataset.node = view.node;
  const routed = new Map(view.experts.map((r) => [r.layer, r]));
  const header = h("tr", {}, h("th", {}, "layer"),
                   ...Array.from({ length: moe.experts }, (_, e) => h("th", { className: "num" }, String(e))),
                   h("th", { title: "the chosen experts' weights added up" }, "Σ weights"));
  const rows = Array.from({ length: state.model.layers }, (_, layer) => (routed.has(layer)
    ? layerRow(routed.get(layer))
    : h("tr", { className: "dense", dataset: { layer } }, h("th", {}, String(layer)),
        h("td", { colSpan: moe.experts + 1, className: "dim" }, "one dense MLP: every token goes through it"))));
  grid.replaceChildren(header, ...rows);
  const tokens = [...state.prompt, ...view.generated], read = tokens.at(-2);
  caption.textContent = `Step ${view.step.index + 1}: the router's choice for ${quote(read.text)} (the last token ` +
    `the model read), as it predicts ${quote(view.step.token_text)}. Per layer, the ${moe.experts_per_token} ` +
    "experts it chose (outlined, with their weights) and every expert's score (the darker, the higher; hover a " +
    "cell for its number). Step again and watch the choice change from token to token.";
}

// A sparse layer's row: every expert's cell shaded by its score, from the row's lowest (clear) to its
// highest (darkest: sigmoid scores lie close together), the chosen ones outlined and labelled with
// their weight.
function layerRow(r) {
  const weight = new Map(r.ids.map((id, j) => [id, r.weights[j]]));
  const low = Math.min(...r.probs), range = Math.max(...r.probs) - low || 1;
  const cells = r.probs.map((p, e) => {
    const chosen = weight.has(e), shade = (0.1 + 0.5 * (p - low) / range).toFixed(3);
    return h("td", {
      className: chosen ? "moe-cell chosen" : "moe-cell",
      dataset: chosen ? { expert: e, p, weight: weight.get(e) } : { expert: e, p },
      title: `expert ${e}: score ${p.toFixed(4)}` + (chosen ? `, chosen with weight ${weight.get(e).toFixed(4)}` : ""),
      style: `background: rgba(37, 99, 235, ${shade})`,
    }, chosen ? weight.get(e).toFixed(2) : "");
  });
  const total = r.weights.reduce((a, b) => a + b, 0);
  return h("tr", { dataset: { layer: r.layer } }, h("th", {}, String(r.layer)), ...cells,
           h("td", { className: "num" }, total.toFixed(2)));
}
