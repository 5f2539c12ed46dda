// Talking to the server: the JSON routes of the explainer (server/lesson/routes.py, sections.py).

import { byId } from "./dom.js";

// api("POST", "/explain/sessions", {prompt}): the route's JSON answer; an error answer throws its message.
export async function api(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = byId("api-key").value.trim();
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

// sessionPath(key, "lens") "/explain/sessions/KEY/lens": a route on one session (the page's own, or
// one a demonstration opens for itself).
export const sessionPath = (key, view) => `/explain/sessions/${key}/${view}`;

// The display text of every token id of a model (GET /explain/vocab): fetched once per page load and
// model; the route's ETag lets a reload revalidate instead of downloading the list again.
const vocabularies = new Map();  // model name -> its promised list of texts
export function loadVocab(model) {
  if (!vocabularies.has(model)) {
    const texts = api("GET", `/explain/vocab?model=${encodeURIComponent(model)}`).then((d) => d.texts);
    vocabularies.set(model, texts.catch((e) => { vocabularies.delete(model); throw e; }));  // a failure is tried again
  }
  return vocabularies.get(model);
}

// The requests of the lesson's views: the newest answer of a view wins (an older one still in
// flight is dropped), and errors stay on the view's own line (#VIEW-error).
export function viewRequests() {
  const tickets = new Map();  // view -> number of its newest request
  const nextTicket = (view) => { const t = (tickets.get(view) ?? 0) + 1; tickets.set(view, t); return t; };
  function refuse(view, message) {  // a request the page can tell is wrong is not sent
    nextTicket(view);
    byId(`${view}-error`).textContent = `error: ${message}`;
  }
  async function ask(view, path, body, method = "POST") {
    const ticket = nextTicket(view);
    const line = byId(`${view}-error`);
    try {
      const data = await api(method, path, body);
      if (tickets.get(view) !== ticket) return null;  // a newer request went out meanwhile
      line.textContent = "";
      return data;
    } catch (e) {
      if (tickets.get(view) === ticket) line.textContent = `error: ${e.message}`;
      return null;
    }
  }
  return { nextTicket, refuse, ask };
}
