// Section 11 (d) of the lesson: speculative decoding, shown (POST /explain/experiments/speculative).
// Prompt lookup drafts the next tokens from the text so far; the model checks a whole draft in one
// forward pass. Each token is coloured by its draft's fate; a refused one shows what the drafter
// proposed next to the model's distribution there.

import { viewRequests } from "../api.js";
import { byId, errorLine, h, label, note, numberInput, row, tokenChip as chip } from "../dom.js";
import { pct, quote } from "../format.js";
import * as Plot from "../plot.js";

const { ask } = viewRequests();

// A prompt whose answer repeats its context, so that lookups find drafts the model agrees with.
const COPY_PROMPT = "Copy the text exactly.\nText: The quick brown fox jumps over the lazy dog. The dog sleeps in " +
  "the sun, and the fox runs into the woods.\nCopy: The quick brown fox";
const STATES = { undrafted: "not drafted", accepted: "drafted, accepted", rejected: "drafted, refused" };
const COLOURS = { proposal: "#dc2626", taken: "#16a34a", other: "#93c5fd" };

export function build() {
  const run = h("button", { id: "spec-run" }, "Run with drafts");
  run.addEventListener("click", runSpeculative);
  byId("lesson-experiments").append(
    h("h3", {}, "(d) Speculative decoding: drafts checked in one pass"),
    note("A cheap drafter guesses the next tokens (here prompt lookup: what followed the last time the latest " +
         "tokens appeared), and the model checks all the guesses in one forward pass. Greedy takes a draft when it " +
         "is the model's most likely token; sampling takes it with probability p(draft), else draws from p without " +
         "it. So the text is the model's own, and every accepted draft is a token for a fraction of a pass."),
    label("prompt", h("textarea", { id: "spec-prompt", rows: 3, value: COPY_PROMPT })),
    row(label("tokens", numberInput("spec-max", 48, 1, 256)), label("draft tokens", numberInput("spec-k", 5, 1, 16)),
        label("temperature", numberInput("spec-temperature", 0, 0, 2, 0.1)),
        label("seed", numberInput("spec-seed", 0, 0, 2 ** 31 - 1)), run),
    h("p", { className: "spec-legend" }, ...Object.entries(STATES).map(([state, text]) =>
      h("span", { className: `late-chip spec-${state}` }, text))),
    h("div", { id: "spec-tokens", className: "late-chips" }), h("p", { id: "spec-summary" }),
    h("div", { id: "spec-detail" }), errorLine("speculative"));
}

async function runSpeculative() {
  const value = (id) => Number(byId(id).value), button = byId("spec-run");
  button.disabled = true;
  const d = await ask("speculative", "/explain/experiments/speculative", {
    prompt: byId("spec-prompt").value, max_tokens: value("spec-max"), draft_tokens: value("spec-k"),
    temperature: value("spec-temperature"), seed: value("spec-seed") });
  button.disabled = false;
  if (d) render(d);
}

function render(d) {
  const chips = d.tokens.map((t) => {
    const c = chip(t, `spec-${t.state}`);
    Object.assign(c.dataset, { state: t.state, index: t.index });
    c.title = `token ${t.index + 1}: ${STATES[t.state]} (id ${t.id})`;
    if (t.state === "rejected") {
      Object.assign(c, { tabIndex: 0, role: "button" });
      c.dataset.proposal = t.proposal.id;
      c.addEventListener("click", () => showRefusal(t));
      c.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") showRefusal(t); });
    }
    return c;
  });
  byId("spec-tokens").replaceChildren(...chips);
  const summary = byId("spec-summary");
  Object.assign(summary.dataset, { drafted: d.drafted, accepted: d.accepted, rejected: d.rejected,
                                   acceptance: d.acceptance, tokensPerForward: d.tokens_per_forward, forwards: d.forwards });
  const dropped = d.drafted - d.accepted - d.rejected;
  summary.textContent = `${d.drafted} tokens drafted: ${d.accepted} accepted, ${d.rejected} refused` +
    (dropped ? `, ${dropped} never checked (they came after a refusal, or past the end)` : "") +
    `; acceptance ${pct(d.acceptance)}. After the first token (the prompt's pass) the model made ` +
    `${d.tokens.length - 1} tokens in ${d.forwards} forward passes: ${d.tokens_per_forward.toFixed(2)} per pass, ` +
    "where plain decoding makes 1." + (d.rejected ? " Click a refused (red) token to see why." : "");
  const first = d.tokens.find((t) => t.state === "rejected");
  if (first) showRefusal(first);
  else byId("spec-detail").replaceChildren();
}

// The draft's proposal next to the model's distribution where it was refused.
function showRefusal(t) {
  for (const c of byId("spec-tokens").children) c.classList.toggle("shown", c.dataset.index === String(t.index));
  const listed = t.rows.some((r) => r.id === t.proposal.id);
  const rows = listed ? t.rows : [...t.rows, { ...t.proposal, outside: true }];
  const items = rows.map((r) => ({
    id: r.id, value: r.p, label: (r.outside ? "… " : "") + quote(r.text),
    colour: r.id === t.proposal.id ? COLOURS.proposal : r.id === t.id ? COLOURS.taken : COLOURS.other }));
  const plot = h("div", { className: "late-plot" });
  plot.append(Plot.compareBars(`the model's distribution at token ${t.index + 1}`, items, pct));
  byId("spec-detail").replaceChildren(h("div", {
    className: "spec-refusal", dataset: { index: t.index, proposal: t.proposal.id, taken: t.id, p: t.proposal.p } },
    h("p", {}, `At token ${t.index + 1} the drafter proposed ${quote(t.proposal.text)} (red), which the model gave ` +
      `${pct(t.proposal.p)}; it took ${quote(t.text)} (green) instead` +
      (listed ? "." : `; the proposal is not among the model's ${t.rows.length} most likely tokens here.`)),
    plot));
}
