// nexttok explainer: one token at a time, with the probability table of every step.
// The server sends each step's raw logits; moving a dial re-runs the sampler chain here, on those
// logits, with the step's own uniform draw u, so what the dials change is directly comparable.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { session: null, model: null, prompt: [], vocab: [], view: null, logits: null, playing: false };
const DIALS = ["temperature", "top_k", "top_p", "min_p"];

// ---- the sampler chain, as nexttok/sampling.py computes it ---------------------------------

function softmax(logits) {
  let max = -Infinity;
  for (const x of logits) if (x > max) max = x;
  const out = new Float64Array(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) { out[i] = Math.exp(logits[i] - max); sum += out[i]; }
  for (let i = 0; i < out.length; i++) out[i] /= sum;
  return out;
}

function kept(logits) { let n = 0; for (const x of logits) if (x > -Infinity) n++; return n; }

function entropyBits(probs) {
  let h = 0;
  for (const p of probs) if (p > 0) h -= p * Math.log2(p);
  return h;
}

function topK(logits, k) {
  if (k <= 0 || k >= logits.length) return logits;
  const kth = Array.from(logits).sort((a, b) => b - a)[k - 1];
  return logits.map((x) => (x < kth ? -Infinity : x));
}

function topP(logits, p) {
  if (p >= 1) return logits;
  const order = Array.from(logits.keys()).sort((a, b) => logits[a] - logits[b]);  // ascending
  const probs = softmax(logits);
  const out = Float64Array.from(logits);
  let cumulative = 0;
  for (let j = 0; j < order.length - 1; j++) {  // the most likely token always stays
    cumulative += probs[order[j]];
    if (cumulative <= 1 - p) out[order[j]] = -Infinity;
  }
  return out;
}

function minP(logits, p) {
  if (p <= 0) return logits;
  const probs = softmax(logits);
  const top = Math.max(...probs);
  return logits.map((x, i) => (probs[i] < p * top ? -Infinity : x));
}

function chain(raw, dials) {
  const stages = [{ name: "raw (model)", logits: raw }];
  const greedy = dials.temperature < 1e-5;  // as the server: tiny temperatures draw greedily
  let logits = Float64Array.from(raw);
  if (!greedy) {
    logits = topK(logits, dials.top_k); stages.push({ name: `top-k ${dials.top_k || "off"}`, logits });
    logits = topP(logits, dials.top_p); stages.push({ name: `top-p ${dials.top_p}`, logits });
    logits = minP(logits, dials.min_p); stages.push({ name: `min-p ${dials.min_p}`, logits });
    if (dials.temperature !== 1) logits = logits.map((x) => x / dials.temperature);
    stages.push({ name: `temperature ${dials.temperature}`, logits });
  } else {
    stages.push({ name: "temperature 0: greedy (filters skipped)", logits });
  }
  return { final: logits, stages, greedy };
}

function pick(finalLogits, u, greedy) {
  const probs = softmax(finalLogits);
  const order = Array.from(probs.keys()).sort((a, b) => probs[b] - probs[a]);
  if (greedy) return order[0];
  let total = 0;
  for (const p of probs) total += p;
  let cumulative = 0;
  let last = order[0];
  for (const i of order) {
    if (probs[i] <= 0) break;
    cumulative += probs[i];
    last = i;
    if (cumulative > u * total) return i;
  }
  return last;
}

// ---- talking to the server -------------------------------------------------------------

async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

function dials() {
  const value = (id) => Number($(id).value);
  return { temperature: value("temperature"), top_k: value("top_k"), top_p: value("top_p"), min_p: value("min_p") };
}

function decodeLogits(b64) {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  return new Float32Array(bytes.buffer);
}

async function start() {
  stopPlaying();
  setStatus("loading…");
  try {
    const data = await api("POST", "/explain/sessions", { prompt: $("prompt").value });
    Object.assign(state, { session: data.session, model: data.model, prompt: data.prompt, vocab: data.vocab,
                           view: null, logits: null });
    $("model-name").textContent = `${data.model.name} · ${data.model.layers} layers · ${data.model.heads} heads`;
    fillSelect($("layer"), data.model.layers);
    fillSelect($("head"), data.model.heads, true);
    renderTokens(data.prompt, []);
    renderTree(data.tree, 0);
    for (const id of ["step", "play"]) $(id).disabled = false;
    clearStep();
    setStatus(`${data.prompt.length} prompt tokens. Press Step.`);
  } catch (e) { setStatus(`error: ${e.message}`); }
}

async function step(node = null, tokenId = null) {
  if (!state.session) return;
  const body = { ...dials(), top_n: 50 };
  if (node !== null) { body.node = node; body.token_id = tokenId; }
  try {
    const view = await api("POST", `/explain/sessions/${state.session}/step`, body);
    state.view = view;
    state.logits = decodeLogits(view.logits);
    renderTokens(state.prompt, view.generated);
    renderTree(view.tree, view.current);
    renderStep();
    renderAttention();
    renderTiming(view.timing);
    setStatus(view.text ? `generated: ${JSON.stringify(view.text)}` : "");
  } catch (e) { setStatus(`error: ${e.message}`); stopPlaying(); }
}

async function play() {
  state.playing = true;
  $("pause").disabled = false; $("play").disabled = true;
  while (state.playing) {
    await step();
    await new Promise((resolve) => setTimeout(resolve, 150));
  }
}

function stopPlaying() {
  state.playing = false;
  $("pause").disabled = true;
  $("play").disabled = !state.session;
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
  const box = $("tokens");
  box.replaceChildren(...prompt.map((t) => chip(t, "prompt")), ...generated.map((t) => chip(t, "generated")));
  if (generated.length) box.lastChild.classList.add("last");
}

const visible = (text) => text.replaceAll(" ", "␣").replaceAll("\n", "\\n").replaceAll("\t", "\\t");
const tokenText = (id) => state.vocab[id] ?? `#${id}`;

function renderStep() {
  const view = state.view;
  const s = view.step;
  const raw = state.logits;
  const rawProbs = softmax(raw);
  const { final, stages, greedy } = chain(raw, dials());
  const finalProbs = softmax(final);
  const rows = s.top.slice(0, 10).map((alt, rank) => {
    const tr = document.createElement("tr");
    const cut = final[alt.id] === -Infinity;
    if (alt.id === s.token_id) tr.classList.add("chosen");
    if (cut) tr.classList.add("cut");
    tr.dataset.id = alt.id;
    const p = rawProbs[alt.id];
    const q = finalProbs[alt.id];
    tr.innerHTML = `<td class="num">${rank + 1}</td><td class="tok"></td><td class="num">${alt.id}</td>` +
      `<td class="num">${pct(p)}</td><td><div class="bar" style="width:${Math.round(p * 200)}px"></div>` +
      `<div class="bar final" style="width:${Math.round(q * 200)}px"></div></td>` +
      `<td class="num final-p">${cut ? "cut" : pct(q)}</td>`;
    tr.querySelector(".tok").textContent = visible(alt.text);
    tr.addEventListener("click", () => { if (alt.id !== s.token_id) step(view.node, alt.id); });
    return tr;
  });
  const shown = s.top.slice(0, 10).reduce((acc, alt) => acc + rawProbs[alt.id], 0);
  const rest = document.createElement("tr");
  rest.className = "rest";
  rest.innerHTML = `<td></td><td>everything else</td><td></td><td class="num">${pct(1 - shown)}</td><td></td><td></td>`;
  $("table").tBodies[0].replaceChildren(...rows, rest);
  $("step-title").textContent = `(step ${s.index + 1})`;
  $("chosen").textContent = `chosen: ${JSON.stringify(s.token_text)} (id ${s.token_id}) — rank ${s.rank}, ` +
    `model p ${pct(Math.exp(s.logprob))}` + (s.draw === null ? ", greedy" : `, draw u = ${s.draw.toFixed(3)}`);
  const redraw = pick(final, s.draw === null ? 0 : s.draw, greedy);
  $("redraw").textContent = redraw === s.token_id ? "" :
    `with these dials the same draw picks ${JSON.stringify(tokenText(redraw))} (click its row to continue with it)`;
  renderStages(stages, redraw, greedy);
}

function renderStages(stages, drawn, greedy) {
  const items = stages.map((st) => {
    const probs = softmax(st.logits);
    const li = document.createElement("li");
    li.textContent = `${st.name}: ${kept(st.logits)} tokens kept, entropy ${entropyBits(probs).toFixed(2)} bits, ` +
      `top p ${pct(Math.max(...probs))}`;
    return li;
  });
  const draw = document.createElement("li");
  draw.textContent = `draw${greedy ? " (greedy)" : ""}: ${JSON.stringify(tokenText(drawn))} (id ${drawn})`;
  $("stages").replaceChildren(...items, draw);
}

function renderAttention() {
  const view = state.view;
  if (!view || !view.attention.length) return;
  const layer = view.attention[Number($("layer").value) || 0];
  const head = $("head").value;
  const weights = head === "mean"
    ? layer[0].map((_, j) => layer.reduce((acc, h) => acc + h[j], 0) / layer.length)
    : layer[Number(head)];
  const tokens = [...state.prompt, ...view.generated].slice(0, weights.length);
  const max = Math.max(...weights);
  $("attention").replaceChildren(...tokens.map((t, j) => {
    const span = document.createElement("span");
    span.className = "att";
    span.textContent = t.text.replaceAll("\n", "\\n");
    span.title = `weight ${weights[j].toFixed(4)} · id ${t.id}`;
    span.style.background = `rgba(37, 99, 235, ${(weights[j] / max).toFixed(3)})`;
    return span;
  }));
}

function renderTiming(t) {
  const ms = t.seconds * 1000;
  const rate = t.tokens / t.seconds;
  $("timing").textContent = `${t.prefill ? "prefill" : "decode"}: ${t.tokens} token${t.tokens > 1 ? "s" : ""} ` +
    `through the model in ${ms.toFixed(1)} ms (${rate.toFixed(1)} tokens/s)`;
}

function renderTree(nodes, current) {
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const build = (node) => {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = node.parent === null ? "(prompt)" : visible(node.text);
    if (node.id === current) label.classList.add("current");
    label.dataset.node = node.id;
    li.appendChild(label);
    if (node.children.length) {
      const ul = document.createElement("ul");
      for (const c of node.children) ul.appendChild(build(byId.get(c)));
      li.appendChild(ul);
    }
    return li;
  };
  const root = document.createElement("ul");
  root.appendChild(build(byId.get(0)));
  $("tree").replaceChildren(root);
  $("tree").dataset.branches = nodes.filter((n) => n.children.length > 1).length;
}

function clearStep() {
  $("table").tBodies[0].replaceChildren();
  for (const id of ["chosen", "redraw", "timing", "step-title"]) $(id).textContent = "";
  $("stages").replaceChildren();
  $("attention").replaceChildren();
}

function fillSelect(select, n, withMean = false) {
  const options = Array.from({ length: n }, (_, i) => new Option(String(i), String(i)));
  if (withMean) options.unshift(new Option("mean", "mean"));
  select.replaceChildren(...options);
}

const pct = (p) => `${(100 * p).toFixed(2)}%`;
const setStatus = (text) => { $("status").textContent = text; };

// ---- wiring -----------------------------------------------------------------------------

for (const id of DIALS) {
  const input = $(id);
  const output = document.querySelector(`output[for=${id}]`);
  const show = () => { output.textContent = input.value; if (state.view) renderStep(); };
  input.addEventListener("input", show);
  show();
}
$("start").addEventListener("click", start);
$("step").addEventListener("click", () => step());
$("play").addEventListener("click", play);
$("pause").addEventListener("click", stopPlaying);
$("layer").addEventListener("change", renderAttention);
$("head").addEventListener("change", renderAttention);
$("tree").addEventListener("click", async (event) => {
  const node = event.target.dataset.node;
  if (node === undefined || !state.session) return;
  stopPlaying();
  try {
    const view = await api("POST", `/explain/sessions/${state.session}/goto`, { node: Number(node) });
    renderTokens(state.prompt, view.generated);
    renderTree(view.tree, view.current);
    clearStep();
    setStatus(`back at node ${node}: Step continues from here`);
  } catch (e) { setStatus(`error: ${e.message}`); }
});
