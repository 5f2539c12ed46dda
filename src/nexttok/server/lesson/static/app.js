// nexttok explainer: one token at a time, with the probability table of every step.
// The sampler chain runs on the server only (nexttok/generation/sampling.py): a step returns the Step
// record, the model's top tokens with their probability before and after the chain, and the chain's
// stage records. Moving a dial asks the server to re-run that same chain on the step's cached logits
// with the step's own uniform draw u (POST .../redraw), so what the dials show is what sampling does.
// The lesson's sections (sections/*.js) read `state`, call step() and dials(), and follow the page
// through on(): nothing is global. What the page shows is also in data-* attributes a test reads:
// #tokens[data-session] (the session's key), #table[data-node] (the node whose step the table shows).

import { api, loadVocab, sessionPath } from "./api.js";
import { byId, h } from "./dom.js";
import { layerLabel, pctFixed, stateWords, visible } from "./format.js";

export const state = { session: null, model: null, prompt: [], vocab: [], view: null, playing: false,
                       parameters: null, order: [], redraws: 0, useCache: true };
const REDRAW_DELAY_MS = 120;  // dial input is debounced: one request per pause in the movement
const CUT_SHOWN = 6;  // tokens named per stage as cut (of the model's top 20)
let redrawTimer = null;

// ---- talking to the server -------------------------------------------------------------

// The dials' ranges, defaults and meanings come from the server's table: each sampler stage describes
// itself once (nexttok/generation/stages), with its settings and a sentence on when people use it.
let parametersLoaded = null;
function loadParameters() {  // once; a failure (say, the API key is missing yet) is tried again later
  parametersLoaded ??= fetchParameters().catch((e) => { parametersLoaded = null; throw e; });
  return parametersLoaded;
}

async function fetchParameters() {
  const table = await api("GET", "/explain/parameters");
  state.parameters = table;
  state.order = [...table.order];
  byId("dials").replaceChildren(...table.stages.filter((st) => st.dials.length).map((st) => stageDials(st, table.dials)));
  renderOrder();
  byId("dials").dataset.ready = "1";
}

// One stage's dials, under its name, with the sentence on when people use it.
function stageDials(stage, bounds) {
  const box = document.createElement("fieldset");
  box.className = "stage-dials";
  box.dataset.stage = stage.name;
  const legend = document.createElement("legend");
  legend.textContent = stage.name.replaceAll("_", " ") + (stage.last ? " (runs last, before the draw)" : "");
  const use = document.createElement("p");
  use.className = "use dim";
  use.textContent = stage.use;
  box.append(legend, ...stage.dials.map((name) => dial(name, bounds[name])), use);
  return box;
}

const useOf = (name) => state.parameters?.stages.find((st) => st.name === name)?.use ?? "";

function dial(name, bound) {
  const step = bound.integer ? 1 : 0.01;
  const input = document.createElement("input");
  Object.assign(input, { id: name, type: "range", step: String(step),
                         min: String(bound.low_open ? bound.low + step : bound.low),
                         max: String(bound.dial_high ?? bound.high), value: String(bound.default) });
  const output = document.createElement("output");
  output.htmlFor = name;
  const label = document.createElement("label");
  label.title = bound.meaning;
  label.append(`${name.replaceAll("_", " ")} `, input, output);
  const show = () => { output.textContent = input.value; };
  input.addEventListener("input", () => { show(); scheduleRedraw(); });
  show();
  return label;
}

export function dials() {  // the dials as a request body: {temperature, ..., order}
  const settings = {};
  for (const name of Object.keys(state.parameters.dials)) settings[name] = Number(byId(name).value);
  settings.order = [...state.order];
  return settings;
}

async function start() {
  stopPlaying();
  setStatus("loading…");
  try {
    await loadParameters();
    const request = { prompt: byId("prompt").value };
    if (byId("context").value) request.context = Number(byId("context").value);
    const data = await api("POST", "/explain/sessions", request);
    const vocab = await loadVocab(data.model.name);  // once per model: the session does not carry it
    Object.assign(state, { session: data.session, model: data.model, prompt: data.prompt, vocab, view: null });
    byId("tokens").dataset.session = data.session;
    byId("model-name").textContent = `${data.model.name} · ${data.model.layers} layers · ${data.model.heads} heads`;
    fillLayers(byId("layer"), data.model.layer_types);
    fillSelect(byId("head"), data.model.heads, true);
    renderTokens(data.prompt, []);
    renderTree(data.tree, 0);
    for (const id of ["step", "play"]) byId(id).disabled = false;
    clearStep();
    setStatus(`${data.prompt.length} prompt tokens. Press Step.`);
    emit("session", data);
  } catch (e) { setStatus(`error: ${e.message}`); }
}

// One step from node (default: the current one), continuing with tokenId when given (a branch).
export async function step(node = null, tokenId = null) {
  if (!state.session) return;
  const settings = dials();
  const body = { ...settings, top_n: 10, use_cache: state.useCache };
  if (node !== null) { body.node = node; body.token_id = tokenId; }
  state.redraws++;  // a redraw still in flight belongs to the step before: it is ignored
  try {
    const view = await api("POST", sessionPath(state.session, "step"), body);
    state.view = view;
    renderTokens(state.prompt, view.generated);
    renderTree(view.tree, view.current);
    renderStep(view);
    renderDrawn(view, settings);
    renderAttention();
    renderTiming(view.timing);
    setStatus(view.text ? `generated: ${JSON.stringify(view.text)}` : "");
    emit("step", view);
  } catch (e) { setStatus(`error: ${e.message}`); stopPlaying(); emit("error", e); }
}

function scheduleRedraw() {
  clearTimeout(redrawTimer);
  redrawTimer = setTimeout(redraw, REDRAW_DELAY_MS);
}

async function redraw() {
  const view = state.view;
  if (!view) return;
  const ticket = ++state.redraws;
  const settings = dials();
  try {
    const drawn = await api("POST", sessionPath(state.session, "redraw"),
                            { ...settings, node: view.node, top_n: 10 });
    if (ticket === state.redraws && state.view === view) {  // else: stale
      renderDrawn(drawn, settings);
      emit("redraw", drawn);
    }
  } catch (e) { if (ticket === state.redraws) setStatus(`error: ${e.message}`); }
}

async function play() {
  state.playing = true;
  byId("pause").disabled = false; byId("play").disabled = true;
  while (state.playing) {
    await step();
    await new Promise((resolve) => setTimeout(resolve, 150));
  }
}

function stopPlaying() {
  state.playing = false;
  byId("pause").disabled = true;
  byId("play").disabled = !state.session;
}

// ---- rendering --------------------------------------------------------------------------

function chip(token, cls) {
  const span = document.createElement("span");
  span.className = `chip ${cls}`;
  span.textContent = token.text.replaceAll("\n", "\\n");
  span.title = `id ${token.id} · bytes ${token.bytes}`;
  span.dataset.id = token.id;
  return span;
}

function renderTokens(prompt, generated) {
  const box = byId("tokens");
  box.replaceChildren(...prompt.map((t) => chip(t, "prompt")), ...generated.map((t) => chip(t, "generated")));
  if (generated.length) box.lastChild.classList.add("last");
}

// tokenText(id): the display text of any id of the session's model (GET /explain/vocab).
export const tokenText = (id) => state.vocab[id] ?? `#${id}`;

// The table of the step: the model's top 10 (p) and, filled by renderDrawn, after the chain (q).
function renderStep(view) {
  const s = view.step;
  byId("table").dataset.node = view.node;
  const rows = view.rows.map((row, rank) => {
    const tr = document.createElement("tr");
    if (row.id === s.token_id) tr.classList.add("chosen");
    tr.dataset.id = row.id;
    tr.innerHTML = `<td class="num">${rank + 1}</td><td class="tok"></td><td class="num">${row.id}</td>` +
      `<td class="num logit">${row.logit.toFixed(3)}</td><td class="num">${pctFixed(row.p)}</td><td><div class="bar" style="width:${Math.round(row.p * 200)}px"></div>` +
      `<div class="bar final"></div></td><td class="num final-p"></td>`;
    tr.querySelector(".tok").textContent = visible(row.text);
    tr.addEventListener("click", () => { if (row.id !== s.token_id) step(view.node, row.id); });
    return tr;
  });
  const rest = document.createElement("tr");
  rest.className = "rest";
  rest.innerHTML = `<td></td><td>everything else</td><td class="num">${view.rest.tokens} tokens</td><td></td>` +
    `<td class="num">${pctFixed(view.rest.p)}</td><td></td><td></td>`;
  byId("table").tBodies[0].replaceChildren(...rows, rest);
  byId("step-title").textContent = `(step ${s.index + 1})`;
  byId("chosen").textContent = `chosen: ${JSON.stringify(s.token_text)} (id ${s.token_id}) — rank ${s.rank}, ` +
    `model p ${pctFixed(Math.exp(s.logprob))}` + (s.draw === null ? ", greedy" : `, draw u = ${s.draw.toFixed(3)}`);
}

// What the server's chain made of the step's logits under `settings`: q per row, the stages, the pick.
function renderDrawn(drawn, settings) {
  const q = new Map(drawn.rows.map((row) => [row.id, row.q]));
  const cutBy = new Map();
  for (const stage of drawn.step.stages) for (const id of stage.cut) if (!cutBy.has(id)) cutBy.set(id, stage.name);
  for (const tr of byId("table").tBodies[0].querySelectorAll("tr[data-id]")) {
    const id = Number(tr.dataset.id);
    const p = q.get(id) ?? 0;
    tr.dataset.q = String(p);
    tr.classList.toggle("cut", p === 0);
    tr.querySelector(".bar.final").style.width = `${Math.round(p * 200)}px`;
    tr.querySelector(".final-p").textContent = p === 0 ? `cut by ${cutBy.get(id) ?? "the chain"}` : pctFixed(p);
  }
  const picked = drawn.step.token_id;
  const redraw = byId("redraw");
  redraw.dataset.token = picked;
  redraw.dataset.draw = drawn.step.draw === null ? "" : String(drawn.step.draw);
  redraw.textContent = picked === state.view.step.token_id ? "" :
    `with these dials the same draw picks ${JSON.stringify(tokenText(picked))} (click its row to continue with it)`;
  renderStages(drawn.step);
  byId("table").dataset.dials = JSON.stringify(settings);
}

function renderStages(drawnStep) {
  const items = drawnStep.stages.map((st) => {
    const li = document.createElement("li");
    Object.assign(li.dataset, { stage: st.name, kept: st.kept, entropy: st.entropy });
    const names = st.cut.slice(0, CUT_SHOWN).map((id) => JSON.stringify(visible(tokenText(id)))).join(" ");
    const more = st.cut.length > CUT_SHOWN ? ` … (${st.cut.length} of the model's top 20)` : "";
    const cut = st.cut.length ? `; cut ${names}${more}` : "";
    const moved = st.shifted.slice(0, CUT_SHOWN).map(([token, by]) =>
      `${JSON.stringify(visible(tokenText(token)))} ${by > 0 ? "+" : ""}${by.toFixed(2)}`).join(" ");
    const shifted = st.shifted.length ? `; logits moved: ${moved}` : "";
    const note = st.note ? ` (${st.note})` : "";
    li.textContent = `${st.name}: ${st.kept} tokens kept, entropy ${st.entropy.toFixed(2)} bits, ` +
      `top p ${pctFixed(st.top_probs[0])}${cut}${shifted}${note}`;
    li.title = useOf(st.name);
    return li;
  });
  const draw = document.createElement("li");
  const id = drawnStep.token_id;
  draw.dataset.stage = "draw";
  draw.textContent = `draw${drawnStep.draw === null ? " (greedy)" : ` (u = ${drawnStep.draw.toFixed(3)})`}: ` +
    `${JSON.stringify(tokenText(id))} (id ${id})`;
  byId("stages").replaceChildren(...items, draw);
  const ran = new Set(drawnStep.stages.map((st) => st.name));
  for (const li of byId("order").children) li.classList.toggle("on", ran.has(li.dataset.stage));
}

function renderOrder() {
  byId("order").replaceChildren(...state.order.map((name, i) => {
    const li = document.createElement("li");
    li.dataset.stage = name;
    const up = document.createElement("button");
    Object.assign(up, { textContent: "↑", title: `run ${name} earlier`, disabled: i === 0 });
    up.addEventListener("click", () => {
      [state.order[i - 1], state.order[i]] = [state.order[i], state.order[i - 1]];
      renderOrder();
      scheduleRedraw();
    });
    li.append(`${name} `, up);
    return li;
  }));
}

// The last position's weights in the chosen layer (the model's layer index: view.attention_layers
// says which entry is whose); a recurrent layer has none and says what it keeps instead; on a
// sliding layer the keys older than the window are marked .outside (they get no weight).
function renderAttention() {
  const view = state.view;
  if (!view || !view.attention.length) return;
  const layer = Number(byId("layer").value) || 0;
  const kind = state.model.layer_types[layer], box = byId("attention");
  Object.assign(box.dataset, { layer, kind: kind.kind, window: kind.window ?? "" });
  if (kind.recurrent) {
    box.replaceChildren(h("span", { className: "att-state", dataset: { numbers: kind.state.numbers } },
                          `Layer ${layer} has no attention: it is a ${stateWords(kind)}.`));
    return;
  }
  const entry = view.attention_layers.indexOf(layer);
  const head = byId("head").value;  // "mean": the server's mean over the layer's heads
  const weights = head === "mean" ? view.attention_mean[entry] : view.attention[entry][Number(head)];
  const tokens = [...state.prompt, ...view.generated].slice(0, weights.length);
  const max = Math.max(...weights), first = kind.window ? weights.length - kind.window : 0;
  box.replaceChildren(...tokens.map((t, j) => {
    const span = document.createElement("span");
    span.className = j < first ? "att outside" : "att";
    span.textContent = t.text.replaceAll("\n", "\\n");
    span.title = j < first ? `older than the window of ${kind.window}: no weight · id ${t.id}`
      : `weight ${weights[j].toFixed(4)} · id ${t.id}`;
    span.dataset.weight = weights[j];
    span.style.background = `rgba(37, 99, 235, ${(weights[j] / max).toFixed(3)})`;
    return span;
  }));
  if (first > 0) box.children[first].before(h("span", { className: "window-edge" }, `| window ${kind.window} →`));
}

function renderTiming(t) {
  const ms = t.seconds * 1000;
  const rate = t.tokens / t.seconds;
  byId("timing").textContent = `${t.prefill ? "prefill" : "decode"}: ${t.tokens} token${t.tokens > 1 ? "s" : ""} ` +
    `through the model in ${ms.toFixed(1)} ms (${rate.toFixed(1)} tokens/s)`;
}

function renderTree(nodes, current) {
  const nodeById = new Map(nodes.map((n) => [n.id, n]));
  const build = (node) => {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = node.parent === null ? "(prompt)" : visible(node.text);
    if (node.id === current) label.classList.add("current");
    label.dataset.node = node.id;
    li.appendChild(label);
    if (node.children.length) {
      const ul = document.createElement("ul");
      for (const c of node.children) ul.appendChild(build(nodeById.get(c)));
      li.appendChild(ul);
    }
    return li;
  };
  const root = document.createElement("ul");
  root.appendChild(build(nodeById.get(0)));
  byId("tree").replaceChildren(root);
  byId("tree").dataset.branches = nodes.filter((n) => n.children.length > 1).length;
}

function clearStep() {
  state.view = null;
  state.redraws++;
  byId("table").tBodies[0].replaceChildren();
  delete byId("table").dataset.dials;
  delete byId("table").dataset.node;
  for (const id of ["chosen", "redraw", "timing", "step-title"]) byId(id).textContent = "";
  byId("stages").replaceChildren();
  byId("attention").replaceChildren();
}

function fillLayers(select, layers) {  // the model's layers by index, each named with its type
  select.replaceChildren(...layers.map((l) => new Option(layerLabel(l), String(l.layer))));
  const first = layers.find((l) => !l.recurrent);  // start on a layer that attends
  if (first) select.value = String(first.layer);
}

function fillSelect(select, n, withMean = false) {
  const options = Array.from({ length: n }, (_, i) => new Option(String(i), String(i)));
  if (withMean) options.unshift(new Option("mean", "mean"));
  select.replaceChildren(...options);
}

const setStatus = (text) => { byId("status").textContent = text; };

// ---- what the lesson's sections (sections/*.js) follow ----------------------------------
// Events on document: nexttok:session (detail: the new session), nexttok:step (the step's view),
// nexttok:redraw (the chain re-run under moved dials), nexttok:goto (back at a node), nexttok:error.
function emit(name, detail) { document.dispatchEvent(new CustomEvent(`nexttok:${name}`, { detail })); }
export const on = (name, fn) => document.addEventListener(`nexttok:${name}`, (e) => fn(e.detail));

// ---- wiring -----------------------------------------------------------------------------

export function install() {
  loadParameters().catch(() => {});  // a server with an API key answers once the key is typed (Start)
  byId("start").addEventListener("click", start);
  byId("step").addEventListener("click", () => step());
  byId("play").addEventListener("click", play);
  byId("pause").addEventListener("click", stopPlaying);
  byId("layer").addEventListener("change", renderAttention);
  byId("head").addEventListener("change", renderAttention);
  byId("tree").addEventListener("click", (event) => goto(event.target.dataset.node));
}

async function goto(node) {
  if (node === undefined || !state.session) return;
  stopPlaying();
  try {
    const view = await api("POST", sessionPath(state.session, "goto"), { node: Number(node) });
    renderTokens(state.prompt, view.generated);
    renderTree(view.tree, view.current);
    clearStep();
    setStatus(`back at node ${node}: Step continues from here`);
    emit("goto", view);
  } catch (e) { setStatus(`error: ${e.message}`); }
}
