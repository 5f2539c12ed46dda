// Section 11 (e) of the lesson: questions, each answered by a demonstration on the live model; the
// page marks the choice the demonstration's numbers support.

import { api, sessionPath, viewRequests } from "../api.js";
import { byId, errorLine, h, label, note, row } from "../dom.js";
import { ms, quote, usd } from "../format.js";
import * as Plot from "../plot.js";
import { promptText, runLength, runRepeat } from "./experiments.js";

const QUIZ_STEPS = 6;  // steps per session in the KV cache question
const QUIZ_REPEAT = 24;  // copies of the prompt in that question: a long text makes the work visible

const { refuse, ask } = viewRequests();

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
    { name: "with the KV cache", colour: Plot.PALETTE[0], points: cached.map((r) => [r.index + 1, r.seconds * 1000]) },
    { name: "without", colour: Plot.PALETTE[1], points: uncached.map((r) => [r.index + 1, r.seconds * 1000]) }],
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
    await api("DELETE", `/explain/sessions/${started.session}`).catch(() => {});
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

export function build() {
  byId("lesson-experiments").append(
    h("h3", {}, "(e) Questions"),
    note("Pick an answer, then press “Show me”: the page runs a demonstration on the model and marks the " +
         "answer its numbers support."),
    h("ol", { id: "quiz", className: "quiz" }, ...QUIZ.map(question)));
}
