// Section 11 of the lesson, Experiments (a) and (b): the same prompt four times, each run a trace and
// each pair compared as `nexttok diff` compares them, and how output length drives time and cost
// (POST /explain/experiments/repeat, /explain/experiments/length). The questions of (e) (quiz.js)
// run these experiments as their demonstrations.

import { viewRequests } from "../api.js";
import { byId, errorLine, h, label, note, numberInput, row } from "../dom.js";
import { ms, usd } from "../format.js";
import * as Plot from "../plot.js";
import { diffView, traceLink } from "./traces.js";

const { refuse, ask } = viewRequests();

export function build() {
  const prompt = h("textarea", { id: "exp-prompt", rows: 2, value: "Once upon a time" });
  const buttons = [["exp-repeat-run", "Run four times", runRepeat], ["exp-length-run", "Run both", runLength]]
    .map(([id, text, fn]) => { const b = h("button", { id }, text); b.addEventListener("click", fn); return b; });
  byId("lesson-experiments").append(
    label("prompt for the experiments", prompt),
    h("h3", {}, "(a) The same prompt four times"),
    note("Two runs at temperature 0 (greedy: no draw) and two at temperature 1 (each with its own seed), each " +
         "recorded as a trace. Each pair is compared as nexttok diff compares two traces: the outlined token is where " +
         "the pair first parts, the marked ones come after it, and the panel shows how likely each run's token was there."),
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
    errorLine("length"));
}

export const promptText = () => byId("exp-prompt").value;

export async function runRepeat() {
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
  const pairs = [["temperature_0", 0], ["temperature_1", 2]].map(([key, first]) => {
    const labels = [first, first + 1].map((k) => {
      const run = d.runs[k];
      return { title: `run ${k + 1} · temperature ${run.temperature}` + (run.seed === null ? "" : ` · seed ${run.seed}`),
               dataset: { temperature: run.temperature, seed: run.seed ?? "", run: k + 1 },
               extra: traceLink(run.trace, `run-${k + 1}.jsonl`, " · download its trace") };
    });
    return h("div", { className: "exp-pair", dataset: { pair: key } }, diffView(d.diffs[key], labels));
  });
  byId("exp-repeat").replaceChildren(...pairs);
  const summary = byId("exp-repeat-summary"), parts = [d.divergence.temperature_0, d.divergence.temperature_1];
  Object.assign(summary.dataset, { t0: parts[0] ?? "", t1: parts[1] ?? "" });
  const part = (k, a, b) => (k === null ? `runs ${a} and ${b} are the same, token for token`
    : `runs ${a} and ${b} part at token ${k + 1}`);
  summary.textContent = `At temperature 0 ${part(parts[0], 1, 2)}; at temperature 1 ${part(parts[1], 3, 4)}. ` +
    "Once two runs differ in one token, each goes on from its own text, so they rarely meet again.";
}

function lengths() {  // the lengths typed, or null when they are not 1 to 4 numbers in 1..1000
  const list = byId("exp-lengths").value.split(/[\s,]+/).filter(Boolean).map(Number);
  const fine = list.length >= 1 && list.length <= 4 && list.every((n) => Number.isInteger(n) && n >= 1 && n <= 1000);
  return fine ? list : null;
}

export async function runLength() {
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
  Plot.lines(byId("exp-length-plot"), d.runs.map((r, k) => ({ name: name(r), colour: Plot.PALETTE[k],
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
    Plot.compareBars(title, d.runs.map((r, k) => ({ label: name(r), value: get(r), colour: Plot.PALETTE[k] })), format)));
  lengthSummary(d.runs);
}

const costTitle = (r) => `${r.prompt_tokens} input tokens ${usd(r.input_cost)} + ${r.tokens} output tokens ${usd(r.output_cost)}`;

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
