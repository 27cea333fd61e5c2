"""txgate through the Python client openapi-python-client generates from openapi/openapi.json.

    python tests/clients/python/client_test.py <base-url> <api-key>

tests/clients/clients-test generates the client first (`openapi-python-client
generate --meta none` into tests/clients/generated/openapi-python-client/txgate_client)
and runs this with the venv of scripts/install-test-tools. Every answer is read
through the generated model the client parsed it into (`Response.parsed`).
Exits 0 when every step passes, 1 at the first deviation, 2 on bad usage.
"""

import json
import secrets
import sys
import time
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "generated" / "openapi-python-client"))
try:
    from txgate_client import AuthenticatedClient
    from txgate_client.api.documents import (
        v1_documents_create,
        v1_documents_delete,
        v1_documents_get,
        v1_documents_merge,
        v1_documents_replace,
    )
    from txgate_client.api.documents import v1_documents_count, v1_documents_list, v1_documents_query, v1_reads_create
    from txgate_client.api.indexes import v1_indexes_get, v1_indexes_put
    from txgate_client.api.transactions import v1_transactions_create
    from txgate_client.models import (
        ChangeOut,
        CommittedOut,
        CountOut,
        Deleted,
        DocumentOut,
        Fields,
        IncFields,
        IndexIn,
        IndexOut,
        InsertAction,
        InsertActionOp,
        MergeIn,
        MergeOut,
        NewDocument,
        QueryIn,
        QueryPageOut,
        ReadsIn,
        ReadsOut,
        TransactionIn,
        UpdateAction,
        UpdateActionOp,
        VersionConflict,
    )
except ImportError as err:
    sys.exit(f"python-client: FAIL: the generated client is missing ({err}); run tests/clients/clients-test")

from checks import Deviation, expect, expect_equal




def answer(response, status, model, what):
    """`response.parsed`, which must be a `model` answered with `status`."""
    if response.status_code != status or not isinstance(response.parsed, model):
        raise Deviation(
            f"{what}: expected {status} as {model.__name__}, got {int(response.status_code)} "
            f"as {type(response.parsed).__name__}: {response.content.decode(errors='replace')}"
        )
    return response.parsed


def step(text):
    print(f"python-client: {text}", flush=True)


def run(client):
    collection = f"py_{int(time.time() * 1000):x}_{secrets.token_hex(3)}"

    # 1. create
    step(f"1. create in {collection}")
    created = v1_documents_create.sync_detailed(
        collection, client=client, body=NewDocument.from_dict({"_id": "doc-1", "customer": "ada", "total": 42})
    )
    doc = answer(created, 201, DocumentOut, "create")
    etag1 = created.headers.get("etag")
    expect_equal(doc.version, 1, "create: version")
    expect_equal(etag1, '"1"', "create: ETag")

    # 2. read
    step("2. read")
    read = answer(v1_documents_get.sync_detailed(collection, doc.id, client=client), 200, DocumentOut, "read")
    expect_equal(read.id, "doc-1", "read: id")
    expect_equal(read.data["total"], 42, "read: data.total")

    # 3. replace with the current ETag
    step("3. replace with If-Match")
    replaced = v1_documents_replace.sync_detailed(
        collection, doc.id, client=client, body=Fields.from_dict({"customer": "ada", "total": 45}), if_match=etag1
    )
    expect_equal(answer(replaced, 200, DocumentOut, "replace").version, 2, "replace: version")
    expect_equal(replaced.headers.get("etag"), '"2"', "replace: ETag")

    # 4. replace with the stale ETag: 409 version_conflict
    step("4. stale replace -> 409")
    stale = v1_documents_replace.sync_detailed(
        collection, doc.id, client=client, body=Fields.from_dict({"total": 0}), if_match=etag1
    )
    conflict = answer(stale, 409, VersionConflict, "stale replace")
    expect_equal(conflict.expected, 1, "stale replace: expected")
    expect_equal(conflict.actual, 2, "stale replace: actual")
    # The conflict explains itself: the document now and what changed since.
    expect(isinstance(conflict.current, DocumentOut), f"stale replace: current is {conflict.current!r}")
    expect_equal(conflict.current.version, 2, "stale replace: current.version")
    expect_equal(conflict.current.data["total"], 45, "stale replace: current.data.total")
    expect_equal(len(conflict.changes), 1, "stale replace: changes")
    change = conflict.changes[0]
    expect(isinstance(change, ChangeOut), f"stale replace: a change is {type(change).__name__}")
    expect_equal((change.version, change.changed), (2, ["total"]), "stale replace: the change")
    expect(isinstance(change.key, str), "stale replace: the change names its key")
    expect_equal(conflict.changes_truncated, False, "stale replace: changes_truncated")

    # 4b. the merge helper: the user's edit from version 1 against version 2
    step("4b. merge an edit made from version 1")
    mine = Fields.from_dict({"customer": "ada lovelace", "total": 0})
    merged = answer(
        v1_documents_merge.sync_detailed(collection, doc.id, client=client, body=MergeIn(base_version=1, mine=mine)),
        200,
        MergeOut,
        "merge",
    )
    expect_equal((merged.version, merged.mine), (2, ["customer"]), "merge: version, mine")
    expect_equal(len(merged.conflicts), 1, "merge: conflicts")
    clash = merged.conflicts[0]
    expect_equal((clash.path, clash.base, clash.mine, clash.theirs), ("total", 42, 0, 45), "merge: the conflict")
    expect_equal(merged.merged["customer"], "ada lovelace", "merge: merged.customer")

    # 5. delete, then read: 410 deleted
    step("5. delete, read -> 410")
    deleted = v1_documents_delete.sync_detailed(collection, doc.id, client=client, if_match='"2"')
    expect_equal(deleted.status_code, 204, "delete: status")
    gone = answer(v1_documents_get.sync_detailed(collection, doc.id, client=client), 410, Deleted, "read deleted")
    expect_equal(gone.version, 3, "read deleted: version")

    # 6. a two-document transaction
    step("6. transaction of two inserts -> 200")
    inserts = [
        InsertAction(op=InsertActionOp.INSERT, collection=collection, id=doc_id, data=Fields.from_dict({"balance": n}))
        for doc_id, n in [("tx-a", 10), ("tx-b", 20)]
    ]
    committed = answer(
        v1_transactions_create.sync_detailed(client=client, body=TransactionIn(actions=inserts)),
        200,
        CommittedOut,
        "transaction",
    )
    expect_equal(str(committed.status), "committed", "transaction: status")
    expect_equal(len(committed.results), 2, "transaction: number of results")
    for i, (result, action) in enumerate(zip(committed.results, inserts)):
        expect_equal(result.collection, collection, f"transaction: results[{i}].collection")
        expect_equal(result.id, action.id, f"transaction: results[{i}].id")
        expect_equal(result.version, 1, f"transaction: results[{i}].version")

    # 7. a transaction whose second action expects the wrong version
    step("7. transaction with a stale if_version -> 409 naming action 1")
    updates = [
        UpdateAction(
            op=UpdateActionOp.UPDATE, collection=collection, id="tx-a", if_version=1, inc=IncFields.from_dict({"balance": -5})
        ),
        UpdateAction(
            op=UpdateActionOp.UPDATE, collection=collection, id="tx-b", if_version=7, inc=IncFields.from_dict({"balance": 5})
        ),
    ]
    failure = answer(
        v1_transactions_create.sync_detailed(client=client, body=TransactionIn(actions=updates)),
        409,
        VersionConflict,
        "failing transaction",
    )
    expect_equal(failure.action, 1, "failing transaction: action")
    expect_equal(failure.collection, collection, "failing transaction: collection")
    expect_equal(failure.id, "tx-b", "failing transaction: id")
    expect_equal(failure.expected, 7, "failing transaction: expected")
    expect_equal(failure.actual, 1, "failing transaction: actual")
    untouched = answer(v1_documents_get.sync_detailed(collection, "tx-a", client=client), 200, DocumentOut, "read tx-a")
    expect_equal(untouched.version, 1, "failing transaction: tx-a must be unchanged, version")

    # 8. an id with reserved, escaped and non-ASCII characters, through the path parameter
    odd = "a/b%c d-é✓?#+"
    step(f"8. id {odd!r} round-trips")
    odd_created = v1_documents_create.sync_detailed(
        collection, client=client, body=NewDocument.from_dict({"_id": odd, "n": 1})
    )
    expect_equal(answer(odd_created, 201, DocumentOut, "odd id: create").id, odd, "odd id: create: id")
    odd_read = answer(v1_documents_get.sync_detailed(collection, odd, client=client), 200, DocumentOut, "odd id: read")
    expect_equal(odd_read.id, odd, "odd id: read: id")
    odd_replaced = answer(
        v1_documents_replace.sync_detailed(collection, odd, client=client, body=Fields.from_dict({"n": 2}), if_match='"1"'),
        200,
        DocumentOut,
        "odd id: replace",
    )
    expect_equal(odd_replaced.id, odd, "odd id: replace: id")
    expect_equal(odd_replaced.version, 2, "odd id: replace: version")
    odd_deleted = v1_documents_delete.sync_detailed(collection, odd, client=client, if_match='"2"')
    expect_equal(odd_deleted.status_code, 204, "odd id: delete: status")
    odd_gone = answer(v1_documents_get.sync_detailed(collection, odd, client=client), 410, Deleted, "odd id: read deleted")
    expect_equal(odd_gone.version, 3, "odd id: read deleted: version")

    # 9. a declared index, a query in pages and a count
    step("9. declare an index, query it a page at a time, count")
    declared = answer(
        v1_indexes_put.sync_detailed(
            collection, "by_customer", client=client, body=IndexIn.from_dict({"fields": ["customer", "-total"]})
        ),
        201,
        IndexOut,
        "declare index",
    )
    expect_equal(str(declared.state.value), "building", "declare index: state")
    for polls in range(600):
        now = answer(v1_indexes_get.sync_detailed(collection, "by_customer", client=client), 200, IndexOut, "read index")
        if now.state.value == "ready":
            break
        expect(now.state.value == "building", f"index: state {now.state.value}")
        time.sleep(0.1)
    else:
        raise Deviation("index: never ready")
    for doc_id, customer, total in [("q-1", "bob", 5), ("q-2", "bob", 9), ("q-3", "cy", 7)]:
        answer(
            v1_documents_create.sync_detailed(
                collection, client=client, body=NewDocument.from_dict({"_id": doc_id, "customer": customer, "total": total})
            ),
            201,
            DocumentOut,
            f"create {doc_id}",
        )
    query = {"filter": {"customer": "bob", "total": {"$gte": 1}}, "sort": ["-total"], "limit": 1}
    first = answer(
        v1_documents_query.sync_detailed(collection, client=client, body=QueryIn.from_dict(query)),
        200,
        QueryPageOut,
        "query: first page",
    )
    expect_equal([d.id for d in first.items], ["q-2"], "query: first page: ids")
    expect(isinstance(first.next_, str), f"query: a next page, got {first.next_!r}")
    second = answer(
        v1_documents_query.sync_detailed(collection, client=client, body=QueryIn.from_dict({**query, "after": first.next_})),
        200,
        QueryPageOut,
        "query: second page",
    )
    expect_equal([d.id for d in second.items], ["q-1"], "query: second page: ids")
    listed = answer(
        v1_documents_list.sync_detailed(
            collection, client=client, filter_=json.dumps({"customer": "bob"}), sort="-total", fields="total"
        ),
        200,
        QueryPageOut,
        "query by GET",
    )
    expect_equal([d.id for d in listed.items], ["q-2", "q-1"], "query by GET: ids")
    expect_equal(listed.items[0].data.to_dict(), {"total": 9}, "query by GET: fields")
    counted = answer(
        v1_documents_count.sync_detailed(collection, client=client, filter_=json.dumps({"customer": "bob"})),
        200,
        CountOut,
        "count",
    )
    expect_equal(counted.count, 2, "count")
    unserved = v1_documents_query.sync_detailed(collection, client=client, body=QueryIn.from_dict({"filter": {"total": 5}}))
    expect_equal(int(unserved.status_code), 400, "unserved query: status")
    body = json.loads(unserved.content)
    expect_equal(body["code"], "index_required", "unserved query: code")
    expect_equal(body["index"]["fields"], ["total"], "unserved query: the index that would serve it")

    # 10. several documents at one point
    step("10. read several documents at one point")
    members = [{"collection": collection, "id": i} for i in ("q-1", "never", "q-3")]
    read = answer(
        v1_reads_create.sync_detailed(client=client, body=ReadsIn.from_dict({"documents": members})),
        200,
        ReadsOut,
        "batch read",
    )
    expect_equal([(d.id, d.status) for d in read.documents], [("q-1", 200), ("never", 404), ("q-3", 200)], "batch read: members")
    expect_equal(read.documents[0].document.data.to_dict(), {"customer": "bob", "total": 5}, "batch read: a document")
    expect_equal(read.documents[1].problem.to_dict()["code"], "not_found", "batch read: a problem")
    expect(read.position >= counted.position, f"batch read: position {read.position} after the count's {counted.position}")


def main(argv):
    if len(argv) != 3:
        print("usage: python tests/clients/python/client_test.py <base-url> <api-key>", file=sys.stderr)
        return 2
    client = AuthenticatedClient(base_url=argv[1], token=argv[2], raise_on_unexpected_status=True)
    try:
        with client:
            run(client)
    except Deviation as err:
        print(f"python-client: FAIL: {err}", file=sys.stderr)
        return 1
    print("python-client: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
