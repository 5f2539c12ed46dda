// Section 2 of the lesson, Embeddings: a word's vector and its nearest neighbours, and a map of words
// (POST /explain/embeddings, /explain/embeddings/map). The model's matrix does not change, so the
// views load once, when the section is first opened.

import { viewRequests } from "../api.js";
import { byId, debounce, errorLine, h, label, note, numberInput, onOpen, row } from "../dom.js";
import { fmt, pct, quote, visible } from "../format.js";
import * as Plot from "../plot.js";

const { refuse, ask } = viewRequests();

const WORDS = "king, queen, prince, princess, apple, banana, orange, car, truck, road";

export function build() {
  const word = h("input", { id: "emb-word", type: "text", value: "king", size: 14 });
  const k = numberInput("emb-k", 10, 1, 50, 1);
  const list = h("textarea", { id: "emb-words", rows: 2, value: WORDS });
  byId("lesson-embeddings").append(
    note("An id becomes a vector by looking up one row of the model's embedding matrix, learned in training. " +
         "Words used in similar places end up pointing in similar directions; cosine similarity measures that " +
         "(1: the same direction, 0: unrelated, −1: opposite). All numbers below are this model's own rows."),
    h("h3", {}, "One word's vector and its nearest neighbours"), row(label("word", word), label("neighbours", k)),
    h("p", { id: "emb-facts" }), h("div", { id: "emb-vector", className: "strip" }),
    h("div", { className: "scroll" }, h("table", { id: "emb-neighbors", className: "early" })), errorLine("emb"),
    h("h3", {}, "A map of words"), label("words, separated by commas (3 to 40)", list),
    h("div", { id: "emb-map", className: "half" }), note("", "emb-explained"),
    h("div", { id: "emb-cosine", className: "half" }), h("div", { id: "emb-scale" }), h("p", { id: "emb-compare" }),
    errorLine("map"));
  for (const input of [word, k]) input.addEventListener("input", debounce(refreshVector));
  list.addEventListener("input", debounce(refreshMap));
  let loaded = false;  // the model's matrix does not change: the first opening loads both views
  onOpen("sec-embeddings", () => { if (!loaded) { loaded = true; refreshVector(); refreshMap(); } });
}

async function refreshVector() {
  const word = byId("emb-word").value.trim();
  if (!word) return refuse("emb", "type a word");
  const d = await ask("emb", "/explain/embeddings", { word, k: Number(byId("emb-k").value) });
  if (!d) return;
  renderVector(d);
  renderNeighbors(d);
}

function renderVector(d) {
  const pieces = d.pieces.map((p) => `${quote(p.text)} (id ${p.id})`).join(" + ");
  const facts = byId("emb-facts");
  Object.assign(facts.dataset, { dimensions: d.dimensions, norm: d.norm, ids: JSON.stringify(d.pieces.map((p) => p.id)) });
  facts.textContent = `“${d.word}” → ${pieces}. ` +
    (d.pieces.length > 1 ? `Its ${d.pieces.length} pieces' rows are averaged into one vector. ` : "") +
    `The vector has ${d.dimensions} numbers (length ${fmt(d.norm)}); the first ${d.vector.length}:`;
  const box = byId("emb-vector");
  box.dataset.values = JSON.stringify(d.vector);
  const strip = h("div");
  box.replaceChildren(h("div", { className: "vec wrap" }, d.vector.map(fmt).join("  ")), strip);
  Plot.heatmap(strip, [d.vector], { cell: 22, signed: true });
  strip.append(h("small", { className: "dim" }, "blue: above 0, red: below 0"));
}

function renderNeighbors(d) {
  const header = h("tr", {}, ...["#", "token", "id", "cosine", ""].map((t) => h("th", {}, t)));
  const rows = d.neighbors.map((n, i) => h("tr", { dataset: { id: n.id, cosine: n.cosine } },
    h("td", { className: "num" }, String(i + 1)), h("td", { className: "tok" }, visible(n.text)),
    h("td", { className: "num" }, String(n.id)), h("td", { className: "num" }, n.cosine.toFixed(3)),
    h("td", {}, h("div", { className: "bar", style: `width: ${Math.round(Math.max(0, n.cosine) * 120)}px` }))));
  const caption = h("caption", {}, `The ${d.neighbors.length} rows of the matrix nearest “${d.word}” (its own pieces left out)`);
  byId("emb-neighbors").replaceChildren(caption, header, ...rows);
}

async function refreshMap() {
  const words = byId("emb-words").value.split(/[,\n]/).map((w) => w.trim()).filter(Boolean);
  if (words.length < 3 || words.length > 40) return refuse("map", `the map needs 3 to 40 words, got ${words.length}`);
  const d = await ask("map", "/explain/embeddings/map", { words });
  if (d) renderMap(d);
}

function renderMap(d) {
  Plot.scatter(byId("emb-map"), d.words.map((w, i) => ({ x: d.points[i][0], y: d.points[i][1], label: w })),
               { xLabel: `across: the direction of the most spread (${pct(d.explained[0])})` });
  const explained = byId("emb-explained");
  explained.dataset.explained = JSON.stringify(d.explained);
  explained.textContent = "The map flattens the vectors onto the " +
    `two directions along which these words differ most (PCA): across holds ${pct(d.explained[0])} of the spread, ` +
    `up ${pct(d.explained[1])}. The rest is hidden, so the cosine table below is the truer picture.`;
  Plot.heatmap(byId("emb-cosine"), d.cosine, { rowLabels: d.words, colLabels: d.words, max: 1, signed: true, label: 70 });
  Plot.legend(byId("emb-scale"), { max: 1, signed: true, label: "cosine similarity" });
  compare(d);
}

// The first word against the rest of the list, in words, from the route's cosines.
function compare(d) {
  const [first, ...rest] = d.words.map((w, j) => ({ w, c: d.cosine[0][j] }));
  const nearest = rest.reduce((a, b) => (b.c > a.c ? b : a));
  const farthest = rest.reduce((a, b) => (b.c < a.c ? b : a));
  const p = byId("emb-compare");
  Object.assign(p.dataset, { word: first.w, nearest: nearest.w, farthest: farthest.w,
                             nearestCosine: nearest.c, farthestCosine: farthest.c });
  p.textContent = `In this model cosine(${first.w}, ${nearest.w}) = ${nearest.c.toFixed(3)}, the nearest word to ` +
    `${first.w} in the list, and cosine(${first.w}, ${farthest.w}) = ${farthest.c.toFixed(3)}, the farthest. ` +
    "A well-trained model puts a royal title near another and a fruit far from both.";
}
