// The console signs in through a real OpenID Connect provider's own login
// and consent pages (oidc-provider's), in Debian's headless Chromium
// (playwright-core): the authorization code flow with PKCE, a token for
// txgate's audience. Signed in as `ann` (role shopper), the console shows
// who is signed in and what her roles allow, opens a document, saves an
// edit made from a stale version (409), resolves the conflict field by
// field, and the change events name her as the actor. No token ever
// appears in a URL; the only origins the page reaches are the gateway's
// and the provider's.
//
//   node console-sign-in.mjs <txgate-binary> <artifact-dir>
import { spawn } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { chromium } from "playwright-core";

const [binary, artifacts] = process.argv.slice(2);
if (!binary || !artifacts) throw new Error("usage: node console-sign-in.mjs <txgate-binary> <artifact-dir>");
const here = path.dirname(new URL(import.meta.url).pathname);
const TIMEOUT = Number(process.env.BROWSER_TIMEOUT_MS || 15000);
const step = (text) => console.log(`console-sign-in: ${text}`);

const freePort = () =>
  new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });

async function until(what, check, seconds = 15) {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${what} within ${seconds} s`);
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "txgate-console-sign-in-"));
const children = [];
let browser;
const failures = [];

async function main() {
  fs.mkdirSync(artifacts, { recursive: true });
  const [providerPort, port] = [await freePort(), await freePort()];
  const issuer = `http://127.0.0.1:${providerPort}`;
  const gateway = `http://127.0.0.1:${port}`;
  const key = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" });
  fs.writeFileSync(path.join(dir, "keys.json"), JSON.stringify([{ ...key, kid: "k1", alg: "RS256", use: "sig" }]));
  const log = (name) => fs.openSync(path.join(artifacts, name), "w");
  const providerLog = log("console-provider.log");
  children.push(spawn(process.execPath, [path.join(here, "../oidc/provider.mjs"), String(providerPort), path.join(dir, "keys.json"), `${gateway}/console`], { stdio: ["ignore", providerLog, providerLog] }));
  await until("the provider answers", async () => (await fetch(`${issuer}/.well-known/openid-configuration`)).ok);
  fs.writeFileSync(path.join(dir, "txgate.toml"), [
    "[[issuers]]", `url = "${issuer}"`, 'name = "Shop ID"', 'audiences = ["urn:txgate:api"]',
    'roles_claim = "realm_access.roles"', 'console_client_id = "txgate-console"',
    "[issuers.roles]", 'shopper = "read@products+write@carts"', "",
  ].join("\n"));
  const gatewayLog = log("console-gateway.log");
  children.push(spawn(binary, ["serve"], {
    env: { ...process.env, TXGATE_CONFIG: path.join(dir, "txgate.toml"), TXGATE_LISTEN: `127.0.0.1:${port}`, TXGATE_DATA_DIR: path.join(dir, "data"), TXGATE_STORE: "embedded" },
    stdio: ["ignore", gatewayLog, gatewayLog],
  }));
  await until("the gateway is ready", async () => (await fetch(`${gateway}/readyz`)).ok);

  // A backend (client credentials, role shopper) writes the document.
  const backend = async () => {
    const res = await fetch(`${issuer}/token`, {
      method: "POST",
      headers: { authorization: `Basic ${Buffer.from("backend:backend-secret-0123456789").toString("base64")}`, "content-type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams({ grant_type: "client_credentials", resource: "urn:txgate:api" }),
    });
    return (await res.json()).access_token;
  };
  const asBackend = { "content-type": "application/json", authorization: `Bearer ${await backend()}` };
  const docs = `${gateway}/v1/collections/carts/documents`;
  let r = await fetch(docs, { method: "POST", headers: asBackend, body: JSON.stringify({ _id: "cart-7", items: 1, note: "draft" }) });
  if (r.status !== 201) throw new Error(`create answered ${r.status}: ${await r.text()}`);

  const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
  browser = await chromium.launch({ executablePath, headless: true, args: ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"] });
  const context = await browser.newContext({ viewport: { width: 1100, height: 760 } });
  const page = await context.newPage();
  // What the console asks for (the provider's own pages load what they
  // load: fonts, icons).
  const fromConsole = () => new URL(page.url()).origin === gateway;
  const urls = [];
  page.on("request", (req) => { if (fromConsole() || new URL(req.url()).origin === gateway) urls.push(req.url()); });
  page.on("pageerror", (e) => failures.push(`uncaught page error: ${e.message}`));
  let allowed409 = 1;
  page.on("console", (m) => {
    if (m.type() !== "error" || !fromConsole()) return;
    if (m.text().includes("status of 409") && allowed409-- > 0) return;
    failures.push(`console error: ${m.text()}`);
  });

  step("sign in through the provider's own pages");
  await page.goto(`${gateway}/console#/doc/carts/cart-7`);
  await page.click("button.issuer[data-issuer='Shop ID']", { timeout: TIMEOUT });
  // oidc-provider's development login page, then its consent page.
  await page.waitForURL((u) => u.origin === issuer, { timeout: TIMEOUT });
  await page.fill("input[name=login]", "ann");
  await page.fill("input[name=password]", "any");
  await page.click("button[type=submit]");
  await page.waitForSelector("button[type=submit]", { timeout: TIMEOUT });
  if (new URL(page.url()).origin === issuer) await page.click("button[type=submit]");
  await page.waitForSelector("#nav:not([hidden])", { timeout: TIMEOUT });
  await page.waitForFunction(() => document.getElementById("who").textContent.startsWith("Signed in as"), null, { timeout: TIMEOUT });
  const who = await page.textContent("#who");
  if (who !== "Signed in as ann (shopper): read@products, write@carts") failures.push(`the console shows ${JSON.stringify(who)}`);
  if (page.url() !== `${gateway}/console#/doc/carts/cart-7`) failures.push(`after sign-in the address is ${page.url()}`);
  const stored = await page.evaluate(() => ({ session: Object.keys(sessionStorage), local: Object.keys(localStorage) }));
  if (stored.local.length !== 0) failures.push(`localStorage holds ${JSON.stringify(stored.local)}`);
  await page.screenshot({ path: path.join(artifacts, "console-signed-in.png") });

  step("edit from a stale version: 409, resolved field by field");
  await page.waitForSelector("#editor", { timeout: TIMEOUT });
  const mine = JSON.parse(await page.inputValue("#editor"));
  r = await fetch(`${docs}/cart-7`, { method: "PATCH", headers: asBackend, body: JSON.stringify({ set: { note: "theirs" } }) });
  if (r.status !== 200) failures.push(`the backend's patch answered ${r.status}`);
  await page.fill("#editor", JSON.stringify({ ...mine, items: 3 }, null, 2));
  await page.click("#save");
  await page.waitForSelector("#conflict", { timeout: TIMEOUT });
  await page.check("#conflict tr[data-path=items] input[value=mine]");
  await page.check("#conflict tr[data-path=note] input[value=theirs]");
  await page.click("#save-merge");
  await page.waitForFunction(() => document.getElementById("status").textContent.includes("saved the merge: version 3"), null, { timeout: TIMEOUT });
  const saved = await (await fetch(`${docs}/cart-7`, { headers: asBackend })).json();
  if (saved.data.items !== 3 || saved.data.note !== "theirs") failures.push(`after the merge: ${JSON.stringify(saved.data)}`);

  step("the change events name the user");
  const page2 = await (await fetch(`${gateway}/v1/events?collections=carts&after=0`, { headers: { ...asBackend, accept: "application/json" } })).json();
  const last = page2.items.at(-1);
  if (last?.version !== 3 || last.actor?.kind !== "user" || last.actor.subject !== "ann" || last.actor.issuer !== issuer) {
    failures.push(`the merge's event: ${JSON.stringify(last)}`);
  }
  // The live tail opens its stream with a ticket and shows the user.
  await page.evaluate(() => { location.hash = "#/events"; });
  await page.waitForSelector("#tail-count", { timeout: TIMEOUT });
  await new Promise((r) => setTimeout(r, 500));
  r = await fetch(`${docs}/cart-7`, { method: "PATCH", headers: asBackend, body: JSON.stringify({ set: { items: 4 } }) });
  await page.waitForFunction(() => [...document.querySelectorAll("#tail li")].some((li) => li.textContent.includes("carts/cart-7 v4")), null, { timeout: TIMEOUT })
    .catch(() => failures.push("the live tail did not show the change"));
  if (!urls.some((u) => u.includes("/v1/events?") && u.includes("ticket="))) failures.push("the live tail did not use a ticket");
  await page.screenshot({ path: path.join(artifacts, "console-user-tail.png") });

  // Nothing but the gateway and the provider; no token in any address.
  for (const u of urls) {
    const origin = new URL(u).origin;
    if (origin !== gateway && origin !== issuer) failures.push(`a request left for ${u}`);
    if (/access_token|id_token|eyJ[\w-]+\.eyJ/.test(u)) failures.push(`a token in a URL: ${u}`);
  }
}

main()
  .catch((e) => failures.push(`${e.stack || e}`))
  .finally(async () => {
    await browser?.close().catch(() => {});
    for (const child of children) child.kill();
    fs.rmSync(dir, { recursive: true, force: true });
    for (const f of failures) console.error(`console-sign-in: FAIL: ${f}`);
    if (failures.length === 0) step("PASS");
    process.exitCode = failures.length === 0 ? 0 : 1;
  });
