// Sections 6-11 of the lesson: logits and softmax, the draw, the loop and its KV cache, stopping,
// the context window, experiments. Every number shown comes from a route (the step view, the
// redraw, the experiments of server/lesson.py); this file lays the numbers out, puts words around
// them and keeps what it shows in data-* attributes, so a test can read it back.
"use strict";

(() => {  // a scope of its own: app.js and lesson-early.js declare top-level names as well
  const N = window.nexttok;
  const byId = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const LOOPS_SHOWN = 12;  // loops listed in section 8 (the newest); the plots keep every step
  const TOKENS_SHOWN = 12;  // tokens of one loop's input drawn as chips; older ones are counted
  const QUIZ_STEPS = 6;  // steps per session in the KV cache question
  const QUIZ_REPEAT = 24;  // copies of the prompt in that question: a long text makes the work visible
  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea"];

  // ---- small helpers ----------------------------------------------------------------------

  const h = N.h;  // h(tag, props, ...children): an element (app.js)

  function s(name, attrs = {}, text = null) {  // an SVG element
    const node = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== null) node.textContent = text;
    return node;
  }

  function svgRoot(width, height) {  // scales with its box, as plot.js's plots do
    return s("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", preserveAspectRatio: "xMinYMin meet",
                      class: "plot" });
  }

  const note = (text, id) => h("p", { className: "note", ...(id ? { id } : {}) }, text);
  const row = (...items) => h("div", { className: "row" }, ...items);
  const label = (text, input) => h("label", {}, `${text} `, input);
  const numberInput = (id, value, min, max, step = 1) =>
    h("input", { id, type: "number", value: String(value), min: String(min), max: String(max), step: String(step) });
  const quote = (text) => `“${N.visible(text)}”`;
  // A probability as a percentage that stays readable when tiny: 0.92 "92.00%", 7.2e-5 "0.0072%".
  const pct = (p) => (p === 0 || p >= 1e-3 ? N.pct(p) : `${(100 * p).toPrecision(2)}%`);
  const ms = (seconds) => `${(seconds * 1000).toFixed(1)} ms`;
  const chip = (token, cls = "") => h("span", { className: `late-chip ${cls}`, title: `id ${token.id}`,
                                              dataset: { id: token.id } }, N.visible(token.text));

  function usd(x) {  // usd(302.1) "$302.10", usd(2.1e-6) "$0.0000021"
    const digits = x >= 1 ? { minimumFractionDigits: 2, maximumFractionDigits: 2 } : { maximumSignificantDigits: 3 };
    return `$${x.toLocaleString("en-US", digits)}`;
  }

  function bytes(n) {  // bytes(49152) "49,152 bytes (48.0 KiB)"
    const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
    const unit = units.find(([, size]) => n >= size);
    return `${n.toLocaleString("en-US")} bytes` + (unit ? ` (${(n / unit[1]).toFixed(1)} ${unit[0]})` : "");
  }

  // ---- requests: the newest answer wins, errors stay on the view's own line -----------------

  const errorLine = (view) => h("p", { className: "late-error", id: `${view}-error`, role: "status" });
  const sessionPath = (key, view) => `/explain/sessions/${key}/${view}`;

  const { nextTicket, refuse, ask } = N.viewRequests();

  // ---- 6. Logits → softmax ------------------------------------------------------------------

  function buildLogits() {
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
      g.append(s("title", {}, `${N.visible(r.text)}: logit ${r.logit.toFixed(3)}, p ${pct(r.p)}`),
               s("text", { x: name - 6, y: y + 15, "text-anchor": "end", "font-size": 12, class: "tok" },
                 N.visible(r.text)),
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
    Plot.bar(byId("logit-mass"), [...rows.map((r) => ({ value: r.p, label: N.visible(r.text) })),
      { value: rest.p, label: "everything else", colour: "#cbd5e1" }]);
    const p = byId("logit-rest");
    Object.assign(p.dataset, { tokens: rest.tokens, p: rest.p });
    p.textContent = `The ${rows.length} rows of the table hold ${pct(top)} together; the other ` +
      `${rest.tokens.toLocaleString("en-US")} tokens of the vocabulary share the remaining ${pct(rest.p)}. ` +
      "Every one of them keeps a chance above zero until a sampling dial cuts it.";
  }

  // ---- 7. Sampling: the draw ----------------------------------------------------------------

  const draw = { branch: null };  // the id of a table row just clicked: that step's token was chosen, not drawn

  function buildDraw() {
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
  }

  // The segments in the sampler's order: kept rows by q, then the kept tokens outside the table.
  function drawSegments(d) {
    const kept = d.rows.filter((r) => r.q > 0).sort((a, b) => b.q - a.q);
    const segments = kept.map((r) => ({ id: r.id, q: r.q, label: N.visible(r.text) }));
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
    const d = await ask("draw", sessionPath(N.state.session, "redraw"),
                        { ...N.dials(), node: view.node, top_n: view.rows.length });
    if (d && N.state.view === view) renderDraw(d, view.step.token_id);
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
    const name = quote(N.tokenText(picked));
    const said = u === null
      ? `Temperature 0: no number is drawn, the most likely token ${name} is taken, every time.`
      : `u = ${u.toFixed(4)} picks ${name}` + (hit ? `: it lands in ${hit.id === null ? "the block of tokens outside " +
        "the table" : "its stretch"}, from ${hit.start.toFixed(4)} to ${(hit.start + hit.q).toFixed(4)}` : "") +
        `. The chain kept ${d.rest.kept.toLocaleString("en-US")} tokens.`;
    const other = continued !== picked ? ` The text itself went on with ${quote(N.tokenText(continued))}.` : "";
    byId("draw-note").textContent = said + other;
  }

  // ---- 8. Loop and KV cache -----------------------------------------------------------------

  const history = new Map();  // child node -> what the loop that made it did
  const path = { tree: [], current: 0 };

  function buildLoop() {
    const toggle = h("input", { type: "checkbox", id: "loop-nocache", checked: !N.state.useCache });
    toggle.addEventListener("change", () => { N.state.useCache = !toggle.checked; });
    byId("lesson-loop").append(
      h("h3", {}, "The input grows one token per loop"),
      note("Each loop runs the model on the text so far and appends the token it picked; the next loop reads " +
           "that longer text. Attention needs the key and value vectors of every earlier token in every layer. " +
           "Those never change once computed, so the engine keeps them, the KV cache, and each loop feeds only " +
           "the newest token through the model. The first loop, the prefill, feeds the whole prompt at once. " +
           "Faded chips come from the cache; solid ones went through the model in that loop."),
      h("ol", { id: "loop-list" }), h("p", { id: "loop-cache" }),
      h("label", { className: "switch" }, toggle, " run without the KV cache (every loop feeds the whole text again)"),
      h("div", { id: "loop-times", className: "late-plot" }), note("", "loop-times-note"));
  }

  function record(view) {
    const context = [...N.state.prompt, ...view.generated.slice(0, -1)];
    history.set(view.child, { node: view.node, index: view.step.index, timing: view.timing, stop: view.stop.p,
                              context, fed: context.slice(context.length - view.timing.tokens),
                              token: view.generated.at(-1) });
  }

  function onPath() {  // the records of the loops from the prompt down to the current node, in order
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
    const series = [["with the KV cache", (r) => r.timing.cached !== false, PALETTE[0]],
                    ["without the KV cache", (r) => r.timing.cached === false, PALETTE[1]]]
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
    const layers = N.state.model ? `${N.state.model.layers} layers` : "layers";
    p.replaceChildren(
      h("strong", {}, `KV cache: ${c.tokens} tokens × ${c.bytes_per_token.toLocaleString("en-US")} bytes = ${bytes(c.bytes)}`),
      ` (${c.dtype}). Each token adds a key and a value vector in each of the ${layers}, for each key-value head: ` +
      `${bytes(c.bytes_per_token)} per token. The buffer holds up to ${c.capacity} tokens, ` +
      `${bytes(c.capacity * c.bytes_per_token)} reserved for one conversation.` +
      (view.timing.cached === false ? " This step ran without it: the cache was left as it was." : ""));
  }

  // ---- 9. Stop ------------------------------------------------------------------------------

  function buildStop() {
    byId("lesson-stop").append(
      note("A model learns to end a text with special stop tokens (end of text, end of turn). To the model they " +
           "are tokens like any other: each step gives them a probability. When the draw picks one, the engine " +
           "stops and reports finish_reason “stop”. A text also ends when it reaches the max_tokens cap the " +
           "caller sets (finish_reason “length”), or when the context window is full."),
      h("p", { id: "stop-tokens" }), h("div", { id: "stop-plot", className: "late-plot" }), h("p", { id: "stop-reason" }));
  }

  function renderStop(view) {
    const loops = onPath(), plot = byId("stop-plot");
    plot.dataset.p = JSON.stringify(loops.map((r) => r.stop));
    if (loops.length) {  // in percent: short tick labels even when the chance is tiny
      Plot.lines(plot, [{ name: "p(stop) in %", points: loops.map((r) => [r.index + 1, 100 * r.stop]) }],
                 { xLabel: "step", yLabel: "p(stop) in %", yMin: 0 });
    } else plot.replaceChildren();
    if (!view) return;
    const ids = view.stop.ids;
    byId("stop-tokens").textContent = ids.length
      ? `This model's stop token${ids.length > 1 ? "s" : ""}: ${ids.map((i) => `${quote(N.tokenText(i))} (id ${i})`).join(", ")}. ` +
        `The line: the chance of stopping at each step of this text (now ${pct(view.stop.p)}).`
      : "This model names no stop token: its texts end only at a length cap or a full window.";
    reason(view);
  }

  function reason(view) {
    const p = byId("stop-reason"), { used, limit } = view.context, token = quote(view.step.token_text);
    p.dataset.reason = view.stop.reason ?? "";
    p.textContent = view.stop.reason === "stop"
      ? `Ended: the step drew ${token}, a stop token. An engine stops here and answers finish_reason “stop”.`
      : view.stop.reason === "length"
        ? `Ended: ${used} of ${limit} tokens, the context window is full (finish_reason “length”).`
        : `Not ended: ${token} is not a stop token and the window has room for ${limit - 1 - used} more. The text ` +
          "goes on until a stop token is drawn, the caller's max_tokens is reached, or the window fills.";
  }

  // ---- 10. Context window -------------------------------------------------------------------

  const waiting = { error: null };  // set while the window demonstration steps: the step's refusal

  function buildContext() {
    const size = numberInput("ctx-size", 24, 2, 4096);
    const fill = h("button", { id: "ctx-fill" }, "Fill a small window");
    fill.addEventListener("click", fillWindow);
    byId("lesson-context").append(
      note("Everything the model reads at once (the prompt, the conversation so far and its own answer) must fit " +
           "in its context window: the positions it was trained for, and the KV cache's memory."),
      h("meter", { id: "ctx-meter", min: 0, max: 1, value: 0 }), h("p", { id: "ctx-text" }),
      h("h3", {}, "When the text no longer fits"), row(label("window (tokens)", size), fill),
      note("This starts a new session of your prompt with that small window and steps until the server refuses."),
      h("p", { id: "ctx-result" }),
      note("Engines meet a full window in one of three ways: refuse (OpenAI-style APIs answer 400 with " +
           "context_length_exceeded, as this server does), cut the oldest tokens off and go on (a sliding window: " +
           "the model forgets the beginning), or, in chat apps, drop or summarise the oldest turns. That is why a " +
           "long chat can lose an instruction given at its start."));
  }

  function renderMeter(used, limit) {
    const meter = byId("ctx-meter"), p = byId("ctx-text");
    Object.assign(meter, { max: limit, value: used });
    Object.assign(p.dataset, { used, limit });
    p.textContent = `${used} of the window's ${limit} positions used (${pct(used / limit)}).`;
  }

  // Start with the window size in the prompt box's context field, then Step until a refusal.
  async function fillWindow() {
    const size = Number(byId("ctx-size").value), button = byId("ctx-fill"), result = byId("ctx-result");
    button.disabled = true;
    delete result.dataset.refused;
    result.textContent = `Starting a session with a window of ${size} tokens…`;
    const before = byId("context").value;
    byId("context").value = String(size);
    let refusal = await startSession();
    byId("context").value = before;  // the session keeps its small window; the next Start gets the usual one
    for (let i = 0; refusal === null && i <= size; i++) refusal = await stepOnce();
    result.dataset.refused = refusal === null ? "" : "1";
    result.dataset.message = refusal ?? "";
    result.replaceChildren(refusal === null ? "The window did not fill." : h("strong", {}, `Refused: ${refusal}`));
    button.disabled = false;
  }

  function startSession() {  // null once the session is there, or the server's refusal
    return new Promise((resolve) => {
      const status = byId("status"), before = N.state.session;
      const observer = new MutationObserver(() => {
        const text = status.textContent;
        if (text.startsWith("error:")) done(text.slice("error:".length).trim());
        else if (N.state.session !== before && text !== "loading…") done(null);
      });
      const done = (value) => { observer.disconnect(); resolve(value); };
      observer.observe(status, { childList: true, characterData: true, subtree: true });
      byId("start").click();
    });
  }

  async function stepOnce() {  // null, or the message of the step's refusal
    let refusal = null;
    waiting.error = (e) => { refusal = e.message; };
    await N.step();
    waiting.error = null;
    return refusal;
  }

  // ---- 11. Experiments ----------------------------------------------------------------------

  function buildExperiments() {
    const prompt = h("textarea", { id: "exp-prompt", rows: 2, value: "Once upon a time" });
    const buttons = [["exp-repeat-run", "Run four times", runRepeat], ["exp-length-run", "Run both", runLength]]
      .map(([id, text, fn]) => { const b = h("button", { id }, text); b.addEventListener("click", fn); return b; });
    byId("lesson-experiments").append(
      label("prompt for the experiments", prompt),
      h("h3", {}, "(a) The same prompt four times"),
      note("Two runs at temperature 0 (greedy: no draw) and two at temperature 1 (each with its own seed). Tokens " +
           "that differ from run 1 at the same place are marked; the outlined one is where a pair first parts."),
      row(label("tokens per run", numberInput("exp-max", 24, 1, 128)), label("seed", numberInput("exp-seed", 0, 0, 2 ** 31 - 1)),
          buttons[0]),
      h("div", { id: "exp-repeat" }), h("p", { id: "exp-repeat-summary" }), errorLine("repeat"),
      h("h3", {}, "(b) Output length drives time and cost"),
      note("Each output token is one more pass through the model and one more billed token. Both runs below are " +
           "greedy with stop tokens off, so each makes exactly its number of tokens. On a CPU, 500 tokens of the " +
           "default model take from about 10 seconds to half a minute, depending on the machine."),
      row(label("lengths", h("input", { id: "exp-lengths", type: "text", value: "50, 500", size: 10 })),
          label("$ per million input tokens", numberInput("exp-price-in", 0.15, 0, 1000, 0.01)),
          label("$ per million output tokens", numberInput("exp-price-out", 0.6, 0, 1000, 0.01)), buttons[1]),
      h("div", { id: "exp-length-plot", className: "late-plot" }),
      h("div", { className: "scroll" }, h("table", { id: "exp-length-table", className: "late" })),
      h("div", { id: "exp-length-bars", className: "late-plot" }), h("p", { id: "exp-length-summary" }),
      errorLine("length"),
      h("h3", {}, "(c) Questions"),
      note("Pick an answer, then press “Show me”: the page runs a demonstration on the model and marks the " +
           "answer its numbers support."),
      h("ol", { id: "quiz", className: "quiz" }, ...QUIZ.map(question)));
  }

  const promptText = () => byId("exp-prompt").value;

  async function runRepeat() {
    const value = (id) => Number(byId(id).value);
    if (!promptText()) { refuse("repeat", "type a prompt"); return null; }
    const button = byId("exp-repeat-run");
    button.disabled = true;
    const d = await ask("repeat", "/explain/experiments/repeat",
                        { prompt: promptText(), max_tokens: value("exp-max"), seed: value("exp-seed") });
    button.disabled = false;
    if (d) renderRepeat(d);
    return d;
  }

  function renderRepeat(d) {
    const first = d.runs[0].tokens, pairs = [d.divergence.temperature_0, d.divergence.temperature_1];
    const runs = d.runs.map((run, k) => {
      const parting = k % 2 === 1 ? pairs[(k - 1) / 2] : null;  // runs 2 and 4 show where their pair parts
      const chips = run.tokens.map((t, j) => chip(t, [first[j]?.id === t.id ? "" : "diff", j === parting ? "parting" : ""]
        .join(" ")));
      return h("div", { className: "exp-run", dataset: { temperature: run.temperature, seed: run.seed ?? "",
                                                          tokens: JSON.stringify(run.tokens.map((t) => t.id)) } },
        h("div", { className: "dim" }, `run ${k + 1} · temperature ${run.temperature}` +
          (run.seed === null ? "" : ` · seed ${run.seed}`) + ` · ended by ${run.finish_reason}`),
        h("div", { className: "late-chips" }, ...chips));
    });
    byId("exp-repeat").replaceChildren(...runs);
    const summary = byId("exp-repeat-summary");
    Object.assign(summary.dataset, { t0: pairs[0] ?? "", t1: pairs[1] ?? "" });
    const part = (k, a, b) => (k === null ? `runs ${a} and ${b} are the same, token for token`
      : `runs ${a} and ${b} part at token ${k + 1}`);
    summary.textContent = `At temperature 0 ${part(pairs[0], 1, 2)}; at temperature 1 ${part(pairs[1], 3, 4)}. ` +
      "Once two runs differ in one token, each goes on from its own text, so they rarely meet again.";
  }

  function lengths() {  // the lengths typed, or null when they are not 1 to 4 numbers in 1..1000
    const list = byId("exp-lengths").value.split(/[\s,]+/).filter(Boolean).map(Number);
    const fine = list.length >= 1 && list.length <= 4 && list.every((n) => Number.isInteger(n) && n >= 1 && n <= 1000);
    return fine ? list : null;
  }

  async function runLength() {
    const list = lengths();
    if (!list) { refuse("length", "lengths: 1 to 4 whole numbers from 1 to 1000, separated by commas"); return null; }
    if (!promptText()) { refuse("length", "type a prompt"); return null; }
    const button = byId("exp-length-run");
    button.disabled = true;
    byId("exp-length-summary").textContent = `Generating ${list.join(" and ")} tokens…`;
    const d = await ask("length", "/explain/experiments/length", {
      prompt: promptText(), lengths: list, price_input: Number(byId("exp-price-in").value),
      price_output: Number(byId("exp-price-out").value) });
    button.disabled = false;
    if (d) renderLength(d);
    else byId("exp-length-summary").textContent = "";
    return d;
  }

  function cumulative(values) {  // cumulative([1, 2, 3]) [[1, 1], [2, 3], [3, 6]]
    let total = 0;
    return values.map((v, i) => [i + 1, (total += v)]);
  }

  function renderLength(d) {
    const name = (r) => `${r.tokens} tokens`;
    Plot.lines(byId("exp-length-plot"), d.runs.map((r, k) => ({ name: name(r), colour: PALETTE[k],
                                                                points: cumulative(r.step_seconds) })),
               { xLabel: "output tokens so far", yLabel: "seconds", yMin: 0 });
    const head = ["tokens", "total", "first token", "per token after", "cost"];
    byId("exp-length-table").replaceChildren(h("tr", {}, ...head.map((t) => h("th", {}, t))), ...d.runs.map((r) =>
      h("tr", { dataset: { tokens: r.tokens, seconds: r.seconds, perToken: r.seconds_per_token, cost: r.cost } },
        ...[String(r.tokens), `${r.seconds.toFixed(3)} s`, ms(r.first_token_seconds), ms(r.seconds_per_token)]
          .map((t) => h("td", { className: "num" }, t)),
        h("td", { className: "num", title: costTitle(r) }, usd(r.cost)))));
    const bars = byId("exp-length-bars");
    bars.replaceChildren(...[["total time", (r) => r.seconds, (v) => `${v.toFixed(3)} s`],
                             ["time per token", (r) => r.seconds_per_token, ms],
                             ["cost", (r) => r.cost, usd]].map(([title, get, format]) =>
      compareBars(title, d.runs.map((r, k) => ({ label: name(r), value: get(r), colour: PALETTE[k] })), format)));
    lengthSummary(d.runs);
  }

  const costTitle = (r) => `${r.prompt_tokens} input tokens ${usd(r.input_cost)} + ${r.tokens} output tokens ${usd(r.output_cost)}`;

  // Horizontal bars, one per run, to compare one number across the runs.
  function compareBars(title, items, format) {
    const width = 560, line = 22, top = 18, name = 100, area = 360;
    const max = Math.max(...items.map((i) => i.value), 1e-12);
    const root = svgRoot(width, top + items.length * line + 4);
    root.dataset.title = title;
    root.append(s("text", { x: 0, y: 12, "font-size": 12, "font-weight": 600 }, title));
    items.forEach((item, k) => {
      const y = top + k * line, w = Math.max((item.value / max) * area, 1);
      root.append(s("text", { x: name - 6, y: y + 15, "text-anchor": "end", "font-size": 12 }, item.label),
                  s("rect", { x: name, y: y + 3, width: w, height: line - 6, fill: item.colour, class: "cmp",
                              "data-label": item.label, "data-value": item.value }),
                  s("text", { x: name + w + 6, y: y + 15, "font-size": 12 }, format(item.value)));
    });
    return root;
  }

  function lengthSummary(runs) {
    const p = byId("exp-length-summary");
    if (runs.length < 2) { p.textContent = ""; return; }
    const [short, long] = [runs[0], runs.at(-1)].sort((a, b) => a.tokens - b.tokens);
    p.textContent = `${long.tokens} tokens took ${(long.seconds / short.seconds).toFixed(1)} times as long as ` +
      `${short.tokens} (${long.seconds.toFixed(2)} s against ${short.seconds.toFixed(2)} s) and cost ` +
      `${(long.cost / short.cost).toFixed(1)} times as much. Per token after the first: ${ms(short.seconds_per_token)} ` +
      `and ${ms(long.seconds_per_token)}; the first token also pays for reading the prompt. The total grows with ` +
      `the count: each token is one more pass through the model. Of the ${usd(long.cost)}, the prompt's ` +
      `${long.prompt_tokens} tokens cost ${usd(long.input_cost)} and the ${long.tokens} output tokens ${usd(long.output_cost)}.`;
  }

  // ---- 11 (c). Questions, each answered by a demonstration -------------------------------------

  // show() runs the demonstration and returns {answer: the index of the choice its numbers support,
  // evidence: the numbers in words, data: what the answer was computed from} or null on an error.
  const QUIZ = [
    { id: "temperature", question: "At temperature 0, does the same prompt give the same text every time?",
      choices: ["Yes: nothing is left to chance, each run takes the most likely token at every step",
                "No: every run rolls new dice, so the texts differ", "Only when the prompt is short"],
      show: showTemperature },
    { id: "letters", question: "Why does a model often miscount the letters in a word?",
      choices: ["It never sees the letters: the word reaches it as a few token ids",
                "It sees every letter but cannot count", "It skips letters it finds unimportant"],
      show: showLetters, extra: () => label("word", h("input", { id: "quiz-word", type: "text", value: "strawberry", size: 12 })) },
    { id: "cache", question: "What happens to the time per step without the KV cache?",
      choices: ["It grows with the text: every step runs all earlier tokens through the model again",
                "It stays the same as with the cache", "It drops: there is no cache to fill"],
      show: showCache },
    { id: "length", question: "What costs more time and money: the shorter or the longer answer of (b)?",
      choices: ["The longer: every output token is one more pass through the model and one more billed token",
                "The shorter: the model works harder to be brief", "Neither: the model writes its answer in one go"],
      show: showLength },
  ];

  function question(q, k) {
    const choices = q.choices.map((text, i) => h("li", { dataset: { choice: i } },
      h("label", {}, h("input", { type: "radio", name: `quiz-${q.id}`, value: String(i) }), ` ${text}`)));
    const button = h("button", { className: "show-me" }, "Show me");
    const item = h("li", { id: `quiz-${q.id}`, dataset: { question: q.id } },
      h("p", { className: "question" }, q.question), h("ol", { className: "choices", type: "A" }, ...choices),
      row(q.extra ? q.extra() : null, button), h("div", { className: "quiz-plot late-plot" }),
      h("p", { className: "evidence" }), errorLine(`quiz-${k}`));
    button.addEventListener("click", async () => {
      button.disabled = true;
      item.querySelector(".evidence").textContent = "Running the demonstration…";
      const shown = await q.show(`quiz-${k}`, item).catch((e) => {
        byId(`quiz-${k}-error`).textContent = `error: ${e.message}`;
        return null;
      });
      button.disabled = false;
      mark(item, shown);
    });
    return item;
  }

  function mark(item, shown) {
    const evidence = item.querySelector(".evidence");
    if (!shown) { evidence.textContent = ""; return; }
    Object.assign(item.dataset, { answer: shown.answer, data: JSON.stringify(shown.data) });
    for (const li of item.querySelectorAll(".choices > li")) li.classList.toggle("correct", Number(li.dataset.choice) === shown.answer);
    const picked = item.querySelector("input[type=radio]:checked");
    const verdict = !picked ? "" : Number(picked.value) === shown.answer ? " Your answer agrees."
      : " Your answer is not the one these numbers support.";
    evidence.textContent = shown.evidence + verdict;
  }

  async function showTemperature() {
    const d = await runRepeat();
    if (!d) return null;
    const ids = (k) => JSON.stringify(d.runs[k].tokens.map((t) => t.id));
    const same = ids(0) === ids(1), t1 = d.divergence.temperature_1;
    return { answer: same ? 0 : 1, data: { same, divergence: d.divergence },
             evidence: `The experiment in (a) ran twice at temperature 0: the two texts are ` +
               (same ? "identical, token for token. " : `different from token ${d.divergence.temperature_0 + 1} on. `) +
               `At temperature 1 the two runs ${t1 === null ? "happened to agree" : `parted at token ${t1 + 1}`}.` };
  }

  async function showLetters(view) {
    const word = byId("quiz-word").value.trim();
    if (!word) { refuse(view, "type a word"); return null; }
    const d = await ask(view, "/explain/tokens", { text: ` ${word}` });  // as inside a sentence
    if (!d) return null;
    const letters = [...word].length, pieces = d.pieces.map((p) => `${quote(p.text)} = ${p.id}`).join(", ");
    return { answer: d.tokens < letters ? 0 : 1, data: { letters, tokens: d.tokens, ids: d.pieces.map((p) => p.id) },
             evidence: `“${word}” has ${letters} letters; the model receives ${d.tokens} ` +
               `number${d.tokens > 1 ? "s" : ""}: ${pieces}. ` + (d.tokens < letters
               ? "None of them spells a letter out, so counting means recalling how each piece is spelled."
               : "Here each letter is a piece of its own: the model does see the letters of this word.") };
  }

  async function showCache(view, item) {
    const prompt = Array.from({ length: QUIZ_REPEAT }, () => promptText() || "Once upon a time").join(" ");
    const cached = await timedSteps(view, prompt, true), uncached = cached && await timedSteps(view, prompt, false);
    if (!uncached) return null;
    const decode = (steps) => steps.slice(1);  // the first step of both reads the whole prompt
    const mean = (steps) => decode(steps).reduce((a, r) => a + r.seconds, 0) / decode(steps).length;
    const grows = decode(uncached).every((r, i, all) => i === 0 || r.tokens > all[i - 1].tokens);
    const [withCache, without] = [mean(cached), mean(uncached)];
    Plot.lines(item.querySelector(".quiz-plot"), [
      { name: "with the KV cache", colour: PALETTE[0], points: cached.map((r) => [r.index + 1, r.seconds * 1000]) },
      { name: "without", colour: PALETTE[1], points: uncached.map((r) => [r.index + 1, r.seconds * 1000]) }],
               { xLabel: "step", yLabel: "ms per step", yMin: 0 });
    const answer = grows && without > withCache ? 0 : without < withCache ? 2 : 1;
    const fed = decode(uncached).map((r) => r.tokens);
    return { answer, data: { cached, uncached },
             evidence: `Two sessions on the prompt of (a) repeated ${QUIZ_REPEAT} times, ${QUIZ_STEPS} greedy steps ` +
               `each. With the cache each step after the first fed 1 token and took ${ms(withCache)} on average; ` +
               `without it the steps fed ${fed.join(", ")} tokens and took ${ms(without)} on average.` };
  }

  // QUIZ_STEPS greedy steps on a session of its own (deleted after), so the learner's tree is untouched.
  async function timedSteps(view, prompt, useCache) {
    const started = await ask(view, "/explain/sessions", { prompt });
    if (!started) return null;
    const steps = [];
    try {
      for (let i = 0; i < QUIZ_STEPS; i++) {
        const v = await ask(view, sessionPath(started.session, "step"), { temperature: 0, top_n: 1, use_cache: useCache });
        if (!v) return null;
        steps.push({ index: v.step.index, tokens: v.timing.tokens, seconds: v.timing.seconds, cached: v.timing.cached });
      }
      return steps;
    } finally {
      await N.api("DELETE", `/explain/sessions/${started.session}`).catch(() => {});
    }
  }

  async function showLength() {
    const d = await runLength();
    if (!d) return null;
    if (d.runs.length < 2) return { answer: 2, data: { runs: d.runs }, evidence: "Give (b) two lengths to compare." };
    const [short, long] = [d.runs[0], d.runs.at(-1)].sort((a, b) => a.tokens - b.tokens);
    const more = (key) => Math.sign(long[key] - short[key]);
    const answer = more("seconds") > 0 && more("cost") > 0 ? 0 : more("seconds") < 0 && more("cost") < 0 ? 1 : 2;
    return { answer, data: { short, long },
             evidence: `The experiment in (b): ${short.tokens} tokens took ${short.seconds.toFixed(3)} s and cost ` +
               `${usd(short.cost)}; ${long.tokens} tokens took ${long.seconds.toFixed(3)} s and cost ${usd(long.cost)}.` };
  }

  // ---- wiring -------------------------------------------------------------------------------

  function clearStepViews() {
    for (const id of ["logit-bars", "logit-mass", "logit-ratio", "logit-rest", "draw-bar", "draw-note", "draw-table",
                      "stop-reason"]) byId(id).replaceChildren();
  }

  N.on("session", (data) => {
    history.clear();
    Object.assign(path, { tree: data.tree, current: 0 });
    clearStepViews();
    renderLoop();
    renderStop(null);
    byId("loop-cache").replaceChildren();
    renderMeter(data.prompt.length, data.model.context);
  });
  N.on("step", (view) => {
    record(view);
    Object.assign(path, { tree: view.tree, current: view.current });
    renderLogits(view);
    drawOfStep(view);
    renderLoop();
    renderCache(view);
    renderStop(view);
    renderMeter(view.context.used, view.context.limit);
  });
  N.on("redraw", (drawn) => { nextTicket("draw"); renderDraw(drawn, N.state.view.step.token_id); });
  N.on("goto", (view) => {
    Object.assign(path, { tree: view.tree, current: view.current });
    clearStepViews();
    renderLoop();
    renderStop(null);
    renderMeter(N.state.prompt.length + view.generated.length, N.state.model.context);
  });
  N.on("error", (e) => { if (waiting.error) waiting.error(e); });

  buildLogits();
  buildDraw();
  buildLoop();
  buildStop();
  buildContext();
  buildExperiments();
})();
