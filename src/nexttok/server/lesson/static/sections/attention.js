// Section 4 of the lesson, Attention: the T x T matrix of a layer and head (or the server's mean over
// the heads), one row of it, and one head worked by hand (POST .../attention, .../attention/detail).
// Both are capture views (captures.js): fetched only while the section is open. Layers go by the
// model's own index and type: a sliding-window layer's matrix marks the window's edge (keys older
// than the window get no weight), and a recurrent layer has no matrix but a state of fixed size.
// What is shown is in data-* attributes a test reads: #att-matrix[data-layer][data-kind][data-window],
// its path.window-edge[data-window], #att-kind[data-kind] (and data-numbers for a state).

import { sessionPath } from "../api.js";
import { on, state } from "../app.js";
import { byId, errorLine, h, isOpen, label, note, onOpen, row } from "../dom.js";
import { fmt, kindName, layerLabel, pct, quote, stateWords, visible } from "../format.js";
import * as Plot from "../plot.js";
import { askCached, withNode } from "./captures.js";

const SHOWN_DIMS = 8;  // numbers shown per vector in the worked attention: enough to follow by eye

const PRESETS = ["The animal didn't cross the street because it was too tired",
                 "The trophy didn't fit in the suitcase because it was too big",
                 "Sarah put the laptop in the bag because it was heavy"];
const att = { matrix: null, query: null, pronoun: null };  // query null: the last row, as the text grows

export function build() {
  const layer = h("select", { id: "att-layer" }), head = h("select", { id: "att-head" });
  const preset = h("select", { id: "att-preset" }, h("option", { value: "" }, "a sentence with a pronoun…"),
                   ...PRESETS.map((s) => h("option", { value: s }, s)));
  byId("lesson-attention").append(
    h("h3", {}, "Every position at once ", h("span", { className: "dim" }, "(click a token or a cell to see its row)")),
    note("Row i is token i looking back: its weights over itself and every earlier token add up to 1. Later " +
         "tokens stay blank, because a token may not look ahead. Each head learns its own way of looking; " +
         "“mean” averages the heads of a layer."),
    row(label("layer", layer), label("head", head), label("start with", preset)),
    note("Layers differ in how far back they look. A full-attention layer sees every earlier token. A " +
         "sliding-window layer sees only the last few (its window): older keys get no weight, and the engine " +
         "need not keep them. A recurrent layer, such as a short convolution, has no attention at all: it " +
         "folds each token into a state of fixed size. The layer menu names each layer's type."),
    h("p", { id: "att-kind" }),
    h("div", { id: "att-matrix", className: "matrix" }), h("div", { id: "att-scale" }),
    h("p", { id: "att-row-title" }), h("div", { id: "att-row", className: "pieces" }), errorLine("att"),
    h("h3", {}, "One head worked by hand"),
    note("The chosen token's query q is compared with the key k of every token it may see: the dot product " +
         "q·k, divided by √d so the scores do not grow with the vectors' size d. Softmax turns the scores into " +
         "weights that add up to 1 (the same as the model's own weights, next column). The head's output is " +
         "the weighted sum of the values v: mostly the values of the tokens it weighs most."),
    note("", "att-detail-note"), h("div", { id: "att-detail" }), errorLine("detail"));
  layer.addEventListener("change", refreshMatrix);
  head.addEventListener("change", refreshMatrix);
  preset.addEventListener("change", () => startPreset(preset));
  onOpen("sec-attention", refreshMatrix);
  on("session", (data) => {
    att.query = null;
    fillSelectors(data.model);
    refreshMatrix();
  });
  on("step", refreshMatrix);
  on("goto", refreshMatrix);
}

function fillSelectors(model) {
  const options = (n) => Array.from({ length: n }, (_, i) => h("option", { value: String(i) }, String(i)));
  const keep = (select, fresh) => {
    const before = select.value;
    select.replaceChildren(...fresh);
    if ([...select.options].some((o) => o.value === before)) select.value = before;
  };
  keep(byId("att-layer"), model.layer_types.map((l) => h("option", { value: String(l.layer) }, layerLabel(l))));
  keep(byId("att-head"), [h("option", { value: "mean" }, "mean"), ...options(model.heads)]);
}

// A preset starts a new session the way the Start button does, so every section follows it.
function startPreset(select) {
  if (!select.value) return;
  byId("prompt").value = select.value;
  att.pronoun = "it";  // once the matrix is in, show the pronoun's row
  select.value = "";
  byId("start").click();
}

const chosenHead = () => (byId("att-head").value === "mean" ? null : Number(byId("att-head").value));

async function refreshMatrix() {
  if (!isOpen("sec-attention") || !state.session || byId("att-layer").value === "") return;
  const body = withNode({ layer: Number(byId("att-layer").value), head: chosenHead() });
  const d = await askCached("att", sessionPath(state.session, "attention"), body);
  if (d) renderMatrix(d);
}

function renderMatrix(d) {
  att.matrix = d;
  const labels = d.tokens.map((t) => visible(t.text));
  const box = byId("att-matrix");
  Object.assign(box.dataset, { node: d.node, layer: d.layer, head: d.head ?? "mean", kind: d.kind,
                               window: d.window ?? "", tokens: JSON.stringify(d.tokens.map((t) => t.id)) });
  renderKind(d);
  if (d.recurrent) {  // no weights: nothing to draw, no row, no head to work by hand
    box.replaceChildren();
    for (const id of ["att-scale", "att-row", "att-detail"]) byId(id).replaceChildren();
    for (const id of ["att-row-title", "att-detail-note"]) byId(id).textContent = "";
    return;
  }
  const svg = Plot.heatmap(box, d.weights, { rowLabels: labels, colLabels: labels, max: 1, onCell: (i) => choose(i),
                                             window: d.window ?? undefined });
  box.style.maxWidth = `${Math.round(svg.viewBox.baseVal.width * 1.5)}px`;  // a short text needs no full-width map
  svg.addEventListener("click", (event) => {  // a token's label names its row too (rows and columns alike)
    const { row: i, col: j } = event.target.dataset ?? {};
    if (event.target.tagName === "text" && (i ?? j) !== undefined) choose(Number(i ?? j));
  });
  Plot.legend(byId("att-scale"), { max: 1, label: "attention weight" });
  if (att.pronoun) {
    const found = d.tokens.findLastIndex((t) => t.text.trim().toLowerCase() === att.pronoun);
    att.pronoun = null;
    if (found >= 0) att.query = found;
  }
  const last = d.tokens.length - 1;
  choose(att.query === null || att.query > last ? last : att.query);
}

// One line on the chosen layer's type: what it looks at, or (a recurrent layer) what it keeps.
function renderKind(d) {
  const p = byId("att-kind");
  Object.assign(p.dataset, { layer: d.layer, kind: d.kind, window: d.window ?? "",
                             numbers: d.recurrent ? d.state.numbers : "" });
  if (d.recurrent) {
    p.replaceChildren(h("strong", {}, `Layer ${d.layer}: ${stateWords(d)}.`),
      " It has no attention weights to show: it keeps no keys, only that state, which each new token " +
      `updates in place (${d.state.bytes.toLocaleString("en-US")} bytes, whether the text is 10 tokens long or 100,000).`);
  } else if (d.window) {
    p.replaceChildren(h("strong", {}, `Layer ${d.layer}: ${kindName(d.kind)}, window ${d.window}.`),
      ` Each token sees itself and the ${d.window - 1} tokens before it. Keys left of the line are older ` +
      "than the window: they get no weight, and generation does not keep them.");
  } else {
    p.replaceChildren(h("strong", {}, `Layer ${d.layer}: ${kindName(d.kind)}.`),
      " Each token may look at every earlier token, so this layer keeps the keys of the whole text.");
  }
}

function choose(i) {
  const d = att.matrix, last = d.tokens.length - 1;
  att.query = i === last ? null : i;
  const box = byId("att-matrix");
  for (const el of box.querySelectorAll(".selected")) el.classList.remove("selected");
  for (const el of box.querySelectorAll(`.cell[data-row="${i}"], .row-label[data-row="${i}"]`)) el.classList.add("selected");
  renderRow(d, i);
  refreshDetail(i);
}

function renderRow(d, i) {
  const weights = d.weights[i].slice(0, i + 1), top = Math.max(...weights);
  byId("att-row-title").textContent = `Row ${i}: where ${quote(d.tokens[i].text)} looks ` +
    `(layer ${d.layer}, ${d.head === null ? "mean of the heads" : `head ${d.head}`}).`;
  const box = byId("att-row");
  box.dataset.query = i;
  box.replaceChildren(...d.tokens.slice(0, i + 1).map((t, j) => h("span", {
    className: weights[j] === top ? "piece att-key strongest" : "piece att-key",
    style: `background: rgba(37, 99, 235, ${(0.6 * weights[j] / top).toFixed(3)})`,
    dataset: { key: j, weight: weights[j] } },
  h("span", { className: "piece-text" }, visible(t.text)), h("small", {}, pct(weights[j])))));
}

async function refreshDetail(query) {
  if (!isOpen("sec-attention")) return;
  const head = chosenHead() ?? 0;  // the mean of the heads has no q of its own: head 0 stands in
  const d = await askCached("detail", sessionPath(state.session, "attention/detail"),
                            withNode({ layer: Number(byId("att-layer").value), head, query }));
  if (d && !att.matrix?.recurrent) renderDetail(d, chosenHead() === null);
}

// Two small tables, in the order of the computation: scores and softmax, then the weighted sum.
function renderDetail(d, forMean) {
  const shown = Math.min(SHOWN_DIMS, d.head_dim), cut = (v) => v.slice(0, SHOWN_DIMS);
  const vec = (v) => h("span", { className: "vec" }, cut(v).map(fmt).join(" ") + (v.length > SHOWN_DIMS ? " …" : ""));
  const token = (j) => h("td", { className: "tok" }, visible(d.tokens[j].text));
  const th = (...names) => h("tr", {}, ...names.map((t) => h("th", {}, t)));
  byId("att-detail-note").textContent = `Query ${quote(d.tokens[d.query].text)} (position ${d.query}), layer ` +
    `${d.layer}, head ${d.head}${forMean ? " (the mean has no q of its own, so head 0 is worked out)" : ""}. ` +
    `Each vector has d = ${d.head_dim} numbers, √d = ${fmt(d.scale)}; the first ${shown} are shown (the dot ` +
    "products use all of them).";
  const box = byId("att-detail");
  Object.assign(box.dataset, { node: d.node, layer: d.layer, head: d.head, query: d.query, first: d.first,
                               q: JSON.stringify(cut(d.q)), output: JSON.stringify(cut(d.output)) });
  const keys = d.keys.map((k, r) => h("tr", {
    dataset: { key: d.first + r, score: d.scores[r], weight: d.weights[r], modelWeight: d.model_weights[r],
               k: JSON.stringify(cut(k)) } },
  h("td", { className: "num" }, String(d.first + r)), token(d.first + r), h("td", { className: "num" }, fmt(d.scores[r])),
  h("td", { className: "num" }, pct(d.weights[r])), h("td", { className: "num" }, pct(d.model_weights[r])),
  h("td", {}, vec(k))));
  const values = d.values.map((v, r) => h("tr", { dataset: { key: d.first + r, v: JSON.stringify(cut(v)) } },
    h("td", { className: "num" }, String(d.first + r)), token(d.first + r),
    h("td", { className: "num" }, pct(d.weights[r])), h("td", {}, vec(v))));
  box.replaceChildren(
    h("div", { className: "scroll tall" }, h("table", { id: "att-scores", className: "early detail" },
      h("caption", {}, "1. scores and softmax"), th("key", "token", "q·k/√d", "softmax", "model's weight", `k (first ${shown})`),
      h("tr", { className: "q" }, h("th", {}, "q"), token(d.query), h("td", { colSpan: 3 }), h("td", {}, vec(d.q))),
      ...keys)),
    h("div", { className: "scroll tall" }, h("table", { id: "att-values", className: "early detail" },
      h("caption", {}, "2. the weighted sum of the values"), th("key", "token", "softmax", `v (first ${shown})`),
      ...values,
      h("tr", { className: "out" }, h("th", { colSpan: 3 }, "output = Σ softmax × v"), h("td", {}, vec(d.output))))));
}
