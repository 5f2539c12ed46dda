// Section 3 of the lesson, Position: learned position vectors or RoPE's angles and what they do to
// attention (POST /explain/positions).

import { viewRequests } from "../api.js";
import { byId, debounce, errorLine, h, label, note, numberInput, onOpen, row } from "../dom.js";
import { fmt } from "../format.js";
import * as Plot from "../plot.js";

const { ask } = viewRequests();

export function build() {
  const count = numberInput("pos-count", 64, 2, 256, 1), distance = numberInput("pos-distance", 256, 1, 4096, 1);
  byId("lesson-position").append(
    note("Attention compares every token with every other at once, so by itself it cannot tell “dog bites man” " +
         "from “man bites dog”. The model has to be told where each token stands. How depends on the model:"),
    row(label("positions", count), h("span", { id: "pos-distance-box" }, label("distances up to", distance))),
    h("div", { id: "pos-view" }), errorLine("pos"));
  for (const input of [count, distance]) input.addEventListener("input", debounce(refreshPositions));
  let loaded = false;
  onOpen("sec-position", () => { if (!loaded) { loaded = true; refreshPositions(); } });
}

async function refreshPositions() {
  const value = (id) => Number(byId(id).value);
  const d = await ask("pos", "/explain/positions", { count: value("pos-count"), distance: value("pos-distance") });
  if (d) (d.kind === "learned" ? renderLearned : renderRope)(d);
}

function renderLearned(d) {
  byId("pos-distance-box").hidden = true;  // a learned table has no notion of distance to plot
  const map = h("div", { id: "pos-similarity", className: "half" }), scale = h("div");
  const view = byId("pos-view");
  view.dataset.kind = "learned";
  view.replaceChildren(
    h("h3", {}, "Learned position vectors (this model)"),
    note("This model was trained with a table of position vectors, one per place in the text, added to each " +
         "token's vector. Below: the cosine similarity of position i (row) with position j (column) for the first " +
         `${d.similarity.length} places. Neighbouring positions learn similar vectors (a bright band along the ` +
         "diagonal); far-apart ones differ. The table ends at the model's longest context: it has no row beyond it."),
    map, scale);
  Plot.heatmap(map, d.similarity, { max: 1, signed: true });
  Plot.legend(scale, { max: 1, signed: true, label: "cosine similarity of two position vectors" });
}

function renderRope(d) {
  byId("pos-distance-box").hidden = false;
  const pairs = d.frequencies.map((_, i) => d.angles.map((position) => position[i]));  // (pairs, positions)
  const angles = h("div", { id: "pos-angles" }), scale = h("div"), score = h("div", { id: "pos-score", className: "half" });
  const last = d.frequencies.length - 1, turn = (f) => fmt((2 * Math.PI) / f);
  const view = byId("pos-view");
  view.dataset.kind = "rope";
  view.replaceChildren(
    h("h3", {}, "Rotary position embedding, RoPE (this model)"),
    note("Nothing is added to the vectors. Instead each query and key is cut into pairs of numbers, and each pair " +
         "is turned by an angle: its position times the pair's speed. Pair 0 turns " +
         `${fmt(d.frequencies[0])} radians per position (a full turn every ${turn(d.frequencies[0])} positions); ` +
         `pair ${last} turns ${fmt(d.frequencies[last])} (a turn every ${turn(d.frequencies[last])}). ` +
         "The heatmap shows the angle of every pair (row) at every position (column), wrapping at a full turn."),
    angles, scale,
    h("h3", {}, "What the turning does to attention"),
    note("A dot product of two turned vectors depends only on the difference of their angles, that is on how " +
         "far apart the two tokens are, not on where they are. The line: the score q·k of a query and a key that " +
         "hold the same vector, d positions apart, as a share of the score at d = 0. It sinks and wobbles with " +
         "distance, so nearby tokens start with an advantage the model can learn to use or overcome."),
    score);
  Plot.heatmap(angles, pairs, { rowLabels: pairs.map((_, i) => `pair ${i}`), max: 2 * Math.PI, signed: false, label: 50 });
  Plot.legend(scale, { max: 2 * Math.PI, label: "angle turned (radians; 6.28 is a full turn)" });
  Plot.lines(score, [{ name: "q·k at distance d (share of d = 0)", points: d.score.map((s, i) => [i, s]) }],
             { xLabel: "distance d between query and key (positions)", yLabel: "q·k / q·q" });
}
