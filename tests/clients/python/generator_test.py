"""txgate through the Python client openapi-generator-cli's `python` target generates from openapi/openapi.json.

    python tests/clients/python/generator_test.py <base-url> <api-key>

tests/clients/clients-test generates the client first (package txgate_generated in
tests/clients/generated/openapi-generator) and runs this with the venv of
scripts/install-test-tools. Success bodies are read from ApiResponse.data, problem
bodies from ApiException.data: the model the client deserialized them into (for
a status whose schema is a oneOf, the generated wrapper's actual_instance).
Exits 0 when every step passes, 1 at the first deviation, 2 on bad usage.
"""

import json
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated" / "openapi-generator"))
try:
    from txgate_generated import ApiClient, Configuration, DocumentsApi, IndexesApi, TransactionsApi
    from txgate_generated.exceptions import ApiException
    from txgate_generated.models import (
        ActionIn,
        CommittedOut,
        CountOut,
        IndexIn,
        IndexOut,
        QueryIn,
        QueryPageOut,
        ReadsIn,
        ReadsOut,
        Deleted,
        DocumentOut,
        InsertAction,
        MergeIn,
        MergeOut,
        NewDocument,
        TransactionIn,
        UpdateAction,
        V1DocumentsReplace409Response,
        V1TransactionsCreate409Response,
        VersionConflict,
    )
except ImportError as err:
    sys.exit(f"openapi-generator: FAIL: the generated client is missing ({err}); run tests/clients/clients-test")

from checks import Deviation, expect, expect_equal




def success(call, status, model, what):
    """The ApiResponse of `call()`, which must answer `status` with a body deserialized as `model` (None: no body)."""
    try:
        response = call()
    except ApiException as err:
        raise Deviation(f"{what}: expected {status}, got {err.status}: {err.body}") from None
    if response.status_code != status or (model is not None and not isinstance(response.data, model)):
        raise Deviation(
            f"{what}: expected {status} as {model and model.__name__}, got {response.status_code} "
            f"as {type(response.data).__name__}: {response.raw_data.decode(errors='replace')}"
        )
    return response


def failure(call, status, model, what):
    """The problem body of `call()`, which must fail with `status` and a body deserialized as `model`."""
    try:
        response = call()
    except ApiException as err:
        if err.status != status or not isinstance(err.data, model):
            raise Deviation(
                f"{what}: expected {status} as {model.__name__}, got {err.status} as {type(err.data).__name__}: {err.body}"
            ) from None
        return err.data
    raise Deviation(f"{what}: expected {status}, got {response.status_code}")


def member(one_of, model, what):
    """The member of a generated oneOf wrapper, which must be a `model`."""
    instance = one_of.actual_instance
    expect(isinstance(instance, model), f"{what}: expected {model.__name__}, got {type(instance).__name__}: {instance!r}")
    return instance


def step(text):
    print(f"openapi-generator: {text}", flush=True)


def run(docs, transactions, indexes):
    collection = f"gen_{int(time.time() * 1000):x}_{secrets.token_hex(3)}"

    # 1. create
    step(f"1. create in {collection}")
    created = success(
        lambda: docs.v1_documents_create_with_http_info(
            collection, NewDocument.from_dict({"_id": "doc-1", "customer": "ada", "total": 42})
        ),
        201,
        DocumentOut,
        "create",
    )
    doc_id = created.data.id
    etag1 = created.headers.get("etag")
    expect_equal(created.data.version, 1, "create: version")
    expect_equal(etag1, '"1"', "create: ETag")

    # 2. read
    step("2. read")
    read = success(lambda: docs.v1_documents_get_with_http_info(collection, doc_id), 200, DocumentOut, "read").data
    expect_equal(read.id, "doc-1", "read: id")
    expect_equal(read.data["total"], 42, "read: data.total")

    # 3. replace with the current ETag
    step("3. replace with If-Match")
    replaced = success(
        lambda: docs.v1_documents_replace_with_http_info(
            collection, doc_id, {"customer": "ada", "total": 45}, if_match=etag1
        ),
        200,
        DocumentOut,
        "replace",
    )
    expect_equal(replaced.data.version, 2, "replace: version")
    expect_equal(replaced.headers.get("etag"), '"2"', "replace: ETag")

    # 4. replace with the stale ETag: 409 version_conflict
    step("4. stale replace -> 409")
    stale = failure(
        lambda: docs.v1_documents_replace(collection, doc_id, {"total": 0}, if_match=etag1),
        409,
        V1DocumentsReplace409Response,
        "stale replace",
    )
    conflict = member(stale, VersionConflict, "stale replace")
    expect_equal(conflict.expected, 1, "stale replace: expected")
    expect_equal(conflict.actual, 2, "stale replace: actual")
    # The conflict explains itself: the document now and what changed since.
    current = getattr(conflict.current, "actual_instance", conflict.current)
    expect(isinstance(current, DocumentOut), f"stale replace: current is {current!r}")
    expect_equal((current.version, current.data["total"]), (2, 45), "stale replace: current")
    expect_equal(len(conflict.changes), 1, "stale replace: changes")
    expect_equal((conflict.changes[0].version, conflict.changes[0].changed), (2, ["total"]), "stale replace: the change")
    expect_equal(conflict.changes_truncated, False, "stale replace: changes_truncated")

    # 4b. the merge helper: the user's edit from version 1 against version 2
    step("4b. merge an edit made from version 1")
    merged = success(
        lambda: docs.v1_documents_merge_with_http_info(
            collection, doc_id, MergeIn(base_version=1, mine={"customer": "ada lovelace", "total": 0})
        ),
        200,
        MergeOut,
        "merge",
    )
    expect_equal((merged.data.version, merged.data.mine), (2, ["customer"]), "merge: version, mine")
    expect_equal(len(merged.data.conflicts), 1, "merge: conflicts")
    clash = merged.data.conflicts[0]
    expect_equal(clash.path, "total", "merge: the conflict's path")
    values = [getattr(v, "actual_instance", v) for v in (clash.base, clash.mine, clash.theirs)]
    expect_equal(values, [42, 0, 45], "merge: the conflict's values")

    # 5. delete, then read: 410 deleted
    step("5. delete, read -> 410")
    success(lambda: docs.v1_documents_delete_with_http_info(collection, doc_id, if_match='"2"'), 204, None, "delete")
    gone = failure(lambda: docs.v1_documents_get(collection, doc_id), 410, Deleted, "read deleted")
    expect_equal(gone.version, 3, "read deleted: version")

    # 6. a two-document transaction
    step("6. transaction of two inserts -> 200")
    inserts = [
        InsertAction(op="insert", collection=collection, id="tx-a", data={"balance": 10}),
        InsertAction(op="insert", collection=collection, id="tx-b", data={"balance": 20}),
    ]
    committed = success(
        lambda: transactions.v1_transactions_create_with_http_info(
            TransactionIn(actions=[ActionIn(action) for action in inserts])
        ),
        200,
        CommittedOut,
        "transaction",
    ).data
    expect_equal(committed.status.value, "committed", "transaction: status")
    expect_equal(len(committed.results), 2, "transaction: number of results")
    for i, (result, action) in enumerate(zip(committed.results, inserts)):
        expect_equal(result.collection, collection, f"transaction: results[{i}].collection")
        expect_equal(result.id, action.id, f"transaction: results[{i}].id")
        expect_equal(result.version, 1, f"transaction: results[{i}].version")

    # 7. a transaction whose second action expects the wrong version
    step("7. transaction with a stale if_version -> 409 naming action 1")
    updates = [
        UpdateAction(op="update", collection=collection, id="tx-a", if_version=1, inc={"balance": -5}),
        UpdateAction(op="update", collection=collection, id="tx-b", if_version=7, inc={"balance": 5}),
    ]
    failed = failure(
        lambda: transactions.v1_transactions_create(TransactionIn(actions=[ActionIn(action) for action in updates])),
        409,
        V1TransactionsCreate409Response,
        "failing transaction",
    )
    failed_action = member(failed, VersionConflict, "failing transaction")
    expect_equal(failed_action.action, 1, "failing transaction: action")
    expect_equal(failed_action.collection, collection, "failing transaction: collection")
    expect_equal(failed_action.id, "tx-b", "failing transaction: id")
    expect_equal(failed_action.expected, 7, "failing transaction: expected")
    expect_equal(failed_action.actual, 1, "failing transaction: actual")
    untouched = success(lambda: docs.v1_documents_get_with_http_info(collection, "tx-a"), 200, DocumentOut, "read tx-a")
    expect_equal(untouched.data.version, 1, "failing transaction: tx-a must be unchanged, version")

    # 8. an id with reserved, escaped and non-ASCII characters, through the path parameter
    odd = "a/b%c d-é✓?#+"
    step(f"8. id {odd!r} round-trips")
    odd_created = success(
        lambda: docs.v1_documents_create_with_http_info(collection, NewDocument.from_dict({"_id": odd, "n": 1})),
        201,
        DocumentOut,
        "odd id: create",
    )
    expect_equal(odd_created.data.id, odd, "odd id: create: id")
    odd_read = success(lambda: docs.v1_documents_get_with_http_info(collection, odd), 200, DocumentOut, "odd id: read")
    expect_equal(odd_read.data.id, odd, "odd id: read: id")
    odd_replaced = success(
        lambda: docs.v1_documents_replace_with_http_info(collection, odd, {"n": 2}, if_match='"1"'),
        200,
        DocumentOut,
        "odd id: replace",
    ).data
    expect_equal(odd_replaced.id, odd, "odd id: replace: id")
    expect_equal(odd_replaced.version, 2, "odd id: replace: version")
    success(lambda: docs.v1_documents_delete_with_http_info(collection, odd, if_match='"2"'), 204, None, "odd id: delete")
    odd_gone = failure(lambda: docs.v1_documents_get(collection, odd), 410, Deleted, "odd id: read deleted")
    expect_equal(odd_gone.version, 3, "odd id: read deleted: version")

    # 9. a declared index, a query in pages and a count
    step("9. declare an index, query it a page at a time, count")
    declared = success(
        lambda: indexes.v1_indexes_put_with_http_info(
            collection, "by_customer", IndexIn.from_dict({"fields": ["customer", "-total"], "unique": False})
        ),
        201,
        IndexOut,
        "declare index",
    ).data
    expect_equal(declared.state.value, "building", "declare index: state")
    for _ in range(600):
        now = success(lambda: indexes.v1_indexes_get_with_http_info(collection, "by_customer"), 200, IndexOut, "read index")
        if now.data.state.value == "ready":
            break
        expect(now.data.state.value == "building", f"index: state {now.data.state.value}")
        time.sleep(0.1)
    else:
        raise Deviation("index: never ready")
    for doc_id, customer, total in [("q-1", "bob", 5), ("q-2", "bob", 9), ("q-3", "cy", 7)]:
        success(
            lambda: docs.v1_documents_create_with_http_info(
                collection, NewDocument.from_dict({"_id": doc_id, "customer": customer, "total": total})
            ),
            201,
            DocumentOut,
            f"create {doc_id}",
        )
    query = {"filter": {"customer": "bob", "total": {"$gte": 1}}, "sort": ["-total"], "limit": 1}
    first = success(
        lambda: docs.v1_documents_query_with_http_info(collection, QueryIn.from_dict(query)), 200, QueryPageOut, "query: first page"
    ).data
    expect_equal([d.id for d in first.items], ["q-2"], "query: first page: ids")
    expect(isinstance(first.next, str), f"query: a next page, got {first.next!r}")
    second = success(
        lambda: docs.v1_documents_query_with_http_info(collection, QueryIn.from_dict({**query, "after": first.next})),
        200,
        QueryPageOut,
        "query: second page",
    ).data
    expect_equal([d.id for d in second.items], ["q-1"], "query: second page: ids")
    listed = success(
        lambda: docs.v1_documents_list_with_http_info(
            collection, filter=json.dumps({"customer": "bob"}), sort="-total", fields="total"
        ),
        200,
        QueryPageOut,
        "query by GET",
    ).data
    expect_equal([d.id for d in listed.items], ["q-2", "q-1"], "query by GET: ids")
    expect_equal(listed.items[0].data, {"total": 9}, "query by GET: fields")
    counted = success(
        lambda: docs.v1_documents_count_with_http_info(collection, filter=json.dumps({"customer": "bob"})),
        200,
        CountOut,
        "count",
    ).data
    expect_equal(counted.count, 2, "count")

    # 10. several documents at one point
    step("10. read several documents at one point")
    members = [{"collection": collection, "id": i} for i in ("q-1", "never", "q-3")]
    read = success(
        lambda: docs.v1_reads_create_with_http_info(ReadsIn.from_dict({"documents": members})), 200, ReadsOut, "batch read"
    ).data
    expect_equal([(d.id, d.status) for d in read.documents], [("q-1", 200), ("never", 404), ("q-3", 200)], "batch read: members")
    expect_equal(read.documents[0].document.data, {"customer": "bob", "total": 5}, "batch read: a document")
    expect_equal(read.documents[1].problem["code"], "not_found", "batch read: a problem")
    expect(read.position >= counted.position, f"batch read: position {read.position} after the count's {counted.position}")


def main(argv):
    if len(argv) != 3:
        print("usage: python tests/clients/python/generator_test.py <base-url> <api-key>", file=sys.stderr)
        return 2
    try:
        with ApiClient(Configuration(host=argv[1], access_token=argv[2])) as api_client:
            run(DocumentsApi(api_client), TransactionsApi(api_client), IndexesApi(api_client))
    except Deviation as err:
        print(f"openapi-generator: FAIL: {err}", file=sys.stderr)
        return 1
    print("openapi-generator: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
