// Section 1 of the lesson, Tokens: a text of the reader's own split into pieces (ids and bytes), what
// its tokens cost, and why counting letters is hard. The numbers come from POST /explain/tokens.

import { viewRequests } from "../api.js";
import { on } from "../app.js";
import { byId, debounce, errorLine, h, label, note, numberInput, row } from "../dom.js";
import { quote, usd, visible } from "../format.js";

const { nextTicket, ask } = viewRequests();

const TEXT = "The ophthalmologist counted the r's in strawberry";
const LETTER = /[\p{L}\p{N}]/u;

export function build() {
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
  // a new session: an API key that was missing has been typed now
  on("session", () => { if (byId("tok-error").textContent) refreshTokens(); });
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
           h("span", { className: "piece-text" }, visible(piece.text)),
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
