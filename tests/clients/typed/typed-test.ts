// A client typed per collection: openapi-typescript's types generated from
// /openapi.json?collections=orders (../generated/typed/txgate.ts) driving
// openapi-fetch. The document's `data` is the collection's schema as a
// TypeScript type: what a form binds to, checked by the compiler, and the
// gateway's 422 points at the field when a value breaks a rule the type
// cannot say (a pattern, a minimum).
//
//   tsx tests/clients/typed/typed-test.ts <base-url> <api-key>

import createClient from "openapi-fetch";
import type { components, paths } from "../generated/typed/txgate.ts";

type Order = components["schemas"]["Orders"];
type OrderDocument = components["schemas"]["OrdersDocument"];

class Deviation extends Error {}

function expect(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Deviation(what);
}

async function main(): Promise<void> {
  const [base, key] = process.argv.slice(2);
  if (!base || !key) {
    console.error("usage: typed-test.ts <base-url> <api-key>");
    process.exit(2);
  }
  const client = createClient<paths>({ baseUrl: base, headers: { authorization: `Bearer ${key}` } });

  const order: Order = { customer: "ada", total: 42, status: "open", lines: [{ sku: "TEA-1", qty: 2 }] };
  // @ts-expect-error: a total is a number
  const wrongType: Order = { customer: "ada", total: "42", status: "open" };
  // @ts-expect-error: status is one of the schema's values
  const wrongEnum: Order = { customer: "ada", total: 1, status: "lost" };
  // @ts-expect-error: the schema allows no other field
  const extra: Order = { customer: "ada", total: 1, status: "open", note: "x" };
  void wrongType, void wrongEnum, void extra;

  const created = await client.POST("/v1/collections/orders/documents", { body: { _id: "o-1", ...order } });
  expect(created.response.status === 201 && created.data !== undefined, `create: ${created.response.status}`);
  const doc: OrderDocument = created.data;
  const total: number = doc.data.total;
  const lines = doc.data.lines ?? [];
  expect(total === 42 && lines[0]?.sku === "TEA-1", `create answered ${JSON.stringify(doc)}`);

  const read = await client.GET("/v1/collections/orders/documents/{id}", { params: { path: { id: "o-1" } } });
  expect(read.data?.data.status === "open", `read: ${JSON.stringify(read.data)}`);

  // What the type cannot say, the gateway refuses, pointing at the field.
  const bad = await client.POST("/v1/collections/orders/documents", {
    body: { customer: "bo", total: -1, status: "open", lines: [{ sku: "tea", qty: 1 }] },
  });
  expect(bad.response.status === 422, `invalid create: ${bad.response.status}`);
  const problem = bad.error as { code?: string; errors?: { pointer: string; keyword: string }[] } | undefined;
  expect(problem?.code === "schema_violation", `problem: ${JSON.stringify(problem)}`);
  const pointers = (problem.errors ?? []).map((e) => `${e.pointer} ${e.keyword}`).sort();
  expect(
    JSON.stringify(pointers) === JSON.stringify(["/lines/0/sku pattern", "/total minimum"]),
    `errors: ${JSON.stringify(pointers)}`,
  );

  const replaced = await client.PUT("/v1/collections/orders/documents/{id}", {
    params: { path: { id: "o-1" } },
    body: { ...order, status: "paid" },
  });
  expect(replaced.data?.data.status === "paid", `replace: ${JSON.stringify(replaced.data)}`);
  console.log("typed-test: PASS (orders typed from its schema; 422 points at /total and /lines/0/sku)");
}

main().catch((err: unknown) => {
  console.error(`typed-test: FAIL: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
