#!/usr/bin/env node
// Real-browser checks of a running txgate, in Debian's headless Chromium
// driven by playwright-core (installed by scripts/install-test-tools).
//
//   node tests/clients/browser.mjs <gateway-base-url> <artifact-dir> [api-key] [page-port]
//   node tests/clients/browser.mjs free-port     # prints a free loopback port
//
// 1. cors: a page served from another origin, http://127.0.0.1:<page-port>,
//    runs its own fetch() calls against the gateway: create a document, read
//    the ETag header, replace it with If-Match (a new ETag), then replace it
//    again with the stale ETag, which must answer 409 version_conflict; the
//    page shows `conflict: expected 1, actual 2` from the problem body. With
//    an api-key every call carries `Authorization: Bearer <key>`, so the CORS
//    preflight must allow that header too. Screenshot: <artifact-dir>/browser.png.
// 2. docs: <gateway>/docs must render the API reference without any request
//    leaving the gateway's origin. Requests elsewhere are recorded and
//    aborted (never sent). Screenshot: <artifact-dir>/docs.png.
// 3. live: a page from the other origin keeps a filtered, sorted list live:
//    it lists a query a page at a time, then follows the filtered change
//    events from the first page's position, reading the Server-Sent Events
//    with fetch() and the Authorization header (never a key in a URL), and
//    applies each event newer than what it holds. Meanwhile documents are
//    written with curl (creates, moves into and out of the filter, a
//    delete, a transaction); the list the page shows must then equal a
//    fresh query, in order. Screenshot: <artifact-dir>/live.png.
//
// The gateway must list the page's origin in TXGATE_CORS_ORIGINS, so the
// caller chooses the page port first (4th argument or PAGE_ORIGIN_PORT; if
// neither, a free port is picked and printed, which only works with
// TXGATE_CORS_ORIGINS='*'), e.g.:
//
//   port=$(node tests/clients/browser.mjs free-port)
//   TXGATE_CORS_ORIGINS=http://127.0.0.1:$port TXGATE_API_KEYS=$key:read+write ... txgate serve &
//   node tests/clients/browser.mjs http://127.0.0.1:8080 target/browser "$key" "$port"
//
// 4. console: see checkConsole below.
//
// Environment: CHROMIUM (default /usr/bin/chromium); BROWSER_CHECKS, a
// comma-separated subset of `cors,docs,live,console` (default all); BROWSER_TIMEOUT_MS
// (default 15000) for each wait. Exits 0 when every check passes, 1 when one
// fails (each failure is printed), 2 on bad usage.

import { execFileSync } from "node:child_process";
import { createServer } from "node:http";
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { chromium } from "playwright-core";

const CHROMIUM_ARGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];
const TIMEOUT = Number(process.env.BROWSER_TIMEOUT_MS || 15000);

function usage(message) {
  if (message) console.error(`browser: ${message}`);
  console.error(
    "usage: node tests/clients/browser.mjs <gateway-base-url> <artifact-dir> [api-key] [page-port]\n" +
      "       node tests/clients/browser.mjs free-port",
  );
  process.exit(2);
}

function freePort() {
  return new Promise((ok, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

async function screenshot(page, path, failures) {
  try {
    await page.screenshot({ path });
  } catch (e) {
    failures.push(`no screenshot ${path}: ${e.message.split("\n")[0]}`);
  }
}

const escapeJson = (v) => JSON.stringify(v).replace(/</g, "\\u003c");

// The page of check 1. All of its logic runs in the browser; it reports each
// step as one line of #log, and sets data-state on <body> to done or error.
function corsPage(config) {
  return `<!doctype html>
<html>
<head><meta charset="utf-8"><title>txgate CORS check</title><link rel="icon" href="data:,">
<style>body{font:15px/1.5 monospace;margin:2em}#log li{white-space:pre}</style></head>
<body data-state="running">
<h1>txgate from another origin</h1>
<p>page origin <b id="origin"></b>, gateway <b id="gateway"></b></p>
<ol id="log"></ol>
<script id="config" type="application/json">${escapeJson(config)}</script>
<script>
const cfg = JSON.parse(document.getElementById("config").textContent);
document.getElementById("origin").textContent = location.origin;
document.getElementById("gateway").textContent = cfg.gateway;
const log = document.getElementById("log");
const line = (text) => { const li = document.createElement("li"); li.textContent = text; log.append(li); };
async function run() {
  const headers = { "content-type": "application/json" };
  if (cfg.apiKey) headers.authorization = "Bearer " + cfg.apiKey;
  const collection = cfg.gateway + "/v1/collections/" + cfg.collection + "/documents";

  let r = await fetch(collection, { method: "POST", headers, body: JSON.stringify({ title: "first" }) });
  if (r.status !== 201) throw new Error("create answered " + r.status + ": " + await r.text());
  const created = await r.json();
  const etag1 = r.headers.get("ETag");
  line("created: version " + created.version + ", etag " + etag1);
  line("location header readable: " + (r.headers.get("Location") !== null));
  if (etag1 === null) throw new Error("the ETag header of the create is not readable (Access-Control-Expose-Headers)");
  const doc = collection + "/" + encodeURIComponent(created.id);

  r = await fetch(doc, { method: "PUT", headers: { ...headers, "If-Match": etag1 }, body: JSON.stringify({ title: "second" }) });
  if (r.status !== 200) throw new Error("update with If-Match " + etag1 + " answered " + r.status + ": " + await r.text());
  const updated = await r.json();
  const etag2 = r.headers.get("ETag");
  line("updated: version " + updated.version + ", etag " + etag2);

  r = await fetch(doc, { method: "PUT", headers: { ...headers, "If-Match": etag1 }, body: JSON.stringify({ title: "stale" }) });
  const type = r.headers.get("Content-Type");
  const problem = await r.json();
  line("stale update: status " + r.status + ", " + type + ", code " + problem.code);
  line("conflict: expected " + problem.expected + ", actual " + problem.actual);
}
run().then(
  () => { line("done"); document.body.dataset.state = "done"; },
  (e) => { line("error: " + e.message); document.body.dataset.state = "error"; },
);
</script>
</body>
</html>`;
}

async function checkCors(browser, { gateway, artifacts, apiKey, pagePort }) {
  const failures = [];
  const collection = `browser_${Date.now().toString(36)}`;
  const html = corsPage({ gateway, apiKey: apiKey ?? null, collection });
  const server = createServer((req, res) => {
    if (req.url === "/" || req.url.startsWith("/?")) {
      res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" });
      res.end(html);
    } else {
      res.writeHead(404, { "content-type": "text/plain" });
      res.end("not found");
    }
  });
  await new Promise((ok, fail) => {
    server.on("error", (e) => fail(new Error(`cannot serve the page on 127.0.0.1:${pagePort}: ${e.message}`)));
    server.listen(pagePort, "127.0.0.1", ok);
  });
  const pageUrl = `http://127.0.0.1:${pagePort}/`;
  const context = await browser.newContext({ viewport: { width: 1000, height: 520 } });
  const page = await context.newPage();
  const gatewayOrigin = new URL(gateway).origin;
  const staleNote = "Failed to load resource: the server responded with a status of 409";
  let expected409 = 0;
  const responses = [];
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    // Chromium logs every 4xx; the stale update's 409 is the one expected.
    if (m.text().startsWith(staleNote) && m.location().url.startsWith(gatewayOrigin) && expected409++ === 0) return;
    failures.push(`console error: ${m.text()}${m.location().url ? ` (${m.location().url})` : ""}`);
  });
  page.on("pageerror", (e) => failures.push(`uncaught page error: ${e.message}`));
  page.on("requestfailed", (r) => failures.push(`request failed: ${r.method()} ${r.url()}: ${r.failure()?.errorText}`));
  page.on("response", (r) => {
    const req = r.request();
    responses.push(`${req.method()} ${r.url()} -> ${r.status()}`);
    if (r.status() >= 400 && !(r.status() === 409 && req.method() === "PUT")) {
      failures.push(`request answered ${r.status()}: ${req.method()} ${r.url()}`);
    }
  });
  // Preflights are not page requests for Playwright; see them through CDP.
  // (No page.route here: with interception on, Playwright answers preflights
  // itself, and the gateway's CORS would not be tested.)
  const preflights = [];
  const cdp = await context.newCDPSession(page);
  await cdp.send("Network.enable");
  cdp.on("Network.responseReceived", (e) => {
    if (e.type === "Preflight") preflights.push(`OPTIONS ${e.response.url} -> ${e.response.status}`);
  });

  try {
    await page.goto(pageUrl);
    await page.waitForSelector("body[data-state=done], body[data-state=error]", { timeout: TIMEOUT });
  } catch (e) {
    failures.push(`the page did not finish: ${e.message.split("\n")[0]}`);
  }
  const lines = await page.locator("#log li").allInnerTexts().catch(() => []);
  await screenshot(page, join(artifacts, "browser.png"), failures);
  await context.close();
  await new Promise((ok) => server.close(ok));

  const want = [
    'created: version 1, etag "1"',
    "location header readable: true",
    'updated: version 2, etag "2"',
    "stale update: status 409, application/problem+json, code version_conflict",
    "conflict: expected 1, actual 2",
    "done",
  ];
  if (JSON.stringify(lines) !== JSON.stringify(want)) {
    failures.push(
      `the page shows:\n      ${lines.join("\n      ") || "(nothing)"}\n    instead of:\n      ${want.join("\n      ")}`,
    );
  }
  if (expected409 !== 1 && lines.includes("done")) {
    failures.push(`expected exactly one 409 console line for the stale update, saw ${expected409}`);
  }
  if (apiKey && preflights.length === 0) {
    failures.push("no CORS preflight was seen although every call carried Authorization");
  }
  console.log(`cors: page ${pageUrl} -> gateway ${gateway}${apiKey ? " (Authorization: Bearer ...)" : ""}`);
  for (const l of lines) console.log(`  page: ${l}`);
  console.log(`  preflights:\n    ${preflights.join("\n    ") || "(none)"}`);
  console.log(`  responses:\n    ${responses.join("\n    ")}`);
  return failures;
}

async function checkDocs(browser, { gateway, artifacts }) {
  const failures = [];
  const origin = new URL(gateway).origin;
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const requests = [];
  const foreign = [];
  // Every request the page makes goes through here: the gateway's own are
  // let through, anything else is recorded and aborted, never sent.
  await context.route("**/*", (route) => {
    const url = route.request().url();
    requests.push(`${route.request().method()} ${url}`);
    if (url.startsWith("data:") || url.startsWith("blob:") || new URL(url).origin === origin) {
      return route.continue();
    }
    foreign.push(url);
    return route.abort("blockedbyclient");
  });
  const page = await context.newPage();
  const consoleErrors = [];
  page.on("console", (m) => {
    if (m.type() === "error") consoleErrors.push(`${m.text()}${m.location().url ? ` (${m.location().url})` : ""}`);
  });
  page.on("pageerror", (e) => failures.push(`uncaught page error: ${e.message}`));
  page.on("websocket", (ws) => foreign.push(ws.url()));

  let rendered = false;
  try {
    const r = await page.goto(`${gateway}/docs`);
    if (!r || r.status() !== 200) failures.push(`GET ${gateway}/docs answered ${r?.status()}`);
    // Rendered: a heading names the API (txgate) and an operation's summary
    // is shown as a heading too.
    await page.waitForFunction(
      () => {
        const headings = [...document.querySelectorAll("h1, h2")].map((h) => h.innerText);
        return headings.some((t) => t.includes("txgate")) && headings.some((t) => t.includes("Create a document"));
      },
      null,
      { timeout: TIMEOUT },
    );
    rendered = true;
    await page.waitForLoadState("networkidle", { timeout: TIMEOUT }).catch(() => {});
  } catch (e) {
    failures.push(`the API reference did not render: ${e.message.split("\n")[0]}`);
  }
  const title = await page.title().catch(() => "");
  if (!title.includes("txgate")) failures.push(`the page title is ${JSON.stringify(title)}, not one naming txgate`);
  await screenshot(page, join(artifacts, "docs.png"), failures);
  await context.close();

  if (foreign.length > 0) {
    // Put first: when the page depends on another host, that is why it failed.
    failures.unshift(
      `${foreign.length} request(s) went to another host than the gateway (${origin}) (aborted here, not sent):\n      ${[...new Set(foreign)].join("\n      ")}`,
    );
  }
  // A load the page's own Content-Security-Policy refused was never sent
  // (Chromium stops it before the network): shown, not a failure. The
  // requests this check aborted itself are already counted above.
  const cspBlocked = [];
  for (const e of consoleErrors) {
    if (/violates the following Content Security Policy directive.*has been blocked/.test(e)) cspBlocked.push(e);
    else if (!/ERR_BLOCKED_BY_CLIENT/.test(e)) failures.push(`console error: ${e}`);
  }
  console.log(`docs: ${gateway}/docs, title ${JSON.stringify(title)}, rendered: ${rendered}`);
  console.log(`  ${requests.length} request(s):\n    ${requests.join("\n    ")}`);
  for (const e of cspBlocked) console.log(`  not sent, refused by the page's CSP: ${e}`);
  return failures;
}

// The page of check 3: a live list of the documents whose status is open,
// by amount (highest first), each shown as `<id> v<version> <amount>`.
function livePage(config) {
  return `<!doctype html>
<html>
<head><meta charset="utf-8"><title>txgate live list</title><link rel="icon" href="data:,">
<style>body{font:15px/1.5 monospace;margin:2em}</style></head>
<body data-state="listing">
<h1>Open orders, live</h1>
<p id="status">listing…</p>
<ul id="live"></ul>
<script id="config" type="application/json">${escapeJson(config)}</script>
<script>
const cfg = JSON.parse(document.getElementById("config").textContent);
const auth = { authorization: "Bearer " + cfg.apiKey };
const base = cfg.gateway + "/v1/collections/" + cfg.collection;
const filter = { status: "open" };
const view = new Map();
const list = document.getElementById("live");
const status = document.getElementById("status");
function apply(id, version, data, left) {
  const held = view.get(id);
  if (held && held.version >= version) return;
  if (left) view.delete(id);
  else view.set(id, { version, data });
}
function render() {
  const items = [...view.entries()].sort((a, b) => b[1].data.amount - a[1].data.amount || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  list.replaceChildren(...items.map(([id, d]) => {
    const li = document.createElement("li");
    li.textContent = id + " v" + d.version + " " + d.data.amount;
    return li;
  }));
}
async function listAll() {
  let after = null;
  let position = null;
  do {
    const body = { filter, sort: ["-amount"], limit: 2 };
    if (after) body.after = after;
    const r = await fetch(base + "/query", { method: "POST", headers: { ...auth, "content-type": "application/json" }, body: JSON.stringify(body) });
    if (r.status !== 200) throw new Error("query answered " + r.status + ": " + await r.text());
    const page = await r.json();
    if (position === null) position = page.position;
    for (const d of page.items) apply(d.id, d.version, d.data, false);
    after = page.next;
  } while (after);
  return position;
}
async function follow(position) {
  const url = cfg.gateway + "/v1/events?after=" + position + "&collections=" + cfg.collection +
    "&filter=" + encodeURIComponent(JSON.stringify(filter));
  const r = await fetch(url, { headers: { ...auth, accept: "text/event-stream" } });
  if (r.status !== 200) throw new Error("events answered " + r.status + ": " + await r.text());
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  status.textContent = "live from position " + position;
  document.body.dataset.state = "live";
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the stream ended");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\\n\\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = block.split("\\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\\n");
      if (!data) continue;
      const e = JSON.parse(data);
      apply(e.document, e.version, e.data, e.left === true);
      render();
    }
  }
}
listAll().then((position) => { render(); return follow(position); }).catch((e) => {
  status.textContent = "error: " + e.message;
  document.body.dataset.state = "error";
});
</script>
</body>
</html>`;
}

async function checkLive(browser, { gateway, artifacts, apiKey, pagePort }) {
  const failures = [];
  const collection = `live_${Date.now().toString(36)}`;
  const base = `${gateway}/v1/collections/${collection}`;
  const headers = { "content-type": "application/json", ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) };
  // Writes go through curl, as a user's would.
  const curl = (method, path, body, extra = []) => {
    const args = ["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, `${gateway}${path}`, "-H", "content-type: application/json"];
    if (apiKey) args.push("-H", `authorization: Bearer ${apiKey}`);
    if (body !== undefined) args.push("--data-binary", JSON.stringify(body));
    const code = execFileSync("curl", [...args, ...extra], { encoding: "utf8" });
    if (!/^2/.test(code)) failures.push(`curl ${method} ${path} answered ${code}`);
  };
  const docs = `/v1/collections/${collection}/documents`;
  let r = await fetch(`${base}/indexes/status_amount`, { method: "PUT", headers, body: JSON.stringify({ fields: ["status", "-amount"] }) });
  if (r.status !== 201) return [`PUT index answered ${r.status}: ${await r.text()}`];
  for (let i = 0; ; i++) {
    const index = await (await fetch(`${base}/indexes/status_amount`, { headers })).json();
    if (index.state === "ready") break;
    if (index.state !== "building" || i > 300) return [`the index is ${index.state}: ${JSON.stringify(index)}`];
    await new Promise((ok) => setTimeout(ok, 100));
  }
  for (const [id, status, amount] of [["o1", "open", 10], ["o2", "open", 20], ["o3", "paid", 30], ["o6", "open", 60]]) {
    curl("POST", docs, { _id: id, status, amount });
  }

  const html = livePage({ gateway, apiKey: apiKey ?? "", collection });
  const server = createServer((req, res) => {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8", "cache-control": "no-store" });
    res.end(html);
  });
  await new Promise((ok, fail) => {
    server.on("error", (e) => fail(new Error(`cannot serve the page on 127.0.0.1:${pagePort}: ${e.message}`)));
    server.listen(pagePort, "127.0.0.1", ok);
  });
  const context = await browser.newContext({ viewport: { width: 800, height: 480 } });
  const page = await context.newPage();
  const urls = [];
  page.on("console", (m) => m.type() === "error" && failures.push(`console error: ${m.text()}`));
  page.on("pageerror", (e) => failures.push(`uncaught page error: ${e.message}`));
  page.on("request", (req) => urls.push(req.url()));
  let shown = [];
  let expected = [];
  try {
    await page.goto(`http://127.0.0.1:${pagePort}/`);
    await page.waitForSelector("body[data-state=live], body[data-state=error]", { timeout: TIMEOUT });
    if ((await page.getAttribute("body", "data-state")) === "error") throw new Error(await page.locator("#status").innerText());
    // While the page follows: into the set, out of it, changed in it,
    // deleted, a transaction, one more change.
    curl("POST", docs, { _id: "o4", status: "open", amount: 40 });
    curl("PATCH", `${docs}/o3`, { set: { status: "open" } });
    curl("PATCH", `${docs}/o1`, { set: { status: "paid" } });
    curl("PATCH", `${docs}/o2`, { set: { amount: 25 } });
    curl("DELETE", `${docs}/o4`);
    curl("POST", "/v1/transactions", {
      actions: [
        { op: "update", collection, id: "o1", set: { status: "open", amount: 5 } },
        { op: "insert", collection, id: "o5", data: { status: "open", amount: 50 } },
        { op: "delete", collection, id: "o6" },
      ],
    });
    curl("PATCH", `${docs}/o5`, { inc: { amount: 1 } });
    // What a fresh query answers now.
    const fresh = await (
      await fetch(`${base}/query`, { method: "POST", headers, body: JSON.stringify({ filter: { status: "open" }, sort: ["-amount"], limit: 100 }) })
    ).json();
    expected = fresh.items.map((d) => `${d.id} v${d.version} ${d.data.amount}`);
    await page
      .waitForFunction((want) => JSON.stringify([...document.querySelectorAll("#live li")].map((li) => li.textContent)) === JSON.stringify(want), expected, {
        timeout: TIMEOUT,
      })
      .catch(() => {});
    shown = await page.locator("#live li").allInnerTexts();
  } catch (e) {
    failures.push(`the page did not go live: ${e.message.split("\n")[0]}`);
  }
  await screenshot(page, join(artifacts, "live.png"), failures);
  await context.close();
  await new Promise((ok) => server.close(ok));
  if (JSON.stringify(shown) !== JSON.stringify(expected)) {
    failures.push(`the live list shows:\n      ${shown.join("\n      ") || "(nothing)"}\n    a fresh query:\n      ${expected.join("\n      ")}`);
  }
  if (expected.length !== 4) failures.push(`a fresh query holds ${expected.length} documents, not the 4 the writes leave`);
  if (apiKey && urls.some((u) => u.includes(apiKey))) failures.push("the page put the API key in a URL");
  console.log(`live: ${collection}, the page shows:\n    ${shown.join("\n    ")}`);
  return failures;
}

// Check 4, console: the gateway's own UI at /console, in two browser
// contexts (two tabs, each with its own session), signed in with the key.
// Both open one document; the first saves; the second's save answers 409 and
// the conflict view shows base, mine and current field by field with the
// changes since (the key's name); keeping one field of its own and taking
// the rest gives version base + 2 with the chosen values. A document field
// holding markup is shown as text and runs nothing (CSP script-src 'self').
// The live tail shows a change made by curl. An admin views a ruled
// collection as one of its users. Each view passes axe-core with
// no serious or critical violation. Screenshots: console-*.png.
async function signIn(page, gateway, apiKey) {
  await page.goto(`${gateway}/console`);
  await page.waitForSelector("#api-key", { state: "visible", timeout: TIMEOUT });
  await page.fill("#api-key", apiKey ?? "");
  await page.click("#sign-in-form button[type=submit]");
  await page.waitForSelector("#nav:not([hidden])", { timeout: TIMEOUT });
}

async function axeCheck(browser, { gateway, apiKey }, views, failures) {
  const { readFileSync } = await import("node:fs");
  const { createRequire } = await import("node:module");
  const axeSource = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");
  // Only for axe's own script: the console's CSP would refuse it.
  const context = await browser.newContext({ bypassCSP: true, viewport: { width: 1280, height: 800 } });
  const page = await context.newPage();
  await signIn(page, gateway, apiKey);
  for (const [name, hash, ready] of views) {
    await page.evaluate((h) => { location.hash = h; }, hash);
    await page.waitForSelector(ready, { timeout: TIMEOUT }).catch(() => failures.push(`axe: ${name} never showed ${ready}`));
    await page.evaluate(axeSource);
    const result = await page.evaluate(async () => await window.axe.run(document, { resultTypes: ["violations"] }));
    for (const v of result.violations) {
      if (v.impact === "serious" || v.impact === "critical") {
        failures.push(`axe: ${name}: ${v.impact} ${v.id}: ${v.help} (${v.nodes.slice(0, 3).map((n) => n.target.join(" ")).join("; ")})`);
      }
    }
    console.log(`console: axe on ${name}: ${result.violations.length} violation(s), none serious: ${!result.violations.some((v) => ["serious", "critical"].includes(v.impact))}`);
  }
  await context.close();
}

// A transaction's hook to a receiver that is down dies (the gateway runs
// with TXGATE_HOOK_MAX_AGE_SECS=2); the deliveries view lists it with its
// last error; the receiver comes up; "Replay" delivers it.
async function replayDeadDelivery(page, { gateway, artifacts }, collection, headers, failures) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}/hook`;
  let r = await fetch(`${gateway}/v1/transactions`, { method: "POST", headers, body: JSON.stringify({
    actions: [{ op: "insert", collection, id: "hooked", data: { n: 1 } }], hooks: [{ url }] }) });
  if (r.status !== 200) { failures.push(`the hooked transaction answered ${r.status}: ${await r.text()}`); return; }
  const txn = (await r.json()).id;
  let dead;
  for (let i = 0; i < 200 && !dead; i++) {
    const page = await (await fetch(`${gateway}/v1/deliveries?status=dead&limit=100`, { headers })).json();
    dead = page.items.find((d) => d.transaction === txn);
    if (!dead) await new Promise((ok) => setTimeout(ok, 100));
  }
  if (!dead) { failures.push("the delivery to a receiver that is down never died"); return; }
  const received = [];
  const receiver = createServer((req, res) => { received.push(`${req.method} ${req.url}`); req.resume(); res.writeHead(204); res.end(); });
  await new Promise((ok) => receiver.listen(port, "127.0.0.1", ok));
  try {
    await page.evaluate(() => { location.hash = "#/deliveries?status=dead"; });
    const row = page.locator(`#deliveries tbody tr[data-id="${dead.id}"]`);
    await row.waitFor({ timeout: TIMEOUT });
    const cells = await row.locator("td").allInnerTexts();
    if (!cells[3] || cells[3].trim() === "") failures.push(`the dead delivery shows no last error: ${JSON.stringify(cells)}`);
    await row.locator("button").click();
    let state;
    for (let i = 0; i < 200 && state !== "delivered"; i++) {
      state = (await (await fetch(`${gateway}/v1/deliveries/${dead.id}`, { headers })).json()).status;
      if (state !== "delivered") await new Promise((ok) => setTimeout(ok, 100));
    }
    if (state !== "delivered" || received.length !== 1) failures.push(`after the replay: ${state}, the receiver got ${JSON.stringify(received)}`);
    await screenshot(page, join(artifacts, "console-deliveries.png"), failures);
  } finally {
    await new Promise((ok) => receiver.close(ok));
  }
}

// View as: a collection with an owner rule that reads the owner only;
// the collections list links to "view as"; as user ada (role customer)
// the view shows ada's document alone, without the field the rule hides,
// and names the grant; the view is recorded as an access.viewed_as event.
async function viewAs(page, { gateway, artifacts }, collection, headers, failures) {
  const ruled = `${collection}_owned`;
  const base = `${gateway}/v1/collections/${ruled}`;
  const send = (method, path, body) => fetch(`${base}${path}`, { method, headers: { ...headers, "content-type": "application/json" }, body: JSON.stringify(body) });
  for (const [id, owner] of [["a1", "ada"], ["b1", "bob"]]) {
    const r = await send("POST", "/documents", { _id: id, owner, secret: "s" });
    if (r.status !== 201) { failures.push(`view as: creating ${id} answered ${r.status}`); return; }
  }
  let r = await send("PUT", "/indexes/owner", { fields: ["owner"] });
  if (r.status !== 201) { failures.push(`view as: the index answered ${r.status}: ${await r.text()}`); return; }
  let state;
  for (let i = 0; i < 300 && state !== "ready"; i++) {
    state = (await (await fetch(`${base}/indexes/owner`, { headers })).json()).state;
    if (state !== "ready") await new Promise((ok) => setTimeout(ok, 100));
  }
  if (state !== "ready") { failures.push(`view as: the index is ${state}`); return; }
  r = await send("PUT", "/rules", { grants: [{ name: "own", roles: ["customer"], match: { owner: { $auth: "sub" } },
    actions: ["read"], fields: { read: ["owner"] } }] });
  if (r.status !== 200) { failures.push(`view as: the rules answered ${r.status}: ${await r.text()}`); return; }
  await page.evaluate(() => { location.hash = "#/collections"; });
  const link = `a[href="#/view-as/${ruled}"]`;
  try {
    await page.waitForSelector(link, { timeout: TIMEOUT });
    await page.click(link);
    await page.waitForSelector("#view form #sub", { timeout: TIMEOUT });
    await page.fill("#view form #sub", "ada");
    await page.fill("#view form #roles", "customer");
    await page.click("#view form button[type=submit]");
    await page.waitForSelector("#view-as tbody tr[data-id=a1]", { timeout: TIMEOUT });
  } catch (e) {
    failures.push(`view as: ${e.message.split("\n")[0]}`);
    return;
  }
  const ids = await page.$$eval("#view-as tbody tr", (rows) => rows.map((row) => row.dataset.id));
  if (JSON.stringify(ids) !== JSON.stringify(["a1"])) failures.push(`view as ada shows ${JSON.stringify(ids)}`);
  const data = await page.locator("#view-as tbody tr[data-id=a1] td .value").innerText();
  if (data.includes("secret")) failures.push(`view as ada shows a field the rule hides: ${data}`);
  const note = await page.locator("#view-as-note").innerText();
  if (!note.includes(`${ruled}/own@1`)) failures.push(`view as names no grant: ${note}`);
  const events = await (await fetch(`${gateway}/v1/events?types=access.viewed_as&collections=${ruled}&after=0`, { headers: { ...headers, accept: "application/json" } })).json();
  if (!events.items?.some((e) => e.data?.principal?.sub === "ada")) failures.push(`the view was not recorded: ${JSON.stringify(events)}`);
  await screenshot(page, join(artifacts, "console-view-as.png"), failures);
}

// Validation: a collection with a JSON Schema; a save the schema refuses
// shows each error beside the editor, at its field's line; a conflict whose
// merge would break the schema marks the field in the conflict view.
async function schemaErrors({ page, allow }, { gateway, artifacts }, collection, headers, failures) {
  const checked = `${collection}_checked`;
  const base = `${gateway}/v1/collections/${checked}`;
  const send = (method, path, body) => fetch(`${base}${path}`, { method, headers: { ...headers, "content-type": "application/json" }, body: JSON.stringify(body) });
  let r = await send("PUT", "/schemas/1", { type: "object", properties: { total: { type: "number", minimum: 0 }, qty: { type: "integer" } } });
  if (r.status !== 202) { failures.push(`schemas: the declaration answered ${r.status}: ${await r.text()}`); return; }
  let state;
  for (let i = 0; i < 100 && state !== "active"; i++) {
    state = (await (await fetch(`${base}/schemas/1`, { headers })).json()).state;
    if (state !== "active") await new Promise((ok) => setTimeout(ok, 100));
  }
  if (state !== "active") { failures.push(`schemas: the schema is ${state}`); return; }
  r = await send("POST", "/documents", { _id: "v", total: 5, qty: 1 });
  if (r.status !== 201) { failures.push(`schemas: creating v answered ${r.status}`); return; }
  try {
    await page.evaluate((h) => { location.hash = h; }, `#/doc/${checked}/v`);
    await page.waitForSelector("#editor", { timeout: TIMEOUT });
    await page.fill("#editor", JSON.stringify({ total: -1, qty: 1 }));
    allow(422);
    await page.click("#save");
    await page.waitForSelector('#schema-errors li[data-pointer="/total"]', { timeout: TIMEOUT });
    const shown = await page.locator("#schema-errors li").allInnerTexts();
    if (shown.length !== 1 || !shown[0].includes("line 2") || !shown[0].includes("minimum")) failures.push(`the editor's schema errors: ${JSON.stringify(shown)}`);
    if ((await page.getAttribute("#editor", "aria-invalid")) !== "true") failures.push("the editor is not marked invalid");
    await screenshot(page, join(artifacts, "console-schema-errors.png"), failures);
    // Someone else changes it; this tab's edit (from version 1) breaks the schema too.
    r = await send("PATCH", "/documents/v", { set: { qty: 2 } });
    if (r.status !== 200) failures.push(`schemas: the other change answered ${r.status}`);
    await page.fill("#editor", JSON.stringify({ total: -2, qty: 1 }, null, 2));
    allow(409);
    await page.click("#save");
    await page.waitForSelector("#conflict tr.invalid[data-path=total]", { timeout: TIMEOUT });
    const listed = await page.locator("#merge-schema-errors li").allInnerTexts();
    if (listed.length !== 1 || !listed[0].includes("/total")) failures.push(`the conflict view's schema errors: ${JSON.stringify(listed)}`);
    await screenshot(page, join(artifacts, "console-conflict-schema.png"), failures);
  } catch (e) {
    failures.push(`schemas: ${e.message.split("\n")[0]}`);
  }
}

// A transaction left pending by a gateway killed mid-commit (browser-test
// makes one on its own gateway, STUCK_GATEWAY) is listed by the
// transactions view and aborted from it with the admin key.
async function abortStuck(browser, { apiKey, artifacts }, failures) {
  const gateway = process.env.STUCK_GATEWAY;
  if (!gateway) {
    failures.push("no STUCK_GATEWAY: tests/clients/browser-test makes one for the console check");
    return;
  }
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const pending = (await (await fetch(`${gateway}/v1/transactions?status=pending`, { headers })).json()).items;
  if (!pending.length) { failures.push("the stuck gateway has no pending transaction"); return; }
  const context = await browser.newContext({ viewport: { width: 1100, height: 600 } });
  const page = await context.newPage();
  page.on("pageerror", (e) => failures.push(`stuck: uncaught page error: ${e.message}`));
  try {
    await signIn(page, gateway, apiKey);
    await page.evaluate(() => { location.hash = "#/transactions?status=pending"; });
    for (const txn of pending) {
      const row = page.locator(`#transactions tbody tr[data-id="${txn.id}"]`);
      await row.waitFor({ timeout: TIMEOUT });
      await screenshot(page, join(artifacts, "console-stuck.png"), failures);
      await row.locator("button").click();
      await page.waitForFunction((id) => document.getElementById("status").textContent.includes(`aborted ${id}`), txn.id, { timeout: TIMEOUT });
      const now = await (await fetch(`${gateway}/v1/transactions/${txn.id}`, { headers })).json();
      if (!["aborted", "rolled_back"].includes(now.status)) failures.push(`after the console's abort, ${txn.id} is ${now.status}`);
    }
    console.log(`console: aborted ${pending.length} stuck transaction(s) from the transactions view`);
  } catch (e) {
    failures.push(`aborting the stuck transaction: ${e.message.split("\n")[0]}`);
  }
  await context.close();
}

async function checkConsole(browser, opts) {
  const { gateway, artifacts, apiKey } = opts;
  const failures = [];
  const collection = `console_${Date.now().toString(36)}`;
  const docs = `${gateway}/v1/collections/${collection}/documents`;
  const headers = { "content-type": "application/json", ...(apiKey ? { authorization: `Bearer ${apiKey}` } : {}) };
  const markup = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>';
  let r = await fetch(docs, { method: "POST", headers, body: JSON.stringify({ _id: "shared", title: "draft", qty: 1, note: markup }) });
  if (r.status !== 201) return [`create answered ${r.status}: ${await r.text()}`];

  let restarting = false;
  const pageOf = async (name) => {
    const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
    const page = await context.newPage();
    // The refusals a check provokes on purpose, by status.
    const allowed = { 409: name === "second" ? 1 : 0, 422: 0 };
    page.on("console", (m) => {
      if (m.type() !== "error") return;
      const status = Object.keys(allowed).find((s) => m.text().includes(`status of ${s}`));
      if (status && allowed[status]-- > 0) return;
      // While the gateway is down on purpose, the tail's requests fail.
      if (restarting && /net::ERR_|Failed to fetch/.test(m.text())) return;
      failures.push(`${name}: console error: ${m.text()}`);
    });
    page.on("pageerror", (e) => failures.push(`${name}: uncaught page error: ${e.message}`));
    page.on("dialog", (d) => { failures.push(`${name}: a dialog opened: ${d.message()}`); d.dismiss(); });
    const urls = [];
    page.on("request", (req) => urls.push(req.url()));
    await signIn(page, gateway, apiKey);
    return { context, page, urls, allow: (status) => { allowed[status] += 1; } };
  };
  const first = await pageOf("first");
  const second = await pageOf("second");
  try {
    const open = async (page) => {
      await page.evaluate((h) => { location.hash = h; }, `#/doc/${collection}/shared`);
      await page.waitForSelector("#editor", { timeout: TIMEOUT });
      return JSON.parse(await page.inputValue("#editor"));
    };
    const a = await open(first.page);
    const b = await open(second.page);
    if (a.note !== markup) failures.push(`the editor shows the note as ${JSON.stringify(a.note)}`);
    // The first tab saves.
    await first.page.fill("#editor", JSON.stringify({ ...a, title: "A's title", qty: 2 }, null, 2));
    await first.page.click("#save");
    await first.page.waitForFunction(() => document.getElementById("status").textContent.includes("saved: version 2"), null, { timeout: TIMEOUT });
    // The second tab saves its own edit, made from version 1.
    await second.page.fill("#editor", JSON.stringify({ ...b, qty: 5, note: "B's note" }, null, 2));
    await second.page.click("#save");
    await second.page.waitForSelector("#conflict", { timeout: TIMEOUT });
    const rows = await second.page.$$eval("#conflict tbody tr", (trs) =>
      trs.map((tr) => [tr.dataset.path, ...[...tr.querySelectorAll("td")].slice(0, 3).map((td) => td.textContent)]));
    const want = [
      ["note", JSON.stringify(markup), JSON.stringify("B's note"), JSON.stringify(markup)],
      ["qty", "1", "5", "2"],
      ["title", '"draft"', '"draft"', `"A's title"`],
    ];
    if (JSON.stringify(rows) !== JSON.stringify(want)) failures.push(`the conflict view shows ${JSON.stringify(rows)}, not ${JSON.stringify(want)}`);
    const changes = await second.page.locator("#changes li").allInnerTexts();
    if (changes.length !== 1 || !changes[0].includes("version 2") || !changes[0].includes("key browser") || !changes[0].includes("changed qty, title")) {
      failures.push(`the changes since: ${JSON.stringify(changes)}`);
    }
    await screenshot(second.page, join(artifacts, "console-conflict.png"), failures);
    // Readable on a phone: nothing but a table's own scroller is wider than the screen.
    await second.page.setViewportSize({ width: 390, height: 844 });
    const wide = await second.page.evaluate(() => document.documentElement.scrollWidth);
    if (wide > 392) failures.push(`at a phone's width (390 px) the page is ${wide} px wide`);
    await screenshot(second.page, join(artifacts, "console-conflict-phone.png"), failures);
    await second.page.setViewportSize({ width: 1100, height: 760 });
    // Keep mine for qty (the conflict), take theirs for everything else.
    await second.page.check("#conflict tr[data-path=qty] input[value=mine]");
    await second.page.check("#conflict tr[data-path=note] input[value=theirs]");
    await second.page.click("#save-merge");
    await second.page.waitForFunction(() => document.getElementById("status").textContent.includes("saved the merge: version 3"), null, { timeout: TIMEOUT });
    const saved = await (await fetch(`${docs}/shared`, { headers })).json();
    const wantData = { title: "A's title", qty: 5, note: markup };
    const canonical = (o) => JSON.stringify(Object.fromEntries(Object.entries(o).sort()));
    if (saved.version !== 3 || canonical(saved.data) !== canonical(wantData)) {
      failures.push(`after the merge: version ${saved.version}, data ${JSON.stringify(saved.data)}; wanted 3, ${JSON.stringify(wantData)}`);
    }
    await screenshot(second.page, join(artifacts, "console-merged.png"), failures);
    // The list renders the markup as text.
    await first.page.evaluate((h) => { location.hash = h; }, `#/documents/${collection}`);
    await first.page.waitForSelector("#documents tbody tr[data-id=shared]", { timeout: TIMEOUT });
    const cell = await first.page.locator("#documents tbody tr[data-id=shared] td .value").innerText();
    if (!cell.includes("<img src=x onerror=")) failures.push(`the list shows the markup as ${JSON.stringify(cell)}`);
    if ((await first.page.locator("#documents img, #documents script").count()) !== 0) failures.push("the markup became elements");
    // Live: a document created with curl appears in the list, then in the tail.
    execFileSync("curl", ["-sS", "-o", "/dev/null", "-X", "POST", docs, "-H", "content-type: application/json",
      ...(apiKey ? ["-H", `authorization: Bearer ${apiKey}`] : []), "--data-binary", JSON.stringify({ _id: "by-curl", n: 1 })]);
    await first.page.waitForSelector("#documents tbody tr[data-id=by-curl]", { timeout: TIMEOUT })
      .catch(() => failures.push("the list did not show the document made by curl"));
    await screenshot(first.page, join(artifacts, "console-documents.png"), failures);
    await first.page.evaluate(() => { location.hash = "#/events"; });
    await first.page.waitForSelector("#tail-count", { timeout: TIMEOUT });
    await new Promise((ok) => setTimeout(ok, 1000));
    // The gateway dies (kill -9) and comes back on the same port, twice:
    // before the tail has shown any event, and after. A change made while
    // the tail is reconnecting appears once it has, and nothing appears
    // twice.
    const patchByCurl = (n) => execFileSync("curl", ["-sS", "-f", "-o", "/dev/null", "-X", "PATCH", `${docs}/by-curl`, "-H", "content-type: application/json",
      ...(apiKey ? ["-H", `authorization: Bearer ${apiKey}`] : []), "--data-binary", JSON.stringify({ set: { n } })]);
    const tailShows = (version, what) => first.page.waitForFunction(([c, v]) => [...document.querySelectorAll("#tail li")].some((li) => li.textContent.includes(`${c}/by-curl v${v}`)),
      [collection, version], { timeout: TIMEOUT }).catch(() => failures.push(what));
    if (!process.env.RESTART_GATEWAY) {
      failures.push("RESTART_GATEWAY is not set: the live tail's reconnect was not checked");
      patchByCurl(2);
      await tailShows(2, "the live tail did not show the change made by curl");
    } else {
      restarting = true;
      for (const version of [2, 3]) {
        execFileSync(process.env.RESTART_GATEWAY, [], { stdio: ["ignore", "ignore", "inherit"] });
        patchByCurl(version);
        await tailShows(version, `after the gateway came back, the live tail did not show the change made meanwhile (v${version})`);
      }
      const shown = await first.page.$$eval("#tail li", (lis) => lis.map((li) => li.dataset.seq));
      if (new Set(shown).size !== shown.length) failures.push(`the live tail showed an event twice after reconnecting: ${JSON.stringify(shown)}`);
      const v2 = await first.page.$$eval("#tail li", (lis, c) => lis.filter((li) => li.textContent.includes(`${c}/by-curl v2`)).length, collection);
      if (v2 !== 1) failures.push(`the live tail shows by-curl v2 ${v2} times after reconnecting`);
      restarting = false;
    }
    await screenshot(first.page, join(artifacts, "console-events.png"), failures);
    // A dead delivery, replayed from the deliveries view once its receiver is up.
    await replayDeadDelivery(first.page, opts, collection, headers, failures);
    // An admin reads a ruled collection as one of its users.
    await viewAs(first.page, opts, collection, headers, failures);
    // Schema errors beside the editor's fields and in the conflict view.
    await schemaErrors(first, opts, collection, headers, failures);
    for (const { page } of [first, second]) {
      if (await page.evaluate(() => window.__pwned !== undefined)) failures.push("the document's markup ran a script");
    }
    for (const { urls } of [first, second]) {
      if (apiKey && urls.some((u) => u.includes(apiKey))) failures.push("the console put the API key in a URL");
    }
  } catch (e) {
    failures.push(`the console check stopped: ${e.message.split("\n")[0]}`);
  }
  await first.context.close();
  await second.context.close();
  await abortStuck(browser, opts, failures);
  await axeCheck(browser, opts, [
    ["collections", "#/collections", "tbody tr"],
    ["documents", `#/documents/${collection}`, "#documents tbody tr"],
    ["document", `#/doc/${collection}/shared`, "#editor"],
    ["transactions", "#/transactions?status=done", "#transactions"],
    ["deliveries", "#/deliveries", "#deliveries"],
    ["events", "#/events", "#tail-count"],
    ["view as", `#/view-as/${collection}_owned?sub=ada&roles=customer`, "#view-as tbody tr"],
    ["schemas", `#/schema/${collection}_checked`, "#violations p"],
  ], failures);
  return failures;
}

async function main() {
  const argv = process.argv.slice(2);
  if (argv[0] === "free-port") {
    console.log(await freePort());
    return 0;
  }
  if (argv.length < 2 || argv.length > 4 || argv[0].startsWith("-")) usage();
  const [gatewayArg, artifactArg, apiKeyArg, portArg] = argv;
  let gateway;
  try {
    gateway = new URL(gatewayArg).href.replace(/\/+$/, "");
  } catch {
    usage(`not a URL: ${gatewayArg}`);
  }
  const artifacts = resolve(artifactArg);
  mkdirSync(artifacts, { recursive: true });
  const apiKey = apiKeyArg || undefined;
  const checks = (process.env.BROWSER_CHECKS || "cors,docs,live,console").split(",").map((s) => s.trim()).filter(Boolean);
  for (const c of checks) if (!["cors", "docs", "live", "console"].includes(c)) usage(`unknown check in BROWSER_CHECKS: ${c}`);
  let pagePort = Number(portArg || process.env.PAGE_ORIGIN_PORT || 0);
  if (!Number.isInteger(pagePort) || pagePort < 0 || pagePort > 65535) usage(`bad page port: ${portArg}`);
  if (pagePort === 0 && (checks.includes("cors") || checks.includes("live"))) {
    pagePort = await freePort();
    console.log(`browser: no page port given; serving the page on 127.0.0.1:${pagePort} (the gateway must allow that origin)`);
  }

  try {
    const r = await fetch(`${gateway}/healthz`, { signal: AbortSignal.timeout(5000) });
    if (!r.ok) throw new Error(`GET /healthz answered ${r.status}`);
  } catch (e) {
    console.error(`browser: FAIL: the gateway at ${gateway} does not answer: ${e.cause?.message || e.message}`);
    return 1;
  }

  const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
  let browser;
  try {
    browser = await chromium.launch({ executablePath, headless: true, args: CHROMIUM_ARGS });
  } catch (e) {
    console.error(`browser: FAIL: cannot start ${executablePath} (scripts/install-test-tools chromium): ${e.message.split("\n")[0]}`);
    return 1;
  }
  console.log(`browser: ${executablePath} ${browser.version()}, artifacts in ${artifacts}`);
  const opts = { gateway, artifacts, apiKey, pagePort };
  let failed = 0;
  try {
    for (const check of checks) {
      let failures;
      try {
        failures = await { cors: checkCors, docs: checkDocs, live: checkLive, console: checkConsole }[check](browser, opts);
      } catch (e) {
        failures = [`crashed: ${e.stack || e}`];
      }
      if (failures.length === 0) {
        console.log(`browser: ${check}: ok`);
      } else {
        failed++;
        console.log(`browser: ${check}: FAIL`);
        for (const f of failures) console.log(`  - ${f}`);
      }
    }
  } finally {
    await browser.close();
  }
  console.log(`browser: ${checks.length - failed} passed, ${failed} failed`);
  return failed === 0 ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    console.error(`browser: FAIL: ${e.stack || e}`);
    process.exit(1);
  },
);
