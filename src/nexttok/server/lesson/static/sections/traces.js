// Section 11 (c) of the lesson: two traces side by side, as `nexttok diff A B` shows them. A trace is
// a run recorded as JSON Lines (`nexttok run --trace FILE`, a run of (a), or the session's path:
// POST /explain/sessions/{id}/trace); the server reads both strictly and compares them
// (POST /explain/traces/diff). diffView is also how (a) shows each of its pairs.

import { sessionPath, viewRequests } from "../api.js";
import { state } from "../app.js";
import { byId, errorLine, h, label, note, row, tokenChip as chip } from "../dom.js";
import { pct, quote } from "../format.js";
import * as Plot from "../plot.js";

const { refuse, ask } = viewRequests();
const sides = { a: null, b: null };  // each side's trace: {name, lines: [JSON text of each line]}

// lines of a file's text as Python's splitlines reads a trace: no empty line after the last newline
export const fileLines = (text) => text.split(/\r\n|\n|\r/).filter((line, i, all) => i < all.length - 1 || line);

// The diff of two runs: both runs' tokens (the token where they part outlined, the ones after it
// marked), then a panel with each run's token there and its probability, the gap p(A) − p(B) and
// whether it is a near tie, and the text each run went on with. labels: [{title, dataset, extra}]
// per run (default title: the trace's name).
export function diffView(view, labels = []) {
  const index = view.index;
  const runs = view.runs.map((run, k) => {
    const classes = (j) => (index === null ? "" : j === index ? "parting" : j > index ? "parted" : "");
    const own = labels[k] ?? {};
    return h("div", { className: "exp-run", dataset: { name: run.name, tokens: JSON.stringify(run.tokens.map((t) => t.id)),
                                                        ...(own.dataset ?? {}) } },
      h("div", { className: "dim" }, `${"AB"[k]}: ${own.title ?? run.name} · ${run.tokens.length} tokens · ended by ` +
        run.finish_reason, own.extra ?? null),
      h("div", { className: "late-chips" }, ...run.tokens.map((t, j) => chip(t, classes(j)))));
  });
  return h("div", { className: "trace-diff", dataset: { index: index ?? "", identical: view.identical } },
           ...runs, diffPanel(view));
}

function diffPanel(view) {
  const panel = h("div", { className: "diff-panel", dataset: { gap: view.gap ?? "", nearTie: view.near_tie } });
  const [a, b] = view.runs;
  if (view.identical) {
    panel.append(h("p", { className: "verdict" }, `Identical: the same ${a.tokens.length} tokens, token for token.`));
  } else {
    const head = ["run", `token ${view.index + 1}`, "p", "then went on with"].map((t) => h("th", {}, t));
    const line = (run, k) => h("tr", { dataset: { run: "AB"[k], id: run.at?.id ?? "", p: run.at?.p ?? "" } },
      h("td", {}, "AB"[k]), h("td", { className: "tok" }, run.at ? quote(run.at.text) : "(had ended)"),
      h("td", { className: "num" }, run.at ? pct(run.at.p) : ""), h("td", { className: "after" }, quote(run.after)));
    panel.append(
      h("p", {}, `The same ${view.index} tokens, then the runs part at token ${view.index + 1}:`),
      h("div", { className: "scroll" }, h("table", { className: "late" }, h("tr", {}, ...head), line(a, 0), line(b, 1))));
    if (a.at && b.at) {
      panel.append(Plot.compareBars("probability of each run's token there", [a, b].map((run, k) =>
        ({ label: `${"AB"[k]} ${quote(run.at.text)}`, value: run.at.p, colour: Plot.PALETTE[k], id: run.at.id })), pct));
    }
    panel.append(h("p", { className: "verdict" }, verdict(view)));
  }
  if (view.settings.length) {
    panel.append(h("p", { className: "dim settings" }, "Settings that differ: " + view.settings.map((s) =>
      `${s.what} A ${JSON.stringify(s.a)}, B ${JSON.stringify(s.b)}`).join("; ")));
  }
  return panel;
}

function verdict(view) {
  if (view.gap === null) return "One run ended there while the other went on.";
  const gap = `Gap p(A) − p(B) = ${view.gap >= 0 ? "+" : "−"}${pct(Math.abs(view.gap))}: `;  // pct stays readable when tiny
  return gap + (view.near_tie
    ? `a near tie (the two log-probabilities within ${view.near_tie_nats} nats): a rounding or any draw can part runs here.`
    : "not a near tie: the runs parted by a choice (a draw, other settings or another model), not on a rounding.");
}

export function build() {
  const side = (key) => {
    const file = h("input", { id: `trace-file-${key}`, type: "file", accept: ".jsonl,.json,application/json" });
    file.addEventListener("change", () => loadFile(key, file));
    const session = h("button", { id: `trace-session-${key}` }, "the session's trace");
    session.addEventListener("click", () => takeSession(key));
    return row(h("strong", {}, key.toUpperCase()), label("a trace file", file), session,
               h("span", { id: `trace-name-${key}`, className: "dim" }, "(none yet)"));
  };
  const compare = h("button", { id: "trace-compare" }, "Compare");
  compare.addEventListener("click", compareSides);
  const download = h("button", { id: "trace-download" }, "Download the session's trace");
  download.addEventListener("click", downloadSession);
  byId("lesson-experiments").append(
    h("h3", {}, "(c) Two traces side by side"),
    note("A trace records a run token by token: the model, its settings and seed, and at each step the token, its " +
         "probability and the top alternatives (nexttok run --trace FILE writes one; so do the runs of (a), and the " +
         "session's path above). Load two, or take the session's, and see where they part and whether that was a near tie."),
    side("a"), side("b"), row(compare, download), h("div", { id: "trace-diff" }), errorLine("traces"));
}

async function loadFile(key, input) {
  const file = input.files[0];
  if (!file) return;
  sides[key] = { name: file.name.slice(0, 200), lines: fileLines(await file.text()) };
  byId(`trace-name-${key}`).textContent = `${file.name} (${sides[key].lines.length} lines)`;
}

async function sessionTrace() {  // the session's path as trace lines, or null (the error line says why)
  if (!state.session) { refuse("traces", "start a session first (the prompt box at the top)"); return null; }
  const d = await ask("traces", sessionPath(state.session, "trace"), {});
  return d && d.lines;
}

async function takeSession(key) {
  const lines = await sessionTrace();
  if (!lines) return;
  sides[key] = { name: "the session", lines: lines.map((line) => JSON.stringify(line)) };
  byId(`trace-name-${key}`).textContent = `the session's path (${lines.length - 2} steps)`;
}

async function compareSides() {
  if (!sides.a || !sides.b) { refuse("traces", "give both A and B a trace"); return; }
  const d = await ask("traces", "/explain/traces/diff",
                      { a: sides.a.lines, b: sides.b.lines, name_a: sides.a.name, name_b: sides.b.name });
  byId("trace-diff").replaceChildren(...(d ? [diffView(d)] : []));
}

// A link that saves trace lines as a .jsonl file (nexttok replay and nexttok diff read it).
export function traceLink(lines, fileName, text = "download trace") {
  const blob = new Blob([lines.map((line) => JSON.stringify(line)).join("\n") + "\n"], { type: "application/x-ndjson" });
  return h("a", { href: URL.createObjectURL(blob), download: fileName, className: "trace-link" }, text);
}

async function downloadSession() {
  const lines = await sessionTrace();
  if (!lines) return;
  const link = traceLink(lines, "session.jsonl");
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 10_000);  // once the download has it
}
