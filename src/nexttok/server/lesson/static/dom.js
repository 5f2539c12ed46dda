// Building the page's elements: one copy of each small helper the step view and the lesson's
// sections share. No state here: every function makes or finds an element and returns it.

import { visible } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";

export const byId = (id) => document.getElementById(id);

// h("p", {className: "note", dataset: {id: 3}}, "text", child): an element with properties and children.
export function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  const { dataset, ...rest } = props;
  Object.assign(node, rest);
  if (dataset) Object.assign(node.dataset, dataset);
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

// svgElement("rect", {x: 1, "data-value": 0.5}): an SVG element with attributes (and text).
export function svgElement(name, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = text;
  return node;
}

// An <svg> that scales to its container's width; the viewBox keeps its proportions.
export function svgRoot(width, height) {
  return svgElement("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", preserveAspectRatio: "xMinYMin meet",
                             class: "plot" });
}

export const label = (text, input) => h("label", {}, `${text} `, input);
export const row = (...items) => h("div", { className: "row" }, ...items);
export const note = (text, id) => h("p", { className: "note", ...(id ? { id } : {}) }, text);
export const numberInput = (id, value, min, max, step = 1) =>
  h("input", { id, type: "number", value: String(value), min: String(min), max: String(max), step: String(step) });

// A token of a text the lesson lays out (a loop's input, an experiment's run): its text, id on hover.
export const tokenChip = (token, cls = "") => h("span", { className: `late-chip ${cls}`, title: `id ${token.id}`,
                                                        dataset: { id: token.id } }, visible(token.text));

// The line where a view's request errors show (#VIEW-error; hidden while empty).
export const errorLine = (view) => h("p", { className: "error", id: `${view}-error`, role: "status" });

export const TYPING_DELAY_MS = 300;  // one request per pause in typing, not one per key

// debounce(fn)(): fn once per pause of TYPING_DELAY_MS in the calls.
export function debounce(fn, ms = TYPING_DELAY_MS) {
  let timer = null;
  return () => { clearTimeout(timer); timer = setTimeout(fn, ms); };
}

export const isOpen = (sectionId) => byId(sectionId).open;

// Runs `load` whenever the section is opened (and now, if it already is).
export function onOpen(sectionId, load) {
  const section = byId(sectionId);
  section.addEventListener("toggle", () => { if (section.open) load(); });
  if (section.open) load();
}
