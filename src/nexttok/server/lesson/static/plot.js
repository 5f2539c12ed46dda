// Small SVG plots for the lesson's sections: a heatmap, line charts, a labelled scatter, a bar.
// Plain SVG, no library: the page works offline with no build step. Every drawn mark carries its
// number in data-* attributes (data-value, data-row, data-col, data-x, data-y), so a test can read
// what is shown, and a <title> so a reader can hover it.

import { svgElement as el, svgRoot as svg } from "./dom.js";
import { fmt } from "./format.js";

export const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c"];  // series colours, in order

// matrix: rows of numbers. options: rowLabels, colLabels, max (colour scale top; default the
// largest value), min (default 0, or -max when signed), onCell(row, col), cell (px), label (px),
// window (a square attention matrix of a sliding-window layer: the cells older than the window,
// col <= row - window, are greyed, and a line, path.window-edge, marks where the window starts).
export function heatmap(container, matrix, options = {}) {
  const rows = matrix.length, cols = rows ? matrix[0].length : 0;
  const cell = options.cell ?? Math.max(4, Math.min(22, Math.floor(640 / Math.max(cols, 1))));
  const label = options.rowLabels ? (options.label ?? 90) : 0;
  const top = options.colLabels ? (options.label ?? 90) : 0;
  const flat = matrix.flat();
  const max = options.max ?? Math.max(...flat.map(Math.abs), 1e-12);
  const signed = options.signed ?? flat.some((v) => v < 0);
  const slant = Math.ceil(top / 2);  // column labels lean right, past the last column
  const edge = options.window && rows > options.window;
  const root = svg(label + cols * cell + 2 + slant, top + rows * cell + 2 + (edge ? 16 : 0));
  const outside = (i, j) => options.window && j <= i - options.window;
  matrix.forEach((row, i) => row.forEach((v, j) => {
    const t = Math.min(1, Math.abs(v) / max);
    const colour = outside(i, j) ? "#e2e8f0"
      : signed && v < 0 ? `rgba(220, 38, 38, ${t.toFixed(3)})` : `rgba(37, 99, 235, ${t.toFixed(3)})`;
    const rect = el("rect", { x: label + j * cell, y: top + i * cell, width: cell - 0.5, height: cell - 0.5,
                              fill: colour, "data-row": i, "data-col": j, "data-value": v,
                              class: outside(i, j) ? "cell outside" : "cell" });
    const name = options.rowLabels && options.colLabels
      ? `${options.rowLabels[i]} → ${options.colLabels[j]}: ` : `(${i}, ${j}): `;
    rect.append(el("title", {}, name + fmt(v)));
    if (options.onCell) rect.addEventListener("click", () => options.onCell(i, j));
    root.append(rect);
  }));
  const fontSize = Math.min(12, Math.max(7, cell - 2));
  (options.rowLabels ?? []).forEach((text, i) => root.append(el("text", {
    x: label - 3, y: top + i * cell + cell * 0.75, "text-anchor": "end", "font-size": fontSize,
    class: "row-label", "data-row": i }, text)));
  (options.colLabels ?? []).forEach((text, j) => root.append(el("text", {
    x: 0, y: 0, transform: `translate(${label + j * cell + cell * 0.75}, ${top - 3}) rotate(-60)`,
    "font-size": fontSize, class: "col-label", "data-col": j }, text)));
  if (edge) windowEdge(root, rows, options.window, label, top, cell);
  container.replaceChildren(root);
  return root;
}

// The left edge of a sliding window over a heatmap's rows: row i sees columns i - w + 1 .. i, so the
// line steps one cell right per row from row w on; "window w" written under its foot.
function windowEdge(root, rows, w, left, top, cell) {
  const x = (i) => left + (i - w + 1) * cell, y = (i) => top + i * cell;
  let d = `M${x(w)},${y(w)}`;
  for (let i = w; i < rows; i++) d += ` V${y(i + 1)}` + (i + 1 < rows ? ` H${x(i + 1)}` : "");
  root.append(el("path", { d, fill: "none", stroke: "#dc2626", "stroke-width": 2, class: "window-edge",
                           "data-window": w }),
              el("text", { x: x(rows - 1), y: y(rows) + 13, "text-anchor": "middle", "font-size": 11, fill: "#dc2626",
                           class: "window-label" }, `window ${w}`));
}

// series: [{name, points: [[x, y], ...], colour?}]. options: xLabel, yLabel, yMin, yMax, width, height.
export function lines(container, series, options = {}) {
  const width = options.width ?? 560, height = options.height ?? 220, pad = { l: 52, r: 12, t: 12, b: 34 };
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]), ys = all.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1e-9);
  const y0 = options.yMin ?? Math.min(...ys, 0), y1 = options.yMax ?? Math.max(...ys, y0 + 1e-9);
  const sx = (x) => pad.l + ((x - x0) / (x1 - x0)) * (width - pad.l - pad.r);
  const sy = (y) => height - pad.b - ((y - y0) / (y1 - y0)) * (height - pad.t - pad.b);
  const root = svg(width, height);
  axes(root, { width, height, pad, x0, x1, y0, y1, sx, sy, ...options });
  series.forEach((s, k) => {
    const colour = s.colour ?? PALETTE[k % PALETTE.length];
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    const path = el("path", { d, fill: "none", stroke: colour, "stroke-width": 1.8, class: "series",
                              "data-name": s.name, "data-points": JSON.stringify(s.points) });
    path.append(el("title", {}, s.name));
    root.append(path);
    if (s.points.length <= 60) for (const [x, y] of s.points) {
      const dot = el("circle", { cx: sx(x), cy: sy(y), r: 2.5, fill: colour, "data-x": x, "data-y": y });
      dot.append(el("title", {}, `${s.name}: ${fmt(x)}, ${fmt(y)}`));
      root.append(dot);
    }
  });
  if (series.length > 1) series.forEach((s, k) => root.append(el("text", {
    x: pad.l + 8 + k * 140, y: pad.t + 10, fill: s.colour ?? PALETTE[k % PALETTE.length], "font-size": 12 },
    s.name)));
  container.replaceChildren(root);
  return root;
}

function axes(root, a) {
  const { width, height, pad } = a;
  root.append(el("line", { x1: pad.l, y1: height - pad.b, x2: width - pad.r, y2: height - pad.b, stroke: "#94a3b8" }));
  root.append(el("line", { x1: pad.l, y1: pad.t, x2: pad.l, y2: height - pad.b, stroke: "#94a3b8" }));
  for (const y of [a.y0, (a.y0 + a.y1) / 2, a.y1]) root.append(el("text", {
    x: pad.l - 4, y: a.sy(y) + 4, "text-anchor": "end", "font-size": 11, fill: "#6b7280" }, fmt(y)));
  for (const x of [a.x0, (a.x0 + a.x1) / 2, a.x1]) root.append(el("text", {
    x: a.sx(x), y: height - pad.b + 14, "text-anchor": "middle", "font-size": 11, fill: "#6b7280" }, fmt(x)));
  if (a.xLabel) root.append(el("text", { x: width / 2, y: height - 4, "text-anchor": "middle", "font-size": 12 },
                               a.xLabel));
  if (a.yLabel) root.append(el("text", { x: 12, y: height / 2, "font-size": 12, "text-anchor": "middle",
                                         transform: `rotate(-90, 12, ${height / 2})` }, a.yLabel));
}

// points: [{x, y, label}]: a scatter with each point named (the PCA map of words).
export function scatter(container, points, options = {}) {
  const width = options.width ?? 480, height = options.height ?? 320, pad = 40;
  const xs = points.map((p) => p.x), ys = points.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1e-9), y0 = Math.min(...ys), y1 = Math.max(...ys, y0 + 1e-9);
  const sx = (x) => pad + ((x - x0) / (x1 - x0)) * (width - 2 * pad);
  const sy = (y) => height - pad - ((y - y0) / (y1 - y0)) * (height - 2 * pad);
  const root = svg(width, height);
  root.append(el("rect", { x: 1, y: 1, width: width - 2, height: height - 2, fill: "none", stroke: "#e2e8f0" }));
  for (const p of points) {
    const dot = el("circle", { cx: sx(p.x), cy: sy(p.y), r: 4, fill: "#2563eb", class: "point",
                               "data-label": p.label, "data-x": p.x, "data-y": p.y });
    dot.append(el("title", {}, `${p.label}: (${fmt(p.x)}, ${fmt(p.y)})`));
    root.append(dot, el("text", { x: sx(p.x) + 6, y: sy(p.y) - 6, "font-size": 12 }, p.label));
  }
  if (options.xLabel) root.append(el("text", { x: width / 2, y: height - 8, "text-anchor": "middle",
                                               "font-size": 11, fill: "#6b7280" }, options.xLabel));
  container.replaceChildren(root);
  return root;
}

// A horizontal bar of segments [{value, label, colour?}] over [0, total], with an optional marker
// at `mark` (the draw u on the cumulative bar).
export function bar(container, segments, options = {}) {
  const width = options.width ?? 560, height = 34, total = options.total ?? segments.reduce((a, s) => a + s.value, 0);
  const root = svg(width, height + (options.mark === undefined ? 0 : 16));
  let x = 0;
  const palette = ["#2563eb", "#60a5fa", "#93c5fd", "#bfdbfe", "#dbeafe"];
  segments.forEach((s, i) => {
    const w = (s.value / total) * width;
    const rect = el("rect", { x, y: 0, width: Math.max(w, 0), height, fill: s.colour ?? palette[i % palette.length],
                              stroke: "white", class: "segment", "data-value": s.value, "data-start": x / width * total,
                              "data-label": s.label });
    rect.append(el("title", {}, `${s.label}: ${fmt(s.value)}`));
    root.append(rect);
    if (w > 40) root.append(el("text", { x: x + 4, y: 21, "font-size": 11, fill: "white" }, s.label));
    x += w;
  });
  if (options.mark !== undefined) {
    const mx = (options.mark / total) * width;
    root.append(el("path", { d: `M${mx},0 L${mx},${height + 4}`, stroke: "#111827", "stroke-width": 2, class: "mark",
                             "data-value": options.mark }));
    root.append(el("text", { x: Math.min(mx, width - 50), y: height + 14, "font-size": 11 }, options.markLabel ?? ""));
  }
  container.replaceChildren(root);
  return root;
}

// The colour scale of a heatmap drawn with the same max and signed: 0 is blank, |v| = max is full
// colour (blue; red below 0 when signed). options: max, signed, label (what the colour stands for).
let gradients = 0;  // ids of <linearGradient> must be unique in the document
export function legend(container, options = {}) {
  const width = 260, max = options.max ?? 1, signed = options.signed ?? false, id = `plot-scale-${++gradients}`;
  const root = svg(width, options.label ? 44 : 30);
  root.classList.add("legend");
  root.setAttribute("width", width);  // a scale stays its own size; plots grow with the page
  const blue = "37, 99, 235", red = "220, 38, 38";
  const stops = signed ? [[0, red, 1], [0.5, red, 0], [0.5, blue, 0], [1, blue, 1]] : [[0, blue, 0], [1, blue, 1]];
  const gradient = el("linearGradient", { id });
  for (const [offset, rgb, alpha] of stops) {
    gradient.append(el("stop", { offset, "stop-color": `rgb(${rgb})`, "stop-opacity": alpha }));
  }
  const defs = el("defs");
  defs.append(gradient);
  root.append(defs, el("rect", { x: 1, y: 1, width: width - 2, height: 12, fill: `url(#${id})`, stroke: "#cbd5e1",
                                 class: "scale", "data-max": max, "data-signed": signed }));
  const ticks = signed ? [[-max, 0], [0, 0.5], [max, 1]] : [[0, 0], [max, 1]];
  for (const [v, at] of ticks) {
    root.append(el("text", { x: Math.min(Math.max(at * width, 14), width - 14), y: 26, "text-anchor": "middle",
                             "font-size": 11, fill: "#6b7280" }, fmt(v)));
  }
  if (options.label) root.append(el("text", { x: width / 2, y: 40, "text-anchor": "middle", "font-size": 11 },
                                    options.label));
  container.replaceChildren(root);
  return root;
}

// Horizontal bars, one per item [{label, value, colour, id?}], to compare one number across them
// (format writes the number); returns the <svg>, its title in data-title, each bar a rect.cmp.
export function compareBars(title, items, format) {
  const width = 560, line = 22, top = 18, name = 100, area = 360;
  const max = Math.max(...items.map((i) => i.value), 1e-12);
  const root = svg(width, top + items.length * line + 4);
  root.dataset.title = title;
  root.append(el("text", { x: 0, y: 12, "font-size": 12, "font-weight": 600 }, title));
  items.forEach((item, k) => {
    const y = top + k * line, w = Math.max((item.value / max) * area, 1);
    const ids = item.id === undefined ? {} : { "data-id": item.id };
    root.append(el("text", { x: name - 6, y: y + 15, "text-anchor": "end", "font-size": 12 }, item.label),
                el("rect", { x: name, y: y + 3, width: w, height: line - 6, fill: item.colour, class: "cmp",
                             "data-label": item.label, "data-value": item.value, ...ids }),
                el("text", { x: name + w + 6, y: y + 15, "font-size": 12 }, format(item.value)));
  });
  return root;
}
