// End users' tokens from a real OpenID Connect provider (oidc-provider,
// pinned in package-lock.json), through the TypeScript client generated
// from openapi/openapi.json (openapi-typescript + openapi-fetch):
//
//   1. a token for txgate's audience works the API: who am I, a write, its
//      event naming the user, a stream ticket;
//   2. the provider rotates its signing key while the gateway runs: the new
//      key's tokens are taken at once, the old key's refused once the
//      gateway's cached keys expire after the provider dropped it;
//   3. the provider goes down: tokens keep working from the cached keys;
//   4. per-document rules judge the provider's tokens: the gateway sets the
//      owner, another's document is not there, a give-away is refused
//      naming the field, and every answer names its grant.
//
//   tsx users-test.ts <txgate-binary> <log-dir>
import { spawn, type ChildProcess } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import createClient from "openapi-fetch";
import type { paths } from "../generated/users/api";

const [binary = "", logs = ""] = process.argv.slice(2);
if (!binary || !logs) throw new Error("usage: tsx users-test.ts <txgate-binary> <log-dir>");
const here = path.dirname(new URL(import.meta.url).pathname);
const audience = "urn:txgate:api";
const adminKey = "admin-key-users-test-0123456789";

function expect(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Error(`users: ${what}`);
}

const step = (text: string) => console.log(`users: ${text}`);

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

function rsaKey(kid: string) {
  const jwk = generateKeyPairSync("rsa", { modulusLength: 2048 }).privateKey.export({ format: "jwk" });
  return { ...jwk, kid, alg: "RS256", use: "sig" };
}

async function until(what: string, check: () => Promise<boolean>, seconds = 15): Promise<void> {
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) {
    if (await check().catch(() => false)) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`users: ${what} within ${seconds} s`);
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "txgate-users-"));
const children: ChildProcess[] = [];
let provider: ChildProcess | undefined;

async function startProvider(port: number, keys: object[]): Promise<void> {
  const file = path.join(dir, `keys-${Date.now()}.json`);
  fs.writeFileSync(file, JSON.stringify(keys));
  const log = fs.openSync(path.join(logs, "provider.log"), "a");
  provider = spawn(process.execPath, [path.join(here, "../oidc/provider.mjs"), String(port), file, "http://127.0.0.1/console/"], {
    stdio: ["ignore", log, log],
  });
  children.push(provider);
  await until("the provider answers discovery", async () =>
    (await fetch(`http://127.0.0.1:${port}/.well-known/openid-configuration`)).ok,
  );
}

async function stopProvider(): Promise<void> {
  if (!provider) return;
  const exited = new Promise((r) => provider!.once("exit", r));
  provider.kill();
  await exited;
  provider = undefined;
}

async function token(issuer: string): Promise<string> {
  const res = await fetch(`${issuer}/token`, {
    method: "POST",
    headers: {
      authorization: `Basic ${Buffer.from("backend:backend-secret-0123456789").toString("base64")}`,
      "content-type": "application/x-www-form-urlencoded",
    },
    body: new URLSearchParams({ grant_type: "client_credentials", resource: audience }),
  });
  const body = (await res.json()) as { access_token?: string };
  expect(res.ok && typeof body.access_token === "string", `a token from the provider: ${JSON.stringify(body)}`);
  return body.access_token;
}

function kidOf(jwt: string): string {
  return JSON.parse(Buffer.from(jwt.split(".")[0] ?? "", "base64url").toString()).kid;
}

async function main(): Promise<void> {
  fs.mkdirSync(logs, { recursive: true });
  const providerPort = await freePort();
  const issuer = `http://127.0.0.1:${providerPort}`;
  const [a, b] = [rsaKey("key-a"), rsaKey("key-b")];
  await startProvider(providerPort, [a]);

  const port = await freePort();
  const base = `http://127.0.0.1:${port}`;
  const config = path.join(dir, "txgate.toml");
  fs.writeFileSync(
    config,
    [
      "[[issuers]]",
      `url = "${issuer}"`,
      `audiences = ["${audience}"]`,
      'roles_claim = "realm_access.roles"',
      "keys_cache_secs = 1",
      "keys_min_cache_secs = 1",
      "keys_refetch_secs = 1",
      "[issuers.roles]",
      'shopper = "read@products+write@carts"',
      "",
    ].join("\n"),
  );
  const log = fs.openSync(path.join(logs, "users-gateway.log"), "w");
  children.push(
    spawn(binary, ["serve"], {
      env: {
        ...process.env,
        TXGATE_CONFIG: config,
        TXGATE_LISTEN: `127.0.0.1:${port}`,
        TXGATE_DATA_DIR: path.join(dir, "data"),
        TXGATE_STORE: "embedded",
        TXGATE_API_KEYS: `${adminKey}:admin`,
      },
      stdio: ["ignore", log, log],
    }),
  );
  await until("the gateway is ready", async () => (await fetch(`${base}/readyz`)).ok);

  step("1. a token for txgate's audience works the API through the generated client");
  const first = await token(issuer);
  expect(kidOf(first) === "key-a", "signed by the first key");
  const api = (jwt: string) => createClient<paths>({ baseUrl: base, headers: { Authorization: `Bearer ${jwt}` } });
  const me = await api(first).GET("/v1/me");
  expect(me.response.status === 200 && me.data !== undefined, `who am I: ${me.response.status}`);
  expect(me.data.kind === "user" && me.data.subject === "backend" && me.data.issuer === issuer, JSON.stringify(me.data));
  expect(JSON.stringify(me.data.grants) === JSON.stringify(["read@products", "write@carts"]), JSON.stringify(me.data.grants));
  const created = await api(first).POST("/v1/collections/{collection}/documents", {
    params: { path: { collection: "carts" } },
    body: { _id: "cart-1", items: 1 },
  });
  expect(created.response.status === 201, `create: ${created.response.status} ${JSON.stringify(created.error)}`);
  const refused = await api(first).POST("/v1/collections/{collection}/documents", {
    params: { path: { collection: "products" } },
    body: { _id: "p-1" },
  });
  expect(refused.response.status === 403, `a write the role does not grant: ${refused.response.status}`);
  const page = await api(first).GET("/v1/events", {
    params: { query: { collections: "carts", after: 0 } },
    headers: { accept: "application/json" },
    parseAs: "json",
  });
  const events = (page.data as { items: { actor?: { kind: string; subject: string } }[] }).items;
  const actor = events[0]?.actor;
  expect(events.length === 1 && actor?.kind === "user" && actor.subject === "backend", JSON.stringify(events));
  const ticket = await api(first).POST("/v1/events/tickets", { body: { collections: "carts", after: "0" } });
  expect(ticket.response.status === 201 && ticket.data !== undefined, `a ticket: ${ticket.response.status}`);
  const stream = await fetch(`${base}${ticket.data.url}`, { headers: { accept: "text/event-stream" } });
  expect(stream.status === 200 && stream.body !== null, `the ticket opens the stream: ${stream.status}`);
  const reader = stream.body.getReader();
  let text = "";
  while (!text.includes("data:")) text += new TextDecoder().decode((await reader.read()).value);
  expect(text.includes('"document":"cart-1"'), text);
  await reader.cancel();
  const again = await fetch(`${base}${ticket.data.url}`);
  expect(again.status === 401, `a used ticket: ${again.status}`);

  step("2. the provider rotates its key; the gateway follows without a restart");
  await stopProvider();
  await startProvider(providerPort, [b, a]);
  const second = await token(issuer);
  expect(kidOf(second) === "key-b", `signed by the new key: ${kidOf(second)}`);
  expect((await api(second).GET("/v1/me")).response.status === 200, "the new key's token is taken at once");
  expect((await api(first).GET("/v1/me")).response.status === 200, "the old key's token still, while published");
  await stopProvider();
  await startProvider(providerPort, [b]);
  await until("the old key's token is refused once the cached keys expire", async () => {
    const res = await api(first).GET("/v1/me");
    return res.response.status === 401 && (res.error as { code?: string }).code === "token_key";
  });
  expect((await api(second).GET("/v1/me")).response.status === 200, "the new key's token still works");

  step("3. the provider goes down: tokens keep working from the cached keys");
  await stopProvider();
  for (let n = 0; n < 3; n++) {
    const res = await api(second).GET("/v1/me");
    expect(res.response.status === 200, `provider down: ${res.response.status}`);
    await new Promise((r) => setTimeout(r, 700));
  }
  step("4. per-document rules judge the provider's tokens");
  await startProvider(providerPort, [b]);
  const third = await token(issuer);
  const admin = api(adminKey);
  const rules = await admin.PUT("/v1/collections/{collection}/rules", {
    params: { path: { collection: "carts" } },
    body: {
      grants: [
        {
          name: "own",
          roles: ["shopper"],
          match: { owner: { $auth: "sub" } },
          actions: ["read", "count", "create", "update"],
          fields: { write: ["items"] },
          set: { owner: "sub" },
        },
      ],
    },
  });
  expect(rules.response.status === 200 && rules.data?.version === 1, `rules set: ${rules.response.status} ${JSON.stringify(rules.error)}`);
  const index = await admin.PUT("/v1/collections/{collection}/indexes/{name}", {
    params: { path: { collection: "carts", name: "owner" } },
    body: { fields: ["owner"] },
  });
  expect(index.response.status === 201, `index: ${index.response.status}`);
  const theirs = await admin.POST("/v1/collections/{collection}/documents", {
    params: { path: { collection: "carts" } },
    body: { _id: "cart-theirs", owner: "someone-else", items: 9 },
  });
  expect(theirs.response.status === 201, `another's cart: ${theirs.response.status}`);
  const mine = await api(third).POST("/v1/collections/{collection}/documents", {
    params: { path: { collection: "carts" } },
    body: { items: 2 },
  });
  expect(mine.response.status === 201 && mine.data?.data.owner === "backend", `created with its owner set: ${JSON.stringify(mine.data ?? mine.error)}`);
  expect(mine.response.headers.get("txgate-grant") === "carts/own@1", `named: ${mine.response.headers.get("txgate-grant")}`);
  for (const id of ["cart-theirs", "cart-1"]) {
    const hidden = await api(third).GET("/v1/collections/{collection}/documents/{id}", {
      params: { path: { collection: "carts", id } },
    });
    expect(hidden.response.status === 404, `${id} is not there for this user: ${hidden.response.status}`);
  }
  const giveAway = await api(third).PATCH("/v1/collections/{collection}/documents/{id}", {
    params: { path: { collection: "carts", id: mine.data.id } },
    body: { set: { owner: "someone-else" } },
  });
  const problem = giveAway.error as { code?: string; errors?: { pointer: string }[] } | undefined;
  expect(giveAway.response.status === 403 && problem?.code === "rule_denied" && problem.errors?.[0]?.pointer === "/owner", `a give-away: ${JSON.stringify(problem)}`);
  await until("the owner index is ready and the user's list is theirs alone", async () => {
    const list = await api(third).GET("/v1/collections/{collection}/documents", { params: { path: { collection: "carts" } } });
    const ids = list.data?.items.map((d) => d.id) ?? [];
    return list.response.status === 200 && ids.length === 1 && ids[0] === mine.data!.id;
  });
  const count = await api(third).GET("/v1/collections/{collection}/count", { params: { path: { collection: "carts" } } });
  expect(count.data?.count === 1, `the user's count: ${JSON.stringify(count.data ?? count.error)}`);
  step("PASS");
}

main()
  .catch((e) => {
    console.error(e);
    process.exitCode = 1;
  })
  .finally(() => {
    for (const child of children) child.kill();
    fs.rmSync(dir, { recursive: true, force: true });
  });
