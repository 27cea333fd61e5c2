"""Schemathesis hooks for txgate's contract run.

Two rules of the API cannot be written in JSON Schema, so the description
states them in prose and these hooks keep generated requests from breaking
them (the server refuses such requests with 422, as documented):

- a transaction names each document once (`duplicate_member`);
- in one patch (`set`/`unset`/`inc`), no field path appears twice or inside
  another (`a` with `a.b`).

`GET /v1/events` streams Server-Sent Events unless the client asks for
JSON pages (`Accept: application/json`); the tester does, as a client that
cannot hold a connection would. A cursor (`after`, `Last-Event-ID`) is a
position the log has had, which a client learns from the log: a generated
one may lie beyond the log's head (rightly refused, 400
`cursor_beyond_head`), so the tester's cursors start at the beginning, 0.

And an Idempotency-Key names one logical request: a client sends a fresh key
for each new request and the same key only to retry that same request
(draft-ietf-httpapi-idempotency-key-header). Generated requests are new
requests, so each gets a fresh key; a key reused with another body is
rightly refused (422 `idempotency_key_reused`).

A query's cursor (`after`) is one a page of the same query gave; the
tester's queries start at their first page.

A collection's schemas refuse writes that break them (422
`schema_violation`), which no description of the write can foresee: they
depend on what was declared. The tester declares its schemas on
collections of their own (`zs…`), which its document writes do not use.

A query parameter whose generated value is an empty list is not sent at
all (the HTTP client writes nothing for it): a case that holds one, such as
an undeclared parameter added as a negative case, is not the request it is
judged as, so such cases are left out.
"""

import re
import uuid

import schemathesis

_SCHEMAS_PATH = re.compile(r"/v1/collections/([^/]+)/schemas(?=/|$)")


def _schemas_apart(name):
    """The collection the tester declares schemas on instead of `name` (a
    name that is not a collection's is left as it is: its case is about
    that)."""
    if not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_-]{0,63}", str(name)):
        return name
    return ("zs" + str(name))[:64]


def _paths_conflict(patch):
    if not isinstance(patch, dict):
        return False
    paths = []
    for part in ("set", "inc"):
        if isinstance(patch.get(part), dict):
            paths.extend(patch[part].keys())
    if isinstance(patch.get("unset"), list):
        paths.extend(p for p in patch["unset"] if isinstance(p, str))
    split = sorted(tuple(p.split(".")) for p in paths)
    return any(b[: len(a)] == a for a, b in zip(split, split[1:]))


def _names_a_document_twice(actions):
    seen = set()
    for action in actions if isinstance(actions, list) else []:
        if not isinstance(action, dict) or not all(isinstance(action.get(k), str) for k in ("collection", "id")):
            continue
        key = (action.get("collection"), action["id"])
        if key in seen:
            return True
        seen.add(key)
    return False


@schemathesis.hook
def filter_body(context, body):
    operation = context.operation
    if operation is None:
        return True
    if operation.method.upper() == "POST" and operation.path == "/v1/transactions" and isinstance(body, dict):
        actions = body.get("actions")
        if _names_a_document_twice(actions):
            return False
        if isinstance(actions, list) and any(_paths_conflict(a) for a in actions if isinstance(a, dict)):
            return False
    if operation.method.upper() == "PATCH" and _paths_conflict(body):
        return False
    return True


@schemathesis.hook
def filter_query(context, query):
    return not (isinstance(query, dict) and any(value == [] for value in query.values()))


@schemathesis.hook
def before_call(context, case, kwargs):
    # `/v1/events` answers with a stream that stays open unless JSON pages
    # are asked for; a request/response tester asks for pages.
    if case.path == "/v1/events":
        case.headers = {**(case.headers or {}), "Accept": "application/json"}
        if isinstance(kwargs.get("headers"), dict):
            kwargs["headers"]["Accept"] = "application/json"
        for headers in (case.headers, kwargs.get("headers")):
            if isinstance(headers, dict) and "Last-Event-ID" in headers:
                headers["Last-Event-ID"] = "0"
        for query in (case.query, kwargs.get("params")):
            if isinstance(query, dict) and "after" in query:
                query["after"] = "0"
    # A query's cursor is one a page of the same query gave: a made-up one
    # is rightly refused (422), so the tester's queries start at the first
    # page.
    if case.path in ("/v1/collections/{collection}/documents", "/v1/collections/{collection}/query"):
        for query in (case.query, kwargs.get("params")):
            if isinstance(query, dict):
                query.pop("after", None)
        for body in (case.body, kwargs.get("json")):
            if isinstance(body, dict):
                body.pop("after", None)
    # Schemas go on collections of their own (see above).
    if case.path.startswith("/v1/collections/{collection}/schemas"):
        params = case.path_parameters or {}
        if isinstance(params.get("collection"), str):
            params["collection"] = _schemas_apart(params["collection"])
        if isinstance(kwargs.get("url"), str):
            kwargs["url"] = _SCHEMAS_PATH.sub(lambda m: f"/v1/collections/{_schemas_apart(m.group(1))}/schemas", kwargs["url"])
    headers = case.headers or {}
    if "Idempotency-Key" in headers:
        key = f"st-{uuid.uuid4()}"
        headers["Idempotency-Key"] = key
        if isinstance(kwargs.get("headers"), dict):
            kwargs["headers"]["Idempotency-Key"] = key
