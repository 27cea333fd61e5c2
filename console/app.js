// The txgate console: plain ES modules, no build step, served by the
// gateway from its binary. Everything goes through the public API with the
// user's key or access token (kept in sessionStorage, for this tab only;
// never in a URL); a user signs in with an OpenID Connect provider
// (oidc.js). Live views open their streams with tickets.
// Document data is rendered as text, never as HTML: every node is made with
// createElement and textContent.

import * as oidc from "/console/oidc.js";

const KEY = "txgate-console-key";
const store = (token) => sessionStorage.setItem(KEY, token);
const view = () => document.getElementById("view");
let leaving = []; // what the current view must stop when another opens

// ---- helpers --------------------------------------------------------------

/** An element: `attrs` are properties (on*: listeners); strings are text. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "for") el.htmlFor = v;
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function status(text, bad = false) {
  const s = document.getElementById("status");
  s.textContent = text;
  s.className = bad ? "error" : "";
}

function show(...nodes) {
  for (const stop of leaving) stop();
  leaving = [];
  view().replaceChildren(...nodes.filter((n) => n !== null && n !== undefined && n !== false));
  const title = view().querySelector("h2");
  if (title) document.title = `${title.textContent} · txgate console`;
}

const json = (v) => JSON.stringify(v, null, 2);
const enc = encodeURIComponent;

class ApiError extends Error {
  constructor(status, problem) {
    super(problem?.detail || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
  }
}

/** A call of the public API with the user's key. */
async function api(method, path, { body, headers = {}, signal } = {}) {
  const h2 = { ...headers };
  const key = sessionStorage.getItem(KEY);
  if (key) h2["Authorization"] = `Bearer ${key}`;
  if (body !== undefined) h2["Content-Type"] = "application/json";
  const res = await fetch(path, { method, headers: h2, body: body === undefined ? undefined : JSON.stringify(body), signal });
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!res.ok) throw new ApiError(res.status, data);
  return { data, res };
}

function failure(err) {
  const code = err.problem?.code ? ` (${err.problem.code})` : "";
  status(`${err.message}${code}`, true);
}

/**
 * Follow an event stream, resuming after the last event seen when the
 * connection drops or the token it was opened with expires (`event:
 * reauth`). Each connection is opened with a ticket (POST
 * /v1/events/tickets with the credential; the stream itself carries
 * none). Returns a function that stops it.
 */
function follow(pathOf, onEvent, after) {
  const ctl = new AbortController();
  let last = after;
  let stopped = false;
  (async () => {
    while (!stopped) {
      try {
        const wanted = new URL(pathOf(last), location.origin).searchParams;
        const ask = {};
        for (const name of ["collections", "types", "filter"]) if (wanted.has(name)) ask[name] = wanted.get(name);
        if (last !== undefined && last !== null) ask.after = String(last);
        const { data: ticket } = await api("POST", "/v1/events/tickets", { body: ask, signal: ctl.signal });
        const res = await fetch(ticket.url, { headers: { Accept: "text/event-stream" }, signal: ctl.signal });
        if (!res.ok) {
          const problem = await res.json().catch(() => null);
          throw new ApiError(res.status, problem);
        }
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut);
            buf = buf.slice(cut + 2);
            let id = null;
            let data = "";
            let kind = null;
            for (const line of block.split("\n")) {
              if (line.startsWith("id:")) id = line.slice(3).trim();
              else if (line.startsWith("event:")) kind = line.slice(6).trim();
              else if (line.startsWith("data:")) data += line.slice(5).trim();
              // Where the stream starts: a resume point before any event.
              else if (line.startsWith(": position ") && (last === undefined || last === null)) last = Number(line.slice(11));
            }
            // The token expired: a new ticket, with the refreshed token.
            if (kind === "reauth") break;
            if (data) {
              const event = JSON.parse(data);
              if (id !== null) last = Number(id);
              onEvent(event);
            }
          }
        }
      } catch (err) {
        if (stopped) return;
        if (err instanceof ApiError && err.status !== 503 && err.status !== 429) {
          failure(err);
          return;
        }
      }
      if (!stopped) {
        status("stream interrupted; reconnecting");
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  })();
  return () => {
    stopped = true;
    ctl.abort();
  };
}

// ---- sign in --------------------------------------------------------------

function signedIn() {
  return sessionStorage.getItem(KEY) !== null;
}

function signInView() {
  document.getElementById("sign-in").hidden = false;
  document.getElementById("nav").hidden = true;
  view().replaceChildren();
  document.getElementById("api-key").focus();
  showIssuers();
}

let issuersShown = false;

/** A "Sign in with" button for each issuer the gateway names. */
async function showIssuers() {
  if (issuersShown) return;
  issuersShown = true;
  const list = await oidc.issuers().catch(() => []);
  document.getElementById("issuers").replaceChildren(...list.map((issuer) =>
    h("button", { type: "button", class: "issuer", "data-issuer": issuer.name, onclick: () => oidc.begin(issuer).catch((err) => status(err.message, true)) },
      `Sign in with ${issuer.name}`)));
}

/** Who is signed in, and what they may do, beside the views. */
async function showWho() {
  const who = document.getElementById("who");
  try {
    const { data: me } = await api("GET", "/v1/me");
    const name = me.kind === "user" ? (me.claims?.name || me.claims?.email || me.subject) : me.kind === "key" ? `key ${me.name}` : me.kind;
    const roles = me.roles?.length ? ` (${me.roles.join(", ")})` : "";
    const grants = me.grants ? `: ${me.grants.join(", ")}` : ": everything";
    who.textContent = `Signed in as ${name}${roles}${grants}`;
  } catch { who.textContent = ""; }
}

function lost() {
  sessionStorage.removeItem(KEY);
  oidc.end();
  status("your session has expired: sign in again", true);
  route();
}

document.getElementById("sign-in-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const input = document.getElementById("api-key");
  sessionStorage.setItem(KEY, input.value.trim());
  try {
    await api("GET", "/v1/collections?limit=1");
    input.value = "";
    status("signed in");
    route();
    showWho();
  } catch (err) {
    sessionStorage.removeItem(KEY);
    failure(err);
  }
});

document.getElementById("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  oidc.end();
  status("signed out");
  location.hash = "";
  route();
});

// ---- collections ----------------------------------------------------------

async function collectionsView() {
  const body = h("tbody");
  const table = h("div", { class: "table-wrap" }, h("table", {},
    h("caption", { class: "muted" }, "Counts refresh every few seconds."),
    h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Collection"), h("th", { scope: "col" }, "Documents"),
      h("th", { scope: "col" }, "TTL"), h("th", { scope: "col" }, "Indexes"), h("th", { scope: "col" }, "Schemas"), h("th", { scope: "col" }, "Rules"))),
    body));
  const open = h("form", { class: "row", onsubmit: (e) => { e.preventDefault(); const c = e.target.elements.coll.value.trim(); if (c) location.hash = `#/documents/${enc(c)}`; } },
    h("div", {}, h("label", { for: "open-coll" }, "Open a collection"), h("input", { id: "open-coll", name: "coll", required: true })),
    h("button", { type: "submit" }, "Open"));
  show(h("h2", {}, "Collections"), open, table);
  const load = async () => {
    try {
      const { data } = await api("GET", "/v1/collections?limit=1000");
      const rows = [];
      for (const c of data.items) {
        let indexes = "";
        try {
          const idx = await api("GET", `/v1/collections/${enc(c.name)}/indexes`);
          indexes = idx.data.items.map((i) => `${i.name} (${i.fields.join(", ")}${i.unique ? ", unique" : ""}): ${i.state}` +
            (i.progress ? ` ${i.progress.done}/${i.progress.total}` : "") + (i.reason ? ` — ${i.reason}` : "")).join("; ");
        } catch { indexes = "—"; }
        let schemas = "—";
        try {
          const sch = (await api("GET", `/v1/collections/${enc(c.name)}/schemas`)).data;
          schemas = sch.items.length === 0 ? "none" : h("a", { href: `#/schema/${enc(c.name)}` },
            `${sch.items.map((v) => `v${v.version}${v.state === "pending" ? " (pending)" : ""}`).join(", ")} · ${sch.validation}`);
        } catch { /* not readable by this caller */ }
        rows.push(h("tr", {},
          h("th", { scope: "row" }, h("a", { href: `#/documents/${enc(c.name)}` }, c.name)),
          h("td", {}, String(c.count ?? "")),
          h("td", {}, c.ttl ? json(c.ttl) : "none"),
          h("td", {}, indexes || "none"),
          h("td", {}, schemas),
          // An admin's list carries each collection's rules in brief, and
          // leads to reading the collection as one of its users would.
          h("td", {}, c.rules ? [`version ${c.rules.version}: ${c.rules.grants.join(", ") || "no grant"} `,
            h("a", { href: `#/view-as/${enc(c.name)}` }, "view as…")] : "none")));
      }
      body.replaceChildren(...rows);
    } catch (err) { failure(err); }
  };
  await load();
  const timer = setInterval(load, 3000);
  leaving.push(() => clearInterval(timer));
}

// ---- documents: a filtered, sorted list kept live -------------------------

function sortKeyOf(doc, sort) {
  return sort.map((s) => {
    const path = s.replace(/^-/, "");
    let v = doc.data;
    for (const p of path.split(".")) v = v == null ? undefined : v[p];
    return v;
  });
}

function compare(a, b) {
  if (a === b) return 0;
  if (a === undefined || a === null) return -1;
  if (b === undefined || b === null) return 1;
  if (typeof a !== typeof b) return String(typeof a).localeCompare(typeof b);
  return a < b ? -1 : a > b ? 1 : 0;
}

async function documentsView(coll) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const filterText = params.get("filter") || "";
  const sortText = params.get("sort") || "";
  const form = h("form", { class: "row", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    if (e.target.elements.filter.value.trim()) q.set("filter", e.target.elements.filter.value.trim());
    if (e.target.elements.sort.value.trim()) q.set("sort", e.target.elements.sort.value.trim());
    location.hash = `#/documents/${enc(coll)}?${q}`;
  } },
    h("div", {}, h("label", { for: "filter" }, "Filter (JSON)"), h("input", { id: "filter", name: "filter", value: filterText, size: 40, placeholder: '{"status":"open"}' })),
    h("div", {}, h("label", { for: "sort" }, "Sort"), h("input", { id: "sort", name: "sort", value: sortText, placeholder: "-amount" })),
    h("button", { type: "submit" }, "Apply"));
  const body = h("tbody");
  const count = h("p", { class: "muted", id: "doc-count" });
  const newForm = h("form", { onsubmit: async (e) => {
    e.preventDefault();
    try {
      const data = JSON.parse(e.target.elements.newdata.value || "{}");
      const { data: created } = await api("POST", `/v1/collections/${enc(coll)}/documents`, { body: data });
      status(`created ${created.id}`);
      e.target.elements.newdata.value = "";
    } catch (err) { err instanceof ApiError ? failure(err) : status(`not JSON: ${err.message}`, true); }
  } },
    h("label", { for: "newdata" }, "New document (JSON; \"_id\" optional)"),
    h("textarea", { id: "newdata", name: "newdata", rows: 3 }),
    h("button", { type: "submit" }, "Create"));
  show(h("h2", {}, `Documents of ${coll}`), form, count,
    h("div", { class: "table-wrap" }, h("table", { id: "documents" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Id"), h("th", { scope: "col" }, "Version"), h("th", { scope: "col" }, "Data"))),
      body)),
    newForm);
  const sort = sortText ? sortText.split(",").map((s) => s.trim()).filter(Boolean) : [];
  const held = new Map();
  const render = () => {
    const docs = [...held.values()];
    docs.sort((a, b) => {
      const ka = sortKeyOf(a, sort), kb = sortKeyOf(b, sort);
      for (let i = 0; i < sort.length; i++) {
        const c = compare(ka[i], kb[i]);
        if (c) return sort[i].startsWith("-") ? -c : c;
      }
      return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    });
    body.replaceChildren(...docs.map((d) => h("tr", { "data-id": d.id },
      h("th", { scope: "row" }, h("a", { href: `#/doc/${enc(coll)}/${enc(d.id)}` }, d.id)),
      h("td", {}, String(d.version)),
      h("td", {}, h("span", { class: "value" }, JSON.stringify(d.data))))));
    count.textContent = `${docs.length} document${docs.length === 1 ? "" : "s"}, live`;
  };
  // List every page, then follow the filtered events from the first page's position.
  let position = null;
  try {
    let after = null;
    for (let page = 0; page < 100; page++) {
      const q = new URLSearchParams({ limit: "200" });
      if (filterText) q.set("filter", filterText);
      if (sortText) q.set("sort", sortText);
      if (after) q.set("after", after);
      const { data } = await api("GET", `/v1/collections/${enc(coll)}/documents?${q}`);
      if (position === null) position = data.position ?? 0;
      for (const d of data.items) held.set(d.id, d);
      if (!data.next) break;
      after = data.next;
    }
  } catch (err) { failure(err); return; }
  render();
  const q = new URLSearchParams({ collections: coll });
  if (filterText) q.set("filter", filterText);
  leaving.push(follow(() => `/v1/events?${q}`, (e) => {
    if (e.collection !== coll || !e.document) return;
    const had = held.get(e.document);
    if (had && had.version >= e.version) return;
    if (e.left || e.type === "document.deleted" || e.type === "document.expired") held.delete(e.document);
    else held.set(e.document, { id: e.document, version: e.version, data: e.data || {} });
    render();
  }, position));
}

// ---- view as: a collection as another principal reads it (admins) --------

async function viewAsView(coll) {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const field = (id, label, attrs = {}) => h("div", {}, h("label", { for: id }, label),
    h("input", { id, name: id, value: params.get(id) || "", ...attrs }));
  const form = h("form", { class: "row", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const name of ["sub", "roles", "claims", "filter", "sort"]) {
      const v = e.target.elements[name].value.trim();
      if (v) q.set(name, v);
    }
    location.hash = `#/view-as/${enc(coll)}?${q}`;
  } },
    field("sub", "User (sub)", { required: true }),
    field("roles", "Roles (comma-separated)"),
    field("claims", "Claims (JSON)", { size: 30, placeholder: '{"team":"red"}' }),
    field("filter", "Filter (JSON)", { size: 30 }),
    field("sort", "Sort"),
    h("button", { type: "submit" }, "View"));
  const note = h("p", { class: "muted", id: "view-as-note" },
    "What the user would read of this collection under its rules. Each view is recorded (an access.viewed_as event).");
  const body = h("tbody");
  show(h("h2", {}, `${coll} as another user sees it`), form, note,
    h("div", { class: "table-wrap" }, h("table", { id: "view-as" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Id"), h("th", { scope: "col" }, "Version"), h("th", { scope: "col" }, "Data"))),
      body)));
  const sub = params.get("sub");
  if (!sub) return;
  let principal, query = { limit: 200 };
  try {
    principal = { sub, roles: (params.get("roles") || "").split(",").map((r) => r.trim()).filter(Boolean) };
    if (params.get("claims")) principal.claims = JSON.parse(params.get("claims"));
    if (params.get("filter")) query.filter = JSON.parse(params.get("filter"));
  } catch (err) { status(`not JSON: ${err.message}`, true); return; }
  if (params.get("sort")) query.sort = params.get("sort");
  try {
    const { data, res } = await api("POST", "/v1/access/view", { body: { principal, collection: coll, query } });
    const grant = res.headers.get("Txgate-Grant");
    note.textContent = `${sub} reads ${data.items.length}${data.next ? "+" : ""} document${data.items.length === 1 ? "" : "s"}` +
      (grant ? ` through ${grant}` : "") + ". This view was recorded (an access.viewed_as event).";
    body.replaceChildren(...data.items.map((d) => h("tr", { "data-id": d.id },
      h("th", { scope: "row" }, d.id),
      h("td", {}, String(d.version)),
      h("td", {}, h("span", { class: "value" }, JSON.stringify(d.data))))));
  } catch (err) {
    note.textContent = err.problem?.detail || err.message;
    failure(err);
  }
}

// ---- one document, its editor, and the conflict view ---------------------

async function documentView(coll, id) {
  let doc;
  try {
    ({ data: doc } = await api("GET", `/v1/collections/${enc(coll)}/documents/${enc(id)}`));
  } catch (err) {
    show(h("h2", {}, `${coll} / ${id}`), h("p", { class: "error" }, err.message));
    return;
  }
  const editor = h("textarea", { id: "editor", rows: 14, "aria-describedby": "editor-hint schema-errors" });
  editor.value = json(doc.data);
  const errors = h("ul", { id: "schema-errors", class: "error", "aria-live": "polite" });
  const meta = h("p", { class: "muted", id: "doc-meta" },
    `version ${doc.version} · schema ${doc.schema_version} · created ${doc.created_at} · updated ${doc.updated_at}`);
  const save = async (e) => {
    e.preventDefault();
    let data;
    try { data = JSON.parse(editor.value); } catch (err) { status(`not JSON: ${err.message}`, true); return; }
    try {
      const { data: saved } = await api("PUT", `/v1/collections/${enc(coll)}/documents/${enc(id)}`,
        { body: data, headers: { "If-Match": `"${doc.version}"` } });
      schemaErrors(errors, editor, data, []);
      status(`saved: version ${saved.version}`);
      doc = saved;
      editor.value = json(doc.data);
      meta.textContent = `version ${doc.version} · schema ${doc.schema_version} · created ${doc.created_at} · updated ${doc.updated_at}`;
    } catch (err) {
      if (err instanceof ApiError && err.problem.code === "version_conflict") {
        conflictView(coll, id, doc, data, err.problem);
      } else if (err instanceof ApiError && err.problem.code === "schema_violation") {
        editor.value = json(data);
        schemaErrors(errors, editor, data, err.problem.errors || []);
        status(`not saved: ${err.problem.detail}`, true);
      } else failure(err);
    }
  };
  show(h("h2", {}, `${coll} / ${id}`), meta,
    h("form", { onsubmit: save },
      h("label", { for: "editor" }, "Data (JSON)"), editor, errors,
      h("p", { class: "hint", id: "editor-hint" }, `Saved with If-Match: "${doc.version}" — a change made meanwhile is shown as a conflict.`),
      h("button", { type: "submit", class: "primary", id: "save" }, "Save")),
    h("p", {}, h("a", { href: `#/documents/${enc(coll)}` }, `Back to ${coll}`)));
}

/** The line each JSON pointer of `value` starts on, as `json(value)` writes it. */
function pointerLines(value) {
  const lines = new Map();
  let line = 0;
  const walk = (v, pointer) => {
    lines.set(pointer, line);
    if (v === null || typeof v !== "object") return;
    const entries = Array.isArray(v) ? v.map((x, i) => [String(i), x]) : Object.entries(v);
    if (entries.length === 0) return;
    for (const [k, x] of entries) {
      line += 1;
      walk(x, `${pointer}/${k.replaceAll("~", "~0").replaceAll("/", "~1")}`);
    }
    line += 1;
  };
  walk(value, "");
  return lines;
}

/** `errors` (a schema_violation's) beside the editor, each at its field's line. */
function schemaErrors(list, editor, data, errors) {
  const lines = pointerLines(data);
  const lineOf = (pointer) => {
    for (let p = pointer; ; p = p.slice(0, p.lastIndexOf("/"))) {
      if (lines.has(p)) return lines.get(p);
      if (p === "") return 0;
    }
  };
  const goTo = (line) => {
    const text = editor.value.split("\n");
    const start = text.slice(0, line).reduce((n, l) => n + l.length + 1, 0);
    editor.focus();
    editor.setSelectionRange(start, start + (text[line] || "").length);
  };
  editor.setAttribute("aria-invalid", errors.length ? "true" : "false");
  list.replaceChildren(...errors.map((e) => {
    const line = lineOf(e.pointer);
    return h("li", { "data-pointer": e.pointer, "data-keyword": e.keyword },
      h("code", {}, e.pointer || "(the document)"), ` (line ${line + 1}) ${e.keyword}: ${e.detail} `,
      h("button", { type: "button", class: "inline", onclick: () => goTo(line) }, "go to"));
  }));
}

/** A dotted path of the merge view as a JSON pointer. */
const pointerOf = (path) => `/${path.split(".").map((p) => p.replaceAll("~", "~0").replaceAll("/", "~1")).join("/")}`;

// Fields are own properties only: a field named `constructor` or
// `__proto__` is a field like any other, never the object's prototype.
function at(obj, path) {
  let v = obj;
  for (const p of path.split(".")) {
    if (v === null || typeof v !== "object" || !Object.hasOwn(v, p)) return undefined;
    v = v[p];
  }
  return v;
}

function setOwn(o, key, value) {
  Object.defineProperty(o, key, { value, writable: true, enumerable: true, configurable: true });
}

function put(obj, path, value) {
  const parts = path.split(".");
  let o = obj;
  for (const p of parts.slice(0, -1)) {
    const next = Object.hasOwn(o, p) ? o[p] : undefined;
    if (next === null || typeof next !== "object" || Array.isArray(next)) setOwn(o, p, {});
    o = o[p];
  }
  const last = parts.at(-1);
  if (value === undefined) delete o[last];
  else setOwn(o, last, value);
}

const shown = (v) => (v === undefined ? "(absent)" : JSON.stringify(v));

/** The user's edit (from `base`), the document now and the base, field by field. */
async function conflictView(coll, id, base, mine, problem) {
  let merge;
  try {
    ({ data: merge } = await api("POST", `/v1/collections/${enc(coll)}/documents/${enc(id)}/merge`,
      { body: { base_version: base.version, mine } }));
  } catch (err) { failure(err); return; }
  const theirs = merge.current ? merge.current.data : {};
  const rows = [];
  const choices = new Map(); // path -> "mine" | "theirs"
  const paths = [
    ...merge.conflicts.map((c) => ({ path: c.path, kind: "conflict" })),
    ...merge.mine.map((p) => ({ path: p, kind: "mine" })),
    ...merge.theirs.map((p) => ({ path: p, kind: "theirs" })),
  ].sort((a, b) => a.path.localeCompare(b.path));
  const invalid = (errors) => (path) => errors.filter((e) => e.pointer === pointerOf(path) || e.pointer.startsWith(`${pointerOf(path)}/`));
  const mergeErrors = h("ul", { id: "merge-schema-errors", class: "error", "aria-live": "polite" });
  const showMergeErrors = (errors) => {
    mergeErrors.replaceChildren(...errors.map((e) => h("li", { "data-pointer": e.pointer }, h("code", {}, e.pointer || "(the document)"), ` ${e.keyword}: ${e.detail}`)));
    for (const row of document.querySelectorAll("#conflict tbody tr")) {
      const found = invalid(errors)(row.dataset.path);
      row.classList.toggle("invalid", found.length > 0);
      const note = row.querySelector(".schema-note");
      if (note) note.textContent = found.map((e) => `${e.keyword}: ${e.detail}`).join("; ");
    }
  };
  paths.forEach(({ path, kind }, i) => {
    const initial = kind === "mine" ? "mine" : "theirs";
    choices.set(path, initial);
    const name = `choice-${i}`;
    const radio = (value, text) => h("span", {},
      h("input", { type: "radio", id: `${name}-${value}`, name, value, checked: initial === value,
        onchange: () => choices.set(path, value) }),
      h("label", { class: "inline", for: `${name}-${value}` }, text));
    rows.push(h("tr", { class: kind === "conflict" ? "conflict-row" : "", "data-path": path },
      h("th", { scope: "row" }, h("code", {}, path), " ", h("span", { class: "tag" }, kind === "conflict" ? "both changed" : kind === "mine" ? "you changed" : "they changed"),
        h("span", { class: "schema-note error" })),
      h("td", { class: "value" }, shown(at(base.data, path))),
      h("td", { class: "value" }, shown(at(mine, path))),
      h("td", { class: "value" }, shown(at(theirs, path))),
      h("td", {}, h("fieldset", {}, h("legend", { class: "muted" }, `Value of ${path}`), radio("mine", "keep mine"), radio("theirs", "take theirs")))));
  });
  const changes = (problem.changes || []).map((c) => h("li", {},
    `version ${c.version} · ${c.type} · ${c.at} · ${c.actor ? `user ${c.actor.subject}` : `key ${c.key ?? "(none)"}`} · transaction ${c.transaction ?? "(none)"}`,
    c.added || c.removed || c.changed
      ? ` · added ${(c.added || []).join(", ") || "—"}; removed ${(c.removed || []).join(", ") || "—"}; changed ${(c.changed || []).join(", ") || "—"}`
      : " · fields unknown (the log no longer holds the version before)"));
  const saveMerged = async () => {
    const result = structuredClone(merge.merged);
    for (const { path } of paths) put(result, path, choices.get(path) === "mine" ? at(mine, path) : at(theirs, path));
    try {
      const { data: saved } = merge.deleted
        ? await api("POST", `/v1/collections/${enc(coll)}/documents`, { body: { ...result, _id: id } })
        : await api("PUT", `/v1/collections/${enc(coll)}/documents/${enc(id)}`, { body: result, headers: { "If-Match": `"${merge.version}"` } });
      status(`saved the merge: version ${saved.version}`);
      location.hash = `#/doc/${enc(coll)}/${enc(id)}`;
      documentView(coll, id);
    } catch (err) {
      if (err instanceof ApiError && err.problem.code === "version_conflict") {
        status("it changed again meanwhile: merge once more", true);
        conflictView(coll, id, base, mine, err.problem);
      } else if (err instanceof ApiError && err.problem.code === "schema_violation") {
        showMergeErrors(err.problem.errors || []);
        status(`not saved: ${err.problem.detail}`, true);
      } else failure(err);
    }
  };
  show(
    h("h2", { id: "conflict-title", tabindex: "-1" }, `Conflict: ${coll} / ${id}`),
    h("p", {}, `You edited version ${base.version}; the document is at version ${merge.version}${merge.deleted ? " and was deleted" : ""}. Choose, field by field, then save at version ${merge.version}.`),
    h("div", { class: "table-wrap" }, h("table", { id: "conflict" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Field"), h("th", { scope: "col" }, `Base (v${base.version})`),
        h("th", { scope: "col" }, "Yours"), h("th", { scope: "col" }, `Current (v${merge.version})`), h("th", { scope: "col" }, "Keep"))),
      h("tbody", {}, rows))),
    h("h3", {}, "Changes since your version"),
    h("ul", { id: "changes" }, changes),
    problem.changes_truncated ? h("p", { class: "muted" }, "Older changes are no longer in the log.") : null,
    merge.schema_errors?.length ? h("p", {}, "The merge as it stands does not satisfy the collection's schema:") : null,
    mergeErrors,
    h("button", { type: "button", class: "primary", id: "save-merge", onclick: saveMerged }, "Save the result"),
    " ",
    h("button", { type: "button", onclick: () => documentView(coll, id) }, "Discard my edit"));
  showMergeErrors(merge.schema_errors || []);
  status("version conflict: someone changed this document", true);
  document.getElementById("conflict-title").focus();
}

// ---- transactions ---------------------------------------------------------

async function transactionsView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const wanted = params.get("status") || "pending";
  const select = h("select", { id: "txn-status", onchange: (e) => { location.hash = `#/transactions?status=${e.target.value}`; } },
    ...["pending", "committed", "aborted", "done", "rolled_back"].map((s) => h("option", { value: s, selected: s === wanted }, s)));
  const body = h("tbody");
  show(h("h2", {}, "Transactions"),
    h("div", { class: "row" }, h("div", {}, h("label", { for: "txn-status" }, "Status"), select)),
    h("div", { class: "table-wrap" }, h("table", { id: "transactions" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Id"), h("th", { scope: "col" }, "Status"), h("th", { scope: "col" }, "Started"),
        h("th", { scope: "col" }, "Lease until"), h("th", { scope: "col" }, "Actions"), h("th", { scope: "col" }, "Operator"))),
      body)));
  try {
    const { data } = await api("GET", `/v1/transactions?status=${enc(wanted)}&limit=200`);
    body.replaceChildren(...data.items.map((t) => h("tr", { "data-id": t.id },
      h("th", { scope: "row" }, h("code", {}, t.id)),
      h("td", {}, t.status + (t.abort_reason ? ` (${t.abort_reason})` : "")),
      h("td", {}, t.started_at),
      h("td", {}, t.expires_at),
      h("td", {}, (t.actions || []).map((a) => `${a.op} ${a.collection}/${a.id}`).join(", ")),
      h("td", {}, t.status === "pending" ? h("button", { type: "button", class: "danger", onclick: async () => {
        try {
          await api("POST", `/v1/transactions/${enc(t.id)}/abort`);
          status(`aborted ${t.id}`);
          transactionsView();
        } catch (err) { failure(err); }
      } }, "Abort (admin)") : ""))));
    if (!data.items.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 6 }, `No ${wanted} transactions.`)));
  } catch (err) { failure(err); }
}

// ---- deliveries -----------------------------------------------------------

async function deliveriesView() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  const wanted = params.get("status") || "dead";
  const select = h("select", { id: "delivery-status", onchange: (e) => { location.hash = `#/deliveries?status=${e.target.value}`; } },
    ...["dead", "failed", "pending", "delivered"].map((s) => h("option", { value: s, selected: s === wanted }, s)));
  const body = h("tbody");
  show(h("h2", {}, "Deliveries"),
    h("div", { class: "row" }, h("div", {}, h("label", { for: "delivery-status" }, "Status"), select)),
    h("div", { class: "table-wrap" }, h("table", { id: "deliveries" },
      h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "Id"), h("th", { scope: "col" }, "Destination"), h("th", { scope: "col" }, "Status"),
        h("th", { scope: "col" }, "Attempts"), h("th", { scope: "col" }, "Last error"), h("th", { scope: "col" }, "Operator"))),
      body)));
  try {
    const { data } = await api("GET", `/v1/deliveries?status=${enc(wanted)}&limit=200`);
    body.replaceChildren(...data.items.map((d) => {
      const attempts = d.attempts || [];
      const last = attempts.at(-1);
      const error = last ? (last.error || (last.status_code ? `HTTP ${last.status_code}` : "")) : "";
      return h("tr", { "data-id": d.id },
        h("th", { scope: "row" }, h("code", {}, d.id)),
        h("td", {}, `${d.method} ${d.url}`),
        h("td", {}, d.status),
        h("td", {}, String(attempts.length)),
        h("td", {}, error),
        h("td", {}, d.status === "dead" ? h("button", { type: "button", onclick: async () => {
          try {
            await api("POST", `/v1/deliveries/${enc(d.id)}/retry`);
            status(`replaying ${d.id}`);
            deliveriesView();
          } catch (err) { failure(err); }
        } }, "Replay (admin)") : ""));
    }));
    if (!data.items.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 6 }, `No ${wanted} deliveries.`)));
  } catch (err) { failure(err); }
}

// ---- live tail of change events ------------------------------------------

function eventsView() {
  const list = h("ol", { id: "tail", reversed: true });
  const seen = h("p", { class: "muted", id: "tail-count" }, "Waiting for changes…");
  show(h("h2", {}, "Live events"),
    h("p", { class: "muted" }, "Change events as they are logged, newest first; the stream resumes after the last one seen when the connection drops."),
    seen, list);
  let n = 0;
  leaving.push(follow(() => "/v1/events", (e) => {
    n += 1;
    seen.textContent = `${n} event${n === 1 ? "" : "s"} since this view opened (position ${e.seq})`;
    const what = e.collection ? `${e.collection}/${e.document} v${e.version}` : `${(e.members || []).length} members`;
    list.prepend(h("li", { "data-seq": String(e.seq) },
      h("code", {}, `#${e.seq}`), ` ${e.type} · ${what} · ${e.at}`,
      e.key ? ` · key ${e.key}` : "", e.actor ? ` · user ${e.actor.subject}` : "", e.transaction ? ` · transaction ${e.transaction}` : "",
      e.data ? h("pre", {}, json(e.data)) : null));
    while (list.children.length > 200) list.lastElementChild.remove();
  }, null));
}

// ---- schemas --------------------------------------------------------------

async function schemaView(coll) {
  const title = h("h2", {}, `Schemas of ${coll}`);
  try {
    const { data } = await api("GET", `/v1/collections/${enc(coll)}/schemas`);
    const versions = data.items.map((v) => h("section", { "data-version": String(v.version) },
      h("h3", {}, `schema_version ${v.version} · revision ${v.revision} · ${v.state}`),
      h("p", { class: "muted" }, `declared ${v.declared_at}; active from ${v.active_at}`),
      h("pre", {}, json(v.schema))));
    const found = h("div", { id: "violations" });
    show(title, h("p", {}, `Validation: ${data.validation}`), ...versions, h("h3", {}, "Documents that do not satisfy them"), found,
      h("p", {}, h("a", { href: `#/documents/${enc(coll)}` }, `Back to ${coll}`)));
    try {
      const { data: v } = await api("GET", `/v1/collections/${enc(coll)}/schema/violations`);
      found.replaceChildren(h("p", { class: "muted" }, `${v.state}: ${v.scanned} checked, ${v.invalid} invalid${v.truncated ? " (the first 100 listed)" : ""}`),
        h("ul", {}, ...v.items.map((f) => h("li", {}, h("a", { href: `#/doc/${enc(coll)}/${enc(f.id)}` }, f.id),
          ` (v${f.schema_version}): `, f.errors.map((e) => `${e.pointer || "(the document)"} ${e.keyword}: ${e.detail}`).join("; ")))));
    } catch { found.replaceChildren(h("p", { class: "muted" }, "Listed for admins of the collection.")); }
  } catch (err) { show(title, h("p", { class: "error" }, err.message)); }
}

// ---- routing --------------------------------------------------------------

function route() {
  if (!signedIn()) {
    for (const stop of leaving) stop();
    leaving = [];
    signInView();
    return;
  }
  document.getElementById("sign-in").hidden = true;
  document.getElementById("nav").hidden = false;
  const [path] = location.hash.replace(/^#/, "").split("?");
  const decode = (p) => { try { return decodeURIComponent(p); } catch { return p; } };
  const parts = path.split("/").filter(Boolean).map(decode);
  for (const a of document.querySelectorAll("nav a")) {
    if (a.getAttribute("href") === `#/${parts[0] || "collections"}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  switch (parts[0]) {
    case "documents": return documentsView(parts[1]);
    case "doc": return documentView(parts[1], parts[2]);
    case "view-as": return viewAsView(parts[1]);
    case "schema": return schemaView(parts[1]);
    case "transactions": return transactionsView();
    case "deliveries": return deliveriesView();
    case "events": return eventsView();
    default: return collectionsView();
  }
}

window.addEventListener("hashchange", route);
try {
  if (await oidc.complete(store)) status("signed in");
} catch (err) {
  status(err.message, true);
}
oidc.keepFresh(store, lost);
route();
if (signedIn()) showWho();
