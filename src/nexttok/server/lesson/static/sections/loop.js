// Section 8 of the lesson, Loop and KV cache: the input of each loop on the path to the current node
// (what came from the cache, what went through the model), its time, and the cache's bytes: this
// session's cache, and what generation's cache holds per layer type (full, sliding window,
// recurrent) now and at the model's whole context, beside a cache of every layer full (the step's
// cache.held and cache.full_context). Kept from the step views as they come; onPath() serves
// section 9 too. #cache-types tr[data-type] carries each row's bytes (data-now, data-full-context).

import { on, state } from "../app.js";
import { byId, h, note, tokenChip as chip } from "../dom.js";
import { bytes, kindName, stateKept } from "../format.js";
import * as Plot from "../plot.js";

const LOOPS_SHOWN = 12;  // loops listed (the newest); the plots keep every step
const TOKENS_SHOWN = 12;  // tokens of one loop's input drawn as chips; older ones are counted

const history = new Map();  // child node -> what the loop that made it did
const path = { tree: [], current: 0 };

export function build() {
  const toggle = h("input", { type: "checkbox", id: "loop-nocache", checked: !state.useCache });
  toggle.addEventListener("change", () => { state.useCache = !toggle.checked; });
  byId("lesson-loop").append(
    h("h3", {}, "The input grows one token per loop"),
    note("Each loop runs the model on the text so far and appends the token it picked; the next loop reads " +
         "that longer text. Attention needs the key and value vectors of every earlier token in every attention " +
         "layer. " +
         "Those never change once computed, so the engine keeps them, the KV cache, and each loop feeds only " +
         "the newest token through the model. The first loop, the prefill, feeds the whole prompt at once. " +
         "Faded chips come from the cache; solid ones went through the model in that loop."),
    h("ol", { id: "loop-list" }), h("p", { id: "loop-cache" }),
    h("h3", {}, "What each kind of layer keeps"),
    h("div", { className: "scroll" }, h("table", { id: "cache-types", className: "late" })),
    h("p", { id: "cache-summary" }),
    note("Why some models keep long texts cheaply: a full-attention layer must keep a key and a value for " +
         "every token it has seen, so its memory grows in step with the text. A sliding-window layer only ever" +
         " looks at its last few thousand tokens (its window: 4,096 in Mistral 7B), so the keys that fall out " +
         "of the window can be dropped: past that length its memory stops growing. A recurrent layer keeps no " +
         "keys at all; it folds each token into a state of fixed size, so it costs the same at ten tokens as " +
         "at a hundred thousand. Hybrid models mix these: a few full-attention layers still let any token " +
         "reach any earlier one, while the many windowed or recurrent layers add almost nothing as the text " +
         "grows. At long contexts that is the difference between a cache that fits beside the weights and one " +
         "that outgrows them.",
         "cache-why"),
    h("label", { className: "switch" }, toggle, " run without the KV cache (every loop feeds the whole text again)"),
    h("div", { id: "loop-times", className: "late-plot" }), note("", "loop-times-note"));
  on("session", (data) => {
    history.clear();
    Object.assign(path, { tree: data.tree, current: 0 });
    renderLoop();
    for (const id of ["loop-cache", "cache-types", "cache-summary"]) byId(id).replaceChildren();
  });
  on("step", (view) => {
    record(view);
    Object.assign(path, { tree: view.tree, current: view.current });
    renderLoop();
    renderCache(view);
    renderTypes(view.cache);
  });
  on("goto", (view) => {
    Object.assign(path, { tree: view.tree, current: view.current });
    renderLoop();
  });
}

function record(view) {
  const context = [...state.prompt, ...view.generated.slice(0, -1)];
  history.set(view.child, { node: view.node, index: view.step.index, timing: view.timing, stop: view.stop.p,
                            context, fed: context.slice(context.length - view.timing.tokens),
                            token: view.generated.at(-1) });
}

export function onPath() {  // the records of the loops from the prompt down to the current node, in order
  const nodes = new Map(path.tree.map((n) => [n.id, n])), found = [];
  for (let n = nodes.get(path.current); n && n.parent !== null; n = nodes.get(n.parent)) {
    if (history.has(n.id)) found.push({ child: n.id, ...history.get(n.id) });
  }
  return found.reverse();
}

function renderLoop() {
  const loops = onPath();
  byId("loop-list").replaceChildren(...loops.slice(-LOOPS_SHOWN).map(loopItem));
  byId("loop-list").start = Math.max(1, loops.length - LOOPS_SHOWN + 1);
  const series = [["with the KV cache", (r) => r.timing.cached !== false, Plot.PALETTE[0]],
                  ["without the KV cache", (r) => r.timing.cached === false, Plot.PALETTE[1]]]
    .map(([name, keep, colour]) => ({ name, colour, points: loops.filter(keep).map((r) => [r.index + 1, r.timing.seconds * 1000]) }))
    .filter((serie) => serie.points.length);
  const box = byId("loop-times");
  if (!series.length) { box.replaceChildren(); byId("loop-times-note").textContent = ""; return; }
  Plot.lines(box, series, { xLabel: "step", yLabel: "ms per step", yMin: 0 });
  byId("loop-times-note").textContent = "Time the model took per step. With the cache a step costs about the " +
    "same however long the text is; without it every step pushes all earlier tokens through every layer again, " +
    "so its time climbs as the text grows (most clearly on long texts: short ones hide behind the fixed cost of " +
    "reading the weights).";
}

function loopItem(r) {
  const from = r.context.length - r.fed.length, shown = r.context.slice(-TOKENS_SHOWN);
  const older = r.context.length - shown.length;
  const chips = shown.map((t, i) => chip(t, older + i < from ? "cached" : "fed"));
  const words = r.index === 0 && from === 0 ? `prefill: the whole prompt, ${r.fed.length} tokens`
    : from === 0 ? `no cache: all ${r.fed.length} tokens again` : `${from} from the cache, ${r.fed.length} new`;
  return h("li", { dataset: { node: r.child, index: r.index, fed: JSON.stringify(r.fed.map((t) => t.id)),
                              length: r.context.length, cached: r.timing.cached !== false } },
    h("span", { className: "dim" }, `${words}: `), older ? h("span", { className: "dim" }, `…${older} more `) : null,
    ...chips, " → ", chip(r.token, "next"));
}

function renderCache(view) {
  const c = view.cache, p = byId("loop-cache");
  Object.assign(p.dataset, { tokens: c.tokens, bytes: c.bytes, perToken: c.bytes_per_token, capacity: c.capacity,
                             dtype: c.dtype });
  const types = state.model?.layer_types ?? [], attending = types.filter((l) => !l.recurrent).length;
  const layers = attending === types.length ? `${types.length} layers` : `${attending} attention layers`;
  const windowed = types.some((l) => l.window);
  p.replaceChildren(
    h("strong", {}, `KV cache: ${c.tokens} tokens × ${c.bytes_per_token.toLocaleString("en-US")} bytes = ${bytes(c.bytes)}`),
    ` (${c.dtype}). Each token adds a key and a value vector in each of the ${layers}, for each key-value head: ` +
    `${bytes(c.bytes_per_token)} per token. The buffer holds up to ${c.capacity} tokens, ` +
    `${bytes(c.capacity * c.bytes_per_token)} reserved for one conversation.` +
    (windowed ? " This page's cache keeps every key of the sliding-window layers too, so that section 4 can show " +
                "them all; generation keeps only their window (below)." : "") +
    (view.timing.cached === false ? " This step ran without it: the cache was left as it was." : ""));
}

// Generation's cache per layer type at this length and at the model's whole context (cache.held,
// cache.full_context), a total, and what a cache of every layer full attention would hold.
function renderTypes(c) {
  const types = state.model?.layer_types ?? [], now = c.held, long = c.full_context;
  const of = (keep) => types.filter(keep).map((l) => l.layer);
  const window = types.find((l) => l.window)?.window, recurrent = types.find((l) => l.recurrent);
  const rows = [
    ["full", "full attention", of((l) => l.kind === "full_attention"), "a key and a value for every token"],
    ["sliding", `${kindName("sliding_attention")} ${window}`, of((l) => l.kind === "sliding_attention"),
     `the last ${window} tokens' keys and values (and ${now.sliding_room} slots of room for a prefill chunk ` +
     "and for taking back refused drafts)"],
    ["recurrent", recurrent ? kindName(recurrent.kind) : "recurrent", of((l) => l.recurrent),
     recurrent ? stateKept(recurrent) : ""],
  ].filter(([, , layers]) => layers.length);
  const tr = (type, cells, numbers) => h("tr", { dataset: { type, now: numbers[0], fullContext: numbers[1] } },
    ...cells.map((text) => h("td", {}, text)), ...numbers.map((n) => h("td", { className: "num" }, bytes(n))));
  byId("cache-types").replaceChildren(
    h("tr", {}, ...["layer type", "layers", "each keeps", `at ${now.tokens} tokens (now)`,
                    `at ${long.tokens.toLocaleString("en-US")} tokens (the model's context)`].map((t) => h("th", {}, t))),
    ...rows.map(([type, name, layers, keeps]) => tr(type, [name, layers.join(", "), keeps], [now[type], long[type]])),
    tr("total", ["all layers", "", "what generation's cache holds"], [now.total, long.total]),
    tr("all_full", ["if every layer were full attention", "", "a key and a value for every token, in every layer"],
       [now.all_full, long.all_full]));
  const share = (m) => (m.all_full ? `${Math.round((100 * m.total) / m.all_full)}%` : "–");
  const summary = byId("cache-summary");
  Object.assign(summary.dataset, { now: share(now), fullContext: share(long) });
  summary.textContent = rows.length === 1 && rows[0][0] === "full"
    ? "Every layer of this model is full attention, so its cache grows by the same amount with every token, " +
      "in every layer."
    : `This model's cache holds ${share(now)} of what a cache of every layer full would hold now, and ` +
      `${share(long)} at its whole context of ${long.tokens.toLocaleString("en-US")} tokens.` +
      (now.sliding && now.sliding_slots === now.tokens ? " Its sliding layers still keep every token: the text is " +
       "not yet longer than their window and its room." : "");
}
