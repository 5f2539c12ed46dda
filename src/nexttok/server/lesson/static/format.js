// Numbers and token texts as the page writes them. Pure functions, each with a worked example.

// visible(" a\n") "␣a\\n": spaces, newlines and tabs a reader can see in a token.
export const visible = (text) => text.replaceAll(" ", "␣").replaceAll("\n", "\\n").replaceAll("\t", "\\t");

// quote(" Paris") "“␣Paris”": a token's text in quotes, its spaces visible.
export const quote = (text) => `“${visible(text)}”`;

// pctFixed(0.92) "92.00%": two decimals, so the step table's column lines up.
export const pctFixed = (p) => `${(100 * p).toFixed(2)}%`;

// A probability as a percentage that stays readable when tiny: pct(0.92) "92.00%", pct(7.2e-5) "0.0072%".
export const pct = (p) => (p === 0 || p >= 1e-3 ? pctFixed(p) : `${(100 * p).toPrecision(2)}%`);

// fmt(123.4) "123", fmt(1.234) "1.23", fmt(0.01234) "0.0123": short numbers for plots and vectors.
export const fmt = (v) => (Math.abs(v) >= 100 || v === 0 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(3));

// Dollars readable at any size, never in e-notation: usd(302.1) "$302.10", usd(2.1e-6) "$0.0000021".
export function usd(x) {
  const digits = x >= 1 ? { minimumFractionDigits: 2, maximumFractionDigits: 2 } : { maximumSignificantDigits: 3 };
  return `$${x.toLocaleString("en-US", digits)}`;
}

// bytes(49152) "49,152 bytes (48.0 KiB)"
export function bytes(n) {
  const units = [["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];
  const unit = units.find(([, size]) => n >= size);
  return `${n.toLocaleString("en-US")} bytes` + (unit ? ` (${(n / unit[1]).toFixed(1)} ${unit[0]})` : "");
}

// count(29e9) "29.0 billion", count(1812000) "1.81 million", count(130048) "130,048": parameter counts.
export function count(n) {
  const units = [["billion", 1e9], ["million", 1e6]];
  const unit = units.find(([, size]) => n >= size);
  return unit ? `${(n / unit[1]).toPrecision(3)} ${unit[0]}` : n.toLocaleString("en-US");
}

// ms(0.0123) "12.3 ms"
export const ms = (seconds) => `${(seconds * 1000).toFixed(1)} ms`;

// A layer's type (config.layer_types, the session's model.layer_types) in words:
// kindName("sliding_attention") "sliding window", kindName("linear_attention") "linear attention".
const KIND_NAMES = { full_attention: "full attention", sliding_attention: "sliding window", conv: "convolution" };
export const kindName = (kind) => KIND_NAMES[kind] ?? kind.replaceAll("_", " ");

// A layer selector's option: layerLabel({layer: 2, kind: "sliding_attention", window: 5}) "2 · sliding window 5".
export const layerLabel = (l) => `${l.layer} · ${kindName(l.kind)}${l.window ? ` ${l.window}` : ""}`;

// What a recurrent layer keeps: stateKept({kind: "conv", state: {inputs: 2, numbers: 512}})
// "the last 2 inputs, 512 numbers, the same at any length"; without inputs "a state of 512 numbers, …".
export function stateKept(l) {
  const what = l.state.inputs ? `the last ${l.state.inputs} inputs, ` : "a state of ";
  return `${what}${l.state.numbers.toLocaleString("en-US")} numbers, the same at any length`;
}

// stateWords({kind: "conv", state: {inputs: 2, numbers: 512}})
// "convolution layer: keeps the last 2 inputs, 512 numbers, the same at any length".
export const stateWords = (l) => `${kindName(l.kind)} layer: keeps ${stateKept(l)}`;
