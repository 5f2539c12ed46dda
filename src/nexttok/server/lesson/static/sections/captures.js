// The capture views of sections 4 and 5 (the attention matrix, one head by hand, the logit lens) cost
// the server an extra forward pass, so their answers are kept per session (a node's views never
// change), and they all describe one node: the shown step's node (its input is what the step read,
// so the lens ends in the table's top token and the matrix's last row is the "last position" view
// above), or, before any step, the current node (what the next Step will read).

import { viewRequests } from "../api.js";
import { on } from "../app.js";
import { byId } from "../dom.js";

const CACHE_ENTRIES = 64;  // capture views kept per session
const cache = new Map();  // capture views of this session: path + body -> answer
const where = { node: null };
const { nextTicket, ask } = viewRequests();

// Follow the page: called before the capture views' sections are built, so that their listeners
// run after the node is set.
export function install() {
  on("session", () => { where.node = null; cache.clear(); });
  on("step", (view) => { where.node = view.node; });
  on("goto", (view) => { where.node = view.current; });
}

// withNode({layer: 1}) {layer: 1, node: 4}: a capture request on the node the views describe.
export const withNode = (body) => (where.node === null ? body : { ...body, node: where.node });

// ask() with the session's cache in front: a view asked again is answered at once.
export async function askCached(view, path, body) {
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
