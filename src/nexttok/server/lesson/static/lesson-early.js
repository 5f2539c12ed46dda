// Sections 1-5 of the lesson: tokens, embeddings, position, attention, layers (logit lens).
// Every number shown comes from a JSON route (server/lesson.py); this file lays the numbers out,
// puts words around them and keeps what it shows in data-* attributes, so a test can read it back.
// The capture views (the attention matrix, one head by hand, the logit lens) cost the server an
// extra forward pass, so they are fetched only while their section is open.
"use strict";

(() => {  // a scope of its own: app.js and lesson-late.js declare top-level names as well
  const N = window.nexttok;
  const byId = (id) => document.getElementById(id);
  const TYPING_DELAY_MS = 300;  // one request per pause in typing, not one per key
  const SHOWN_DIMS = 8;  // numbers shown per vector in the worked attention: enough to follow by eye
  const CACHE_ENTRIES = 64;  // capture views kept per session (a node's views never change)

  // ---- small helpers ----------------------------------------------------------------------

  const h = N.h;  // h(tag, props, ...children): an element (app.js)

  const label = (text, input) => h("label", {}, `${text} `, input);
  const row = (...items) => h("div", { className: "row" }, ...items);
  const note = (text, id) => h("p", { className: "note", ...(id ? { id } : {}) }, text);
  const quote = (text) => `“${N.visible(text)}”`;
  const num = (v) => Plot.fmt(v);
  // A probability as a percentage that stays readable when tiny: 0.92 "92.00%", 7.2e-5 "0.0072%".
  const pct = (p) => (p === 0 || p >= 1e-3 ? N.pct(p) : `${(100 * p).toPrecision(2)}%`);
  const isOpen = (sectionId) => byId(sectionId).open;
  const numberInput = (id, value, min, max, step) =>
    h("input", { id, type: "number", value: String(value), min: String(min), max: String(max), step: String(step) });

  // Dollars readable at any size, never in e-notation: usd(302.1) "$302.10", usd(2.1e-6) "$0.0000021".
  function usd(x) {
    const digits = x >= 1 ? { minimumFractionDigits: 2, maximumFractionDigits: 2 } : { maximumSignificantDigits: 3 };
    return `$${x.toLocaleString("en-US", digits)}`;
  }

  function debounce(fn, ms = TYPING_DELAY_MS) {
    let timer = null;
    return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
  }

  // Runs `load` whenever the section is opened (and now, if it already is).
  function onOpen(sectionId, load) {
    const section = byId(sectionId);
    section.addEventListener("toggle", () => { if (section.open) load(); });
    if (section.open) load();
  }

  // ---- requests: the newest answer wins, errors stay on the view's own line -----------------

  const cache = new Map();  // capture views of this session: path + body -> answer
  const errorLine = (view) => h("p", { className: "error", id: `${view}-error`, role: "status" });
  const { nextTicket, refuse, ask } = N.viewRequests();

  async function askCached(view, path, body) {
    const key = `${path} ${JSON.stringify(body)}`;
    if (cache.has(key)) {
      nextTicket(view);  // an answer still in flight for an older choice must not replace this one
      byId(`${view}-error`).textContent = "";
      return cache.get(key);
    }
    const data = await ask(view, path, body);
    if (data) {
      cache.set(key, data);
      if (cache.size > CACHE_ENTRIES) cache.delete(cache.keys().next().value);  // the oldest
    }
    return data;
  }

  // The node the capture views describe: the shown step's node (its input is what the step read,
  // so the lens ends in the table's top token and the matrix's last row is the "last position"
  // view above), or, before any step, the current node (what the next Step will read).
  const where = { node: null };
  const sessionPath = (view) => `/explain/sessions/${N.state.session}/${view}`;
  const withNode = (body) => (where.node === null ? body : { ...body, node: where.node });

  // ---- 1. Tokens ----------------------------------------------------------------------------

  const TEXT = "The ophthalmologist counted the r's in strawberry";
  const LETTER = /[\p{L}\p{N}]/u;

  function buildTokens() {
    const text = h("textarea", { id: "tok-text", rows: 2, value: TEXT, ariaLabel: "text to split into tokens" });
    const prices = [numberInput("tok-price-in", 0.15, 0, 1000, 0.01), numberInput("tok-price-out", 0.6, 0, 1000, 0.01),
                    numberInput("tok-output", 500, 0, 10000000, 1)];
    const word = h("input", { id: "tok-word", type: "text", value: "strawberry", size: 14 });
    const letter = h("input", { id: "tok-letter", type: "text", value: "r", size: 2, maxLength: 1 });
    byId("lesson-tokens").append(
      h("h3", {}, "Your own text ", h("span", { className: "dim" }, "(each piece: its text, id and bytes)")),
      text, h("div", { id: "tok-pieces", className: "pieces" }), note("", "tok-split"), errorLine("tok"),
      h("h3", {}, "How many tokens, and what they cost"),
      row(label("$ per million input tokens", prices[0]), label("$ per million output tokens", prices[1]),
          label("expected output tokens", prices[2])),
      h("p", { id: "tok-stats" }),
      note("Providers bill per token, not per word or character, and output tokens usually cost more than " +
           "input: the prompt goes through the model in one pass, while every output token needs a pass of its own."),
      h("h3", {}, "Why counting letters is hard"), row(label("word", word), label("letter", letter)),
      h("div", { id: "tok-letters" }), errorLine("letters"));
    for (const input of [text, ...prices]) input.addEventListener("input", debounce(refreshTokens));
    for (const input of [word, letter]) input.addEventListener("input", debounce(refreshLetters));
    refreshTokens();
    refreshLetters();
  }

  async function refreshTokens() {
    const value = (id) => Number(byId(id).value);
    const data = await ask("tok", "/explain/tokens", { text: byId("tok-text").value, price_input: value("tok-price-in"),
                                                      price_output: value("tok-price-out"),
                                                      output_tokens: value("tok-output") });
    if (!data) return;
    renderPieces(data.pieces);
    renderCost(data);
  }

  // Pieces that spell one word together: a piece continues the word before it when letters meet
  // across the cut, or when it starts with a UTF-8 continuation byte (one character cut in two).
  function words(pieces) {
    const groups = [];
    for (const piece of pieces) {
      const last = groups.at(-1);
      if (last && continues(last.at(-1), piece)) last.push(piece);
      else groups.push([piece]);
    }
    return groups;
  }

  function continues(before, piece) {
    const first = parseInt(piece.bytes.slice(0, 2), 16);
    if (first >= 0x80 && first < 0xc0) return true;
    return LETTER.test(before.text.at(-1) ?? "") && LETTER.test(piece.text[0] ?? "");
  }

  const bytesOf = (pieces) => pieces.flatMap((p) => (p.bytes ? p.bytes.split(" ").map((b) => parseInt(b, 16)) : []));
  const spelled = (pieces) => new TextDecoder().decode(new Uint8Array(bytesOf(pieces))).trim();

  function pieceChip(piece, split, extra = null) {
    return h("span", { className: split ? "piece split" : "piece", title: `id ${piece.id} · bytes ${piece.bytes}`,
                       dataset: { id: piece.id, bytes: piece.bytes } },
             h("span", { className: "piece-text" }, N.visible(piece.text)),
             h("small", {}, `id ${piece.id}`), h("small", { className: "bytes" }, extra ?? piece.bytes));
  }

  function renderPieces(pieces) {
    const groups = words(pieces);
    const split = groups.filter((g) => g.length > 1);
    byId("tok-pieces").replaceChildren(...groups.flatMap((g) => g.map((p) => pieceChip(p, g.length > 1))));
    const box = byId("tok-split");
    box.dataset.split = JSON.stringify(split.map((g) => g.map((p) => p.id)));
    box.replaceChildren(splitNote(split), bytesNote(pieces));
  }

  function splitNote(split) {
    if (!split.length) return "Every word here is a single piece. Try a rare, long or made-up word. ";
    const longest = split.reduce((a, b) => (b.length > a.length ? b : a));
    return `The tokenizer has no single piece for “${spelled(longest)}”, so it arrives as ${longest.length} pieces: ` +
      `${longest.map((p) => quote(p.text)).join(" + ")}. Rare words cost more tokens, and the model has to put ` +
      "their meaning together from fragments. Highlighted: every word split like this. ";
  }

  function bytesNote(pieces) {
    if (!pieces.some((p) => p.text.includes("\\x"))) return "";
    return "A piece shown as \\xNN is one raw byte: UTF-8 writes this character with several bytes and the " +
      "tokenizer cut between them, so the model receives parts of a character.";
  }

  function renderCost(d) {
    const stats = byId("tok-stats");
    Object.assign(stats.dataset, { tokens: d.tokens, characters: d.characters, words: d.words, inputCost: d.input_cost,
                                   outputCost: d.output_cost, cost: d.cost, outputTokens: d.output_tokens,
                                   priceInput: d.price_input, priceOutput: d.price_output });
    const perToken = d.tokens ? (d.characters / d.tokens).toFixed(2) : "–";
    stats.replaceChildren(
      `${d.tokens} tokens for ${d.characters} characters and ${d.words} words: ${perToken} characters per token. `,
      `As input they cost ${usd(d.input_cost)}; ${d.output_tokens} output tokens cost ${usd(d.output_cost)}; `,
      h("strong", { id: "tok-cost" }, `together ${usd(d.cost)}`),
      ` per request, ${usd(d.cost * 1e6)} for a million such requests.`);
  }

  async function refreshLetters() {
    const word = byId("tok-word").value.trim();
    if (!word) {
      nextTicket("letters");
      byId("tok-letters").replaceChildren();
      return;
    }
    const data = await ask("letters", "/explain/tokens", { text: ` ${word}` });  // as inside a sentence
    if (data) renderLetters(word, byId("tok-letter").value, data.pieces);
  }

  function renderLetters(word, letter, pieces) {
    const count = (text) => (letter ? [...text.toLowerCase()].filter((c) => c === letter.toLowerCase()).length : 0);
    const letters = [...word];
    const ids = pieces.map((p) => p.id).join(", ");
    const box = byId("tok-letters");
    Object.assign(box.dataset, { ids: JSON.stringify(pieces.map((p) => p.id)), letters: letters.length,
                                 count: count(word) });
    const chips = pieces.map((p) => pieceChip(p, false, `${count(spelled([p]))} × ${letter || "?"}`));
    box.replaceChildren(
      h("p", {}, `You read “${word}” as ${letters.length} letters, ${letters.join("-")}, ${count(word)} of them ` +
        `“${letter}”. The model receives ${pieces.length} number${pieces.length > 1 ? "s" : ""}: ${ids}.`),
      h("div", { className: "pieces" }, ...chips),
      note(`An id is a row number in the model's table of vectors; nothing in ${ids} spells out a letter. To say ` +
           `how many “${letter}” there are, the model must have picked up the spelling of each piece from its ` +
           "training text and add it up across pieces it never sees letter by letter. That is why counting " +
           "letters or reversing a word trips models up, although a reader of the letters finds it trivial."));
  }

  // ---- 2. Embeddings ------------------------------------------------------------------------

  const WORDS = "king, queen, prince, princess, apple, banana, orange, car, truck, road";

  function buildEmbeddings() {
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
      `The vector has ${d.dimensions} numbers (length ${num(d.norm)}); the first ${d.vector.length}:`;
    const box = byId("emb-vector");
    box.dataset.values = JSON.stringify(d.vector);
    const strip = h("div");
    box.replaceChildren(h("div", { className: "vec wrap" }, d.vector.map(num).join("  ")), strip);
    Plot.heatmap(strip, [d.vector], { cell: 22, signed: true });
    strip.append(h("small", { className: "dim" }, "blue: above 0, red: below 0"));
  }

  function renderNeighbors(d) {
    const header = h("tr", {}, ...["#", "token", "id", "cosine", ""].map((t) => h("th", {}, t)));
    const rows = d.neighbors.map((n, i) => h("tr", { dataset: { id: n.id, cosine: n.cosine } },
      h("td", { className: "num" }, String(i + 1)), h("td", { className: "tok" }, N.visible(n.text)),
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

  // ---- 3. Position --------------------------------------------------------------------------

  function buildPosition() {
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
    const last = d.frequencies.length - 1, turn = (f) => num((2 * Math.PI) / f);
    const view = byId("pos-view");
    view.dataset.kind = "rope";
    view.replaceChildren(
      h("h3", {}, "Rotary position embedding, RoPE (this model)"),
      note("Nothing is added to the vectors. Instead each query and key is cut into pairs of numbers, and each pair " +
           "is turned by an angle: its position times the pair's speed. Pair 0 turns " +
           `${num(d.frequencies[0])} radians per position (a full turn every ${turn(d.frequencies[0])} positions); ` +
           `pair ${last} turns ${num(d.frequencies[last])} (a turn every ${turn(d.frequencies[last])}). ` +
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

  // ---- 4. Attention -------------------------------------------------------------------------

  const PRESETS = ["The animal didn't cross the street because it was too tired",
                   "The trophy didn't fit in the suitcase because it was too big",
                   "Sarah put the laptop in the bag because it was heavy"];
  const att = { matrix: null, query: null, pronoun: null };  // query null: the last row, as the text grows

  function buildAttention() {
    const layer = h("select", { id: "att-layer" }), head = h("select", { id: "att-head" });
    const preset = h("select", { id: "att-preset" }, h("option", { value: "" }, "a sentence with a pronoun…"),
                     ...PRESETS.map((s) => h("option", { value: s }, s)));
    byId("lesson-attention").append(
      h("h3", {}, "Every position at once ", h("span", { className: "dim" }, "(click a token or a cell to see its row)")),
      note("Row i is token i looking back: its weights over itself and every earlier token add up to 1. Later " +
           "tokens stay blank, because a token may not look ahead. Each head learns its own way of looking; " +
           "“mean” averages the heads of a layer."),
      row(label("layer", layer), label("head", head), label("start with", preset)),
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
  }

  function fillSelectors(model) {
    const options = (n) => Array.from({ length: n }, (_, i) => h("option", { value: String(i) }, String(i)));
    const keep = (select, fresh) => {
      const before = select.value;
      select.replaceChildren(...fresh);
      if ([...select.options].some((o) => o.value === before)) select.value = before;
    };
    keep(byId("att-layer"), options(model.layers));
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
    if (!isOpen("sec-attention") || !N.state.session || byId("att-layer").value === "") return;
    const body = withNode({ layer: Number(byId("att-layer").value), head: chosenHead() });
    const d = await askCached("att", sessionPath("attention"), body);
    if (d) renderMatrix(d);
  }

  function renderMatrix(d) {
    att.matrix = d;
    const labels = d.tokens.map((t) => N.visible(t.text));
    const box = byId("att-matrix");
    Object.assign(box.dataset, { node: d.node, layer: d.layer, head: d.head ?? "mean",
                                 tokens: JSON.stringify(d.tokens.map((t) => t.id)) });
    const svg = Plot.heatmap(box, d.weights, { rowLabels: labels, colLabels: labels, max: 1, onCell: (i) => choose(i) });
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
    h("span", { className: "piece-text" }, N.visible(t.text)), h("small", {}, pct(weights[j])))));
  }

  async function refreshDetail(query) {
    if (!isOpen("sec-attention")) return;
    const head = chosenHead() ?? 0;  // the mean of the heads has no q of its own: head 0 stands in
    const d = await askCached("detail", sessionPath("attention/detail"),
                              withNode({ layer: Number(byId("att-layer").value), head, query }));
    if (d) renderDetail(d, chosenHead() === null);
  }

  // Two small tables, in the order of the computation: scores and softmax, then the weighted sum.
  function renderDetail(d, forMean) {
    const shown = Math.min(SHOWN_DIMS, d.head_dim), cut = (v) => v.slice(0, SHOWN_DIMS);
    const vec = (v) => h("span", { className: "vec" }, cut(v).map(num).join(" ") + (v.length > SHOWN_DIMS ? " …" : ""));
    const token = (j) => h("td", { className: "tok" }, N.visible(d.tokens[j].text));
    const th = (...names) => h("tr", {}, ...names.map((t) => h("th", {}, t)));
    byId("att-detail-note").textContent = `Query ${quote(d.tokens[d.query].text)} (position ${d.query}), layer ` +
      `${d.layer}, head ${d.head}${forMean ? " (the mean has no q of its own, so head 0 is worked out)" : ""}. ` +
      `Each vector has d = ${d.head_dim} numbers, √d = ${num(d.scale)}; the first ${shown} are shown (the dot ` +
      "products use all of them).";
    const box = byId("att-detail");
    Object.assign(box.dataset, { node: d.node, layer: d.layer, head: d.head, query: d.query, first: d.first,
                                 q: JSON.stringify(cut(d.q)), output: JSON.stringify(cut(d.output)) });
    const keys = d.keys.map((k, r) => h("tr", {
      dataset: { key: d.first + r, score: d.scores[r], weight: d.weights[r], modelWeight: d.model_weights[r],
                 k: JSON.stringify(cut(k)) } },
    h("td", { className: "num" }, String(d.first + r)), token(d.first + r), h("td", { className: "num" }, num(d.scores[r])),
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

  // ---- 5. Layers (logit lens) ---------------------------------------------------------------

  function buildLayers() {
    byId("lesson-layers").append(
      note("The vector of the last token passes through the layers one after another; each adds its part. The " +
           "lens stops the model after each layer and applies the final norm and the output matrix to the vector " +
           "as it is there: what would the model predict if it ended at this layer? Layer 0 is the embedding " +
           "alone; the last row is the model's real prediction (the top of the table in section 6)."),
      h("p", { id: "lens-title" }),
      h("div", { className: "scroll" }, h("table", { id: "lens-table", className: "early lens" })),
      h("div", { id: "lens-plot", className: "half" }), h("p", { id: "lens-summary" }), errorLine("lens"));
    onOpen("sec-layers", refreshLens);
  }

  async function refreshLens() {
    if (!isOpen("sec-layers") || !N.state.session) return;
    const d = await askCached("lens", sessionPath("lens"), withNode({ top_n: 5 }));
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
             h("span", { className: "tok" }, N.visible(t.text)), " ", h("small", {}, pct(t.p)));
  }

  function lensSummary(d) {
    const start = d.layers[0], last = d.layers.at(-1), first = d.layers.find((l) => l.final_rank === 1) ?? last;
    const rise = first.layer === last.layer ? "only wins at the last layer" : `first reaches rank 1 at layer ${first.layer}`;
    byId("lens-summary").textContent = `${quote(d.final.text)} starts at rank ${start.final_rank} ` +
      `(p ${pct(start.final_p)}) after the embeddings, ${rise}, and ends with p ${pct(last.final_p)}.`;
  }

  // ---- wiring -------------------------------------------------------------------------------

  function refreshCaptures() {  // each checks that its own section is open
    refreshMatrix();
    refreshLens();
  }

  N.on("session", (data) => {
    where.node = null;
    cache.clear();
    att.query = null;
    fillSelectors(data.model);
    if (byId("tok-error").textContent) refreshTokens();  // say the key was missing: it has been typed now
    refreshCaptures();
  });
  N.on("step", (view) => { where.node = view.node; refreshCaptures(); });
  N.on("goto", (view) => { where.node = view.current; refreshCaptures(); });

  buildTokens();
  buildEmbeddings();
  buildPosition();
  buildAttention();
  buildLayers();
})();
