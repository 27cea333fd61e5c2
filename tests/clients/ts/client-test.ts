// txgate through a TypeScript client generated from openapi/openapi.json:
// openapi-typescript's types (../generated/ts/txgate.ts) driving openapi-fetch.
//
//   tsx tests/clients/ts/client-test.ts <base-url> <api-key>
//
// tests/clients/clients-test generates the types, type-checks this file
// (`tsc --noEmit -p tests/clients/ts`, strict) and runs it against a gateway.
// Every problem body is read through the generated type its `code` narrows to.
// Exits 0 when every step passes, 1 at the first deviation, 2 on bad usage.

import createClient from "openapi-fetch";
import type { components, paths } from "../generated/ts/txgate.ts";

type Schemas = components["schemas"];

class Deviation extends Error {}

function expect(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Deviation(what);
}

function expectEqual<T>(actual: T, expected: T, what: string): void {
  if (actual !== expected) {
    throw new Deviation(`${what}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`);
  }
}

/** The body of a success answer with `status`. */
function success<D>(result: { data?: D; error?: unknown; response: Response }, status: number, what: string): D {
  const { data, error, response } = result;
  if (response.status !== status || data === undefined) {
    throw new Deviation(`${what}: expected ${status}, got ${response.status} ${JSON.stringify(error ?? data)}`);
  }
  return data;
}

/** The (typed) problem body of an error answer with `status`. */
function problem<E>(result: { data?: unknown; error?: E; response: Response }, status: number, what: string): E {
  const { data, error, response } = result;
  if (response.status !== status || error === undefined) {
    throw new Deviation(`${what}: expected ${status}, got ${response.status} ${JSON.stringify(error ?? data)}`);
  }
  return error;
}

function etagOf(response: Response, what: string): string {
  const etag = response.headers.get("etag");
  expect(etag !== null, `${what}: no ETag header`);
  return etag;
}

async function main(baseUrl: string, apiKey: string): Promise<void> {
  const client = createClient<paths>({ baseUrl, headers: { Authorization: `Bearer ${apiKey}` } });
  const collection = `ts_${Date.now().toString(36)}_${Math.random().toString(36).slice(2, 8)}`;
  const docs = "/v1/collections/{collection}/documents/{id}" as const;
  const step = (text: string) => console.log(`ts: ${text}`);

  // 1. create
  step(`1. create in ${collection}`);
  const body: Schemas["NewDocument"] = { _id: "doc-1", customer: "ada", total: 42 };
  const created = await client.POST("/v1/collections/{collection}/documents", {
    params: { path: { collection } },
    body,
  });
  const doc: Schemas["DocumentOut"] = success(created, 201, "create");
  const etag1 = etagOf(created.response, "create");
  expectEqual(doc.version, 1, "create: version");
  expectEqual(etag1, '"1"', "create: ETag");
  const path = { collection, id: doc.id };

  // 2. read
  step("2. read");
  const read = success(await client.GET(docs, { params: { path } }), 200, "read");
  expectEqual(read.id, "doc-1", "read: id");
  expectEqual(read.data["total"], 42, "read: data.total");

  // 3. replace with the current ETag
  step("3. replace with If-Match");
  const replaced = await client.PUT(docs, {
    params: { path, header: { "If-Match": etag1 } },
    body: { customer: "ada", total: 45 },
  });
  expectEqual(success(replaced, 200, "replace").version, 2, "replace: version");
  expectEqual(etagOf(replaced.response, "replace"), '"2"', "replace: ETag");

  // 4. replace with the stale ETag: 409 version_conflict
  step("4. stale replace -> 409");
  const stale = problem(
    await client.PUT(docs, { params: { path, header: { "If-Match": etag1 } }, body: { total: 0 } }),
    409,
    "stale replace",
  );
  expect(stale.code === "version_conflict", `stale replace: code ${stale.code}`);
  const conflict: Schemas["VersionConflict"] = stale;
  expectEqual(conflict.expected, 1, "stale replace: expected");
  expectEqual(conflict.actual, 2, "stale replace: actual");
  // The conflict explains itself: the document now and what changed since.
  expectEqual(conflict.current?.version, 2, "stale replace: current.version");
  expectEqual(conflict.current?.data["total"], 45, "stale replace: current.data.total");
  const changes: Schemas["ChangeOut"][] = conflict.changes ?? [];
  expectEqual(changes.length, 1, "stale replace: changes");
  const change = changes[0];
  if (change === undefined) throw new Error("stale replace: no change listed");
  expectEqual(change.version, 2, "stale replace: changes[0].version");
  expectEqual(JSON.stringify(change.changed), '["total"]', "stale replace: changes[0].changed");
  expect(typeof change.key === "string", "stale replace: changes[0].key names the key");
  expectEqual(conflict.changes_truncated, false, "stale replace: changes_truncated");

  // 4b. the merge helper: the user's edit from version 1 against version 2
  step("4b. merge an edit made from version 1");
  const merged: Schemas["MergeOut"] = success(
    await client.POST("/v1/collections/{collection}/documents/{id}/merge", {
      params: { path },
      body: { base_version: 1, mine: { customer: "ada lovelace", total: 0 } },
    }),
    200,
    "merge",
  );
  expectEqual(merged.version, 2, "merge: version");
  expectEqual(JSON.stringify(merged.mine), '["customer"]', "merge: mine");
  const clashes: Schemas["MergeConflictOut"][] = merged.conflicts;
  expectEqual(clashes.length, 1, "merge: conflicts");
  const clash = clashes[0];
  if (clash === undefined) throw new Error("merge: no conflict listed");
  expectEqual(clash.path, "total", "merge: conflict path");
  expectEqual(JSON.stringify([clash.base, clash.mine, clash.theirs]), "[42,0,45]", "merge: values");
  expectEqual(merged.merged["customer"], "ada lovelace", "merge: merged.customer");

  // 5. delete, then read: 410 deleted
  step("5. delete, read -> 410");
  const deleted = await client.DELETE(docs, { params: { path, header: { "If-Match": '"2"' } } });
  expectEqual(deleted.response.status, 204, "delete: status");
  const gone = problem(await client.GET(docs, { params: { path } }), 410, "read deleted");
  expect(gone.code === "deleted", `read deleted: code ${gone.code}`);
  const tombstone: Schemas["Deleted"] = gone;
  expectEqual(tombstone.version, 3, "read deleted: version");

  // 6. a two-document transaction
  step("6. transaction of two inserts -> 200");
  const inserts: Schemas["InsertAction"][] = [
    { op: "insert", collection, id: "tx-a", data: { balance: 10 } },
    { op: "insert", collection, id: "tx-b", data: { balance: 20 } },
  ];
  const committed: Schemas["CommittedOut"] = success(
    await client.POST("/v1/transactions", { body: { actions: inserts } }),
    200,
    "transaction",
  );
  expectEqual(committed.status, "committed", "transaction: status");
  expectEqual(committed.results.length, 2, "transaction: number of results");
  committed.results.forEach((result, i) => {
    expectEqual(result.collection, collection, `transaction: results[${i}].collection`);
    expectEqual(result.id, inserts[i]?.id, `transaction: results[${i}].id`);
    expectEqual(result.version, 1, `transaction: results[${i}].version`);
  });

  // 7. a transaction whose second action expects the wrong version
  step("7. transaction with a stale if_version -> 409 naming action 1");
  const updates: Schemas["UpdateAction"][] = [
    { op: "update", collection, id: "tx-a", if_version: 1, inc: { balance: -5 } },
    { op: "update", collection, id: "tx-b", if_version: 7, inc: { balance: 5 } },
  ];
  const failed = problem(await client.POST("/v1/transactions", { body: { actions: updates } }), 409, "failing transaction");
  expect(failed.code === "version_conflict", `failing transaction: code ${failed.code}`);
  const failure: Schemas["VersionConflict"] = failed;
  expectEqual(failure.action, 1, "failing transaction: action");
  expectEqual(failure.collection, collection, "failing transaction: collection");
  expectEqual(failure.id, "tx-b", "failing transaction: id");
  expectEqual(failure.expected, 7, "failing transaction: expected");
  expectEqual(failure.actual, 1, "failing transaction: actual");
  const untouched = success(await client.GET(docs, { params: { path: { collection, id: "tx-a" } } }), 200, "read tx-a");
  expectEqual(untouched.version, 1, "failing transaction: tx-a must be unchanged, version");

  // 8. an id with reserved, escaped and non-ASCII characters, through the path parameter
  const odd = "a/b%c d-é✓?#+";
  step(`8. id ${JSON.stringify(odd)} round-trips`);
  const oddPath = { collection, id: odd };
  const oddCreated = await client.POST("/v1/collections/{collection}/documents", {
    params: { path: { collection } },
    body: { _id: odd, n: 1 },
  });
  expectEqual(success(oddCreated, 201, "odd id: create").id, odd, "odd id: create: id");
  expectEqual(success(await client.GET(docs, { params: { path: oddPath } }), 200, "odd id: read").id, odd, "odd id: read: id");
  const oddReplaced = success(
    await client.PUT(docs, { params: { path: oddPath, header: { "If-Match": '"1"' } }, body: { n: 2 } }),
    200,
    "odd id: replace",
  );
  expectEqual(oddReplaced.id, odd, "odd id: replace: id");
  expectEqual(oddReplaced.version, 2, "odd id: replace: version");
  const oddDeleted = await client.DELETE(docs, { params: { path: oddPath, header: { "If-Match": '"2"' } } });
  expectEqual(oddDeleted.response.status, 204, "odd id: delete: status");
  const oddGone = problem(await client.GET(docs, { params: { path: oddPath } }), 410, "odd id: read deleted");
  expect(oddGone.code === "deleted", `odd id: read deleted: code ${oddGone.code}`);
  expectEqual(oddGone.version, 3, "odd id: read deleted: version");

  // 9. a declared index, a query in pages and a count
  step("9. declare an index, query it a page at a time, count");
  const index = "/v1/collections/{collection}/indexes/{name}" as const;
  const indexPath = { collection, name: "by_customer" };
  const declared: Schemas["IndexOut"] = success(
    await client.PUT(index, { params: { path: indexPath }, body: { fields: ["customer", "-total"], unique: false } }),
    201,
    "declare index",
  );
  expectEqual(declared.state, "building", "declare index: state");
  for (let i = 0; ; i++) {
    const now = success(await client.GET(index, { params: { path: indexPath } }), 200, "read index");
    if (now.state === "ready") break;
    expect(now.state === "building" && i < 600, `index: state ${now.state} after ${i} polls`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  for (const [id, customer, total] of [["q-1", "bob", 5], ["q-2", "bob", 9], ["q-3", "cy", 7]] as const) {
    success(
      await client.POST("/v1/collections/{collection}/documents", { params: { path: { collection } }, body: { _id: id, customer, total } }),
      201,
      `create ${id}`,
    );
  }
  const query = "/v1/collections/{collection}/query" as const;
  const filter: Schemas["Filter"] = { customer: "bob", total: { $gte: 1 } };
  const first: Schemas["QueryPageOut"] = success(
    await client.POST(query, { params: { path: { collection } }, body: { filter, sort: ["-total"], limit: 1 } }),
    200,
    "query: first page",
  );
  expectEqual(first.items.length, 1, "query: first page: items");
  expectEqual(first.items[0]?.id, "q-2", "query: first page: id");
  expect(typeof first.next === "string", "query: a next page");
  const second = success(
    await client.POST(query, { params: { path: { collection } }, body: { filter, sort: ["-total"], limit: 1, after: first.next ?? undefined } }),
    200,
    "query: second page",
  );
  expectEqual(second.items[0]?.id, "q-1", "query: second page: id");
  const listed = success(
    await client.GET("/v1/collections/{collection}/documents", {
      params: { path: { collection }, query: { filter: JSON.stringify({ customer: "bob" }), sort: "-total", fields: "total" } },
    }),
    200,
    "query by GET",
  );
  expectEqual(listed.items.map((d) => d.id).join(","), "q-2,q-1", "query by GET: ids");
  expectEqual(JSON.stringify(listed.items[0]?.data), '{"total":9}', "query by GET: fields");
  const counted: Schemas["CountOut"] = success(
    await client.GET("/v1/collections/{collection}/count", {
      params: { path: { collection }, query: { filter: JSON.stringify({ customer: "bob" }) } },
    }),
    200,
    "count",
  );
  expectEqual(counted.count, 2, "count");
  const unserved = problem(
    await client.POST(query, { params: { path: { collection } }, body: { filter: { total: 5 } } }),
    400,
    "unserved query",
  );
  expect(unserved.code === "index_required", `unserved query: code ${unserved.code}`);
  const required: Schemas["IndexRequired"] = unserved;
  expectEqual(required.index?.fields.join(","), "total", "unserved query: the index that would serve it");

  // 10. several documents at one point
  step("10. read several documents at one point");
  const batch: Schemas["ReadsOut"] = success(
    await client.POST("/v1/reads", {
      body: { documents: [{ collection, id: "q-1" }, { collection, id: "never" }, { collection, id: "q-3" }] },
    }),
    200,
    "batch read",
  );
  expectEqual(batch.documents.map((d) => `${d.id}:${d.status}`).join(","), "q-1:200,never:404,q-3:200", "batch read: members");
  expectEqual(batch.documents[0]?.document?.data.total, 5, "batch read: a document");
  expectEqual(batch.documents[1]?.problem?.code, "not_found", "batch read: a problem");
  expect(batch.position >= counted.position, `batch read: position ${batch.position} after the count's ${counted.position}`);
}

const [baseUrl, apiKey] = process.argv.slice(2);
if (!baseUrl || !apiKey) {
  console.error("usage: tsx tests/clients/ts/client-test.ts <base-url> <api-key>");
  process.exit(2);
}
try {
  await main(baseUrl, apiKey);
  console.log("ts: PASS");
} catch (err) {
  console.error(`ts: FAIL: ${err instanceof Deviation ? err.message : err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
  process.exit(1);
}
