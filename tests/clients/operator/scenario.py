"""The operator's scenario, as docs/operating.md tells it: two txgate instances on
one MongoDB with API keys limited to collections, scraped by a Prometheus
server (Debian's, as scripts/install-test-tools installs it) and read with
Prometheus's own text-format parser (prometheus_client), through a webhook
receiver that hangs and an overload.

    python scenario.py <txgate-binary> <artifacts-dir>

Needs TXGATE_TEST_MONGODB_URI. Exits non-zero on the first broken promise.
"""

import collections
import concurrent.futures
import http.server
import json
import os
import secrets
import socket
import subprocess
import sys
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

BIN, ARTIFACTS = sys.argv[1], sys.argv[2]
URI = os.environ["TXGATE_TEST_MONGODB_URI"]
OPS = "ops-" + secrets.token_hex(12)
ORDERS = "orders-" + secrets.token_hex(12)
DOCS = "/v1/collections/{collection}/documents"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok: {what}")


def stop(proc):
    """SIGTERM, and SIGKILL after 30 s (a failed run may leave requests that
    never finish), so that the first error is the one reported."""
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_ready(client, path, what, log):
    """Poll `path` until it answers 200, for up to 30 s."""
    for _ in range(300):
        try:
            if client.get(path).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{what} did not become ready (see {log.name})")


class Receiver:
    """A webhook receiver answering 200 after `delay` seconds."""

    def __init__(self, delay):
        self.got = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(delay)
                outer.got.append(time.monotonic())
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"


class Instance:
    def __init__(self, name, database, **env):
        self.name, self.port = name, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        full = dict(
            os.environ,
            TXGATE_LISTEN=f"127.0.0.1:{self.port}",
            TXGATE_MONGODB_URI=URI,
            TXGATE_MONGODB_DATABASE=database,
            TXGATE_API_KEYS=f"{OPS}:admin,{ORDERS}:read@orders+write@orders",
            TXGATE_HOOK_ALLOW="127.0.0.1:*",
            TXGATE_HOOK_CONCURRENCY="4",
            TXGATE_HOOK_PER_DESTINATION="2",
            RUST_LOG="txgate=info",
            **env,
        )
        self.log = open(os.path.join(ARTIFACTS, f"operator-{name}.log"), "w")
        self.proc = subprocess.Popen([BIN, "serve"], env=full, stdout=self.log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=self.base, timeout=30)
        wait_ready(self.http, "/readyz", f"instance {name}", self.log)

    def call(self, method, path, key, body=None, headers=None):
        h = {"authorization": f"Bearer {key}", **(headers or {})}
        return self.http.request(method, path, json=body, headers=h)

    def scrape(self):
        res = self.call("GET", "/metrics", OPS)
        assert res.status_code == 200, res.text
        with open(os.path.join(ARTIFACTS, f"operator-{self.name}.metrics"), "w") as f:
            f.write(res.text)
        return list(text_string_to_metric_families(res.text))

    def stop(self):
        stop(self.proc)
        self.log.close()


def samples(families, name):
    return [s for f in families for s in f.samples if s.name == name]


def total(scrapes, name, **labels):
    """The sum over instances of series `name` whose labels include `labels`."""
    return sum(
        s.value
        for fams in scrapes
        for s in samples(fams, name)
        if all(s.labels.get(k) == v for k, v in labels.items())
    )


class Prometheus:
    """A Prometheus server scraping `targets` every second with `key`."""

    def __init__(self, targets, key):
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="txgate-prometheus-")
        config = os.path.join(self.dir, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
                "scrape_configs:\n"
                "  - job_name: txgate\n"
                f"    authorization: {{credentials: {key}}}\n"
                f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
            )
        self.port = free_port()
        self.log = open(os.path.join(ARTIFACTS, "operator-prometheus.log"), "w")
        self.proc = subprocess.Popen(
            ["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={self.dir}/data",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        wait_ready(self.http, "/-/ready", "Prometheus", self.log)

    def query(self, promql):
        """The instant vector of `promql`: {labels as a sorted tuple: value}."""
        res = self.http.get("/api/v1/query", params={"query": promql}).json()
        assert res["status"] == "success", res
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in res["data"]["result"]}

    def until(self, promql, want, within=20):
        """Wait until `promql` is the single value `want`; return it."""
        deadline = time.monotonic() + within
        while True:
            got = self.query(promql)
            value = sum(got.values()) if got else None
            if value == want or time.monotonic() > deadline:
                return value
            time.sleep(0.5)

    def stop(self):
        import shutil

        stop(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def slow_upload(port, path, key, body):
    """A request whose body arrives slowly: it holds its slot meanwhile."""
    sock = socket.create_connection(("127.0.0.1", port))
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + body[:1])
    return sock, body[1:]


def finish_upload(sock, rest):
    sock.sendall(rest)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    sock.close()
    return int(answer.split(b" ", 2)[1])


def main():
    database = "txgate_operator_" + secrets.token_hex(4)
    print(f"== two instances on {URI}, database {database}")
    running = []
    try:
        # The global limit is what the overload below fills (one key holds
        # all of it: its share is the whole limit here).
        a = Instance("a", database, TXGATE_MAX_CONCURRENCY="4", TXGATE_MAX_CONCURRENCY_PER_KEY="4")
        running.append(a)
        b = Instance("b", database)
        running.append(b)
        prom = Prometheus([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], OPS)
        running.append(prom)
        scenario(a, b, prom)
    finally:
        for process in reversed(running):
            process.stop()
    print("== operator scenario passed")


def scenario(a, b, prom):
    sent = collections.Counter()  # (instance, method, route, status) -> count

    def doc(inst, key, coll, body):
        res = inst.call("POST", f"/v1/collections/{coll}/documents", key, body)
        sent[(inst.name, "POST", DOCS, str(res.status_code))] += 1
        return res

    print("== keys")
    check(a.http.get("/metrics").status_code == 401, "/metrics without a key: 401")
    check(a.call("GET", "/metrics", ORDERS).status_code == 403, "/metrics with a key limited to orders: 403")
    for i in range(20):
        inst = a if i % 2 == 0 else b
        assert doc(inst, ORDERS, "orders", {"_id": f"o-{i}", "n": i}).status_code == 201
    check(True, "the orders key wrote 20 orders through both instances")
    for inst in (a, b):
        res = doc(inst, ORDERS, "payments", {"_id": f"p-{inst.name}"})
        check(res.status_code == 403 and res.json()["code"] == "forbidden", f"{inst.name}: payments refused (403)")
        check(a.call("GET", f"/v1/collections/payments/documents/p-{inst.name}", OPS).status_code == 404,
              f"{inst.name}: nothing written")
    mixed = {"actions": [
        {"op": "insert", "collection": "orders", "id": "o-mixed", "data": {}},
        {"op": "insert", "collection": "payments", "id": "p-mixed", "data": {}},
    ]}
    res = a.call("POST", "/v1/transactions", ORDERS, mixed)
    check(res.status_code == 403 and res.json().get("action") == 1, "a transaction with a payments member: 403")
    check(b.call("GET", "/v1/collections/orders/documents/o-mixed", OPS).status_code == 404,
          "its orders member was not applied")
    seen = b.call("GET", "/v1/collections/orders/documents/o-3", ORDERS)
    check(seen.status_code == 200, "a document written through one instance is read through the other")

    print("== a hanging webhook receiver")
    slow, fast = Receiver(delay=4.0), Receiver(delay=0.0)

    def txn(inst, i, url):
        body = {"actions": [{"op": "insert", "collection": "orders", "id": f"h-{i}", "data": {}}],
                "hooks": [{"url": url}]}
        res = inst.call("POST", "/v1/transactions", OPS, body)
        assert res.status_code == 200, res.text

    # More than an instance's 4 delivery slots: without per-destination
    # slots they would all be held by the hanging receiver.
    for i in range(10):
        txn(a if i % 2 == 0 else b, i, slow.url)
    time.sleep(0.5)  # the hanging ones are in flight
    started = time.monotonic()
    for i in range(10, 13):
        txn(a if i % 2 == 0 else b, i, fast.url)
    while len(fast.got) < 3 and time.monotonic() - started < 10:
        time.sleep(0.02)
    waited = time.monotonic() - started
    check(len(fast.got) == 3 and waited < 2.5 and len(slow.got) == 0,
          f"the other receiver got its 3 deliveries in {waited:.2f} s while the first hung (4 s each)")
    until = time.monotonic() + 40
    while len(slow.got) < 10 and time.monotonic() < until:
        time.sleep(0.1)
    check(len(slow.got) == 10, "the hanging receiver got all 10 in the end")

    print("== an overload (instance a: TXGATE_MAX_CONCURRENCY=4)")
    held = [slow_upload(a.port, "/v1/collections/orders/documents", ORDERS,
                        json.dumps({"_id": f"u-{i}"}).encode()) for i in range(4)]
    time.sleep(0.3)
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        refused = list(pool.map(lambda i: doc(a, ORDERS, "orders", {"_id": f"r-{i}"}), range(10)))
    check(all(r.status_code == 429 and r.headers.get("retry-after") == "1" for r in refused),
          "10 requests beyond the limit: 429 with Retry-After: 1")
    check(a.http.get("/readyz").status_code == 200, "readiness answers during the overload")
    check(a.call("GET", "/metrics", OPS).status_code == 200, "a scrape answers during the overload")
    statuses = [finish_upload(sock, rest) for sock, rest in held]
    sent[("a", "POST", DOCS, "201")] += statuses.count(201)
    check(statuses == [201] * 4, "the 4 admitted requests completed (201)")
    check(all(b.call("GET", f"/v1/collections/orders/documents/r-{i}", OPS).status_code == 404 for i in range(10)),
          "the refused requests wrote nothing")
    check(doc(a, ORDERS, "orders", {"_id": "after"}).status_code == 201, "served again after the overload")

    print("== /metrics, parsed by prometheus_client")
    until = time.monotonic() + 20
    while True:
        scrapes = [a.scrape(), b.scrape()]
        if total(scrapes, "txgate_deliveries_total", outcome="delivered") >= 13 or time.monotonic() > until:
            break
        time.sleep(0.2)
    for (inst, method, route, status), n in sorted(sent.items()):
        fams = scrapes[0] if inst == "a" else scrapes[1]
        got = total([fams], "txgate_http_requests_total", method=method, route=route, status=status)
        check(got == n, f"{inst}: txgate_http_requests_total{{{method} {route} {status}}} = {got:g}, {n} sent")
    check(total(scrapes, "txgate_transactions_total", outcome="committed") == 13, "13 transactions committed")
    check(total(scrapes, "txgate_deliveries_total", outcome="delivered") == 13, "13 deliveries delivered")
    check(total(scrapes, "txgate_delivery_lag_seconds_count") == 13, "13 delivery lags observed")
    check(total(scrapes, "txgate_deliveries_parked_total") >= 1, "deliveries parked for a full destination")
    check(total(scrapes, "txgate_http_requests_total", status="429") == 10, "10 refusals counted")
    check(total(scrapes, "txgate_http_requests_in_flight") >= 1, "in-flight requests (the scrape itself)")
    names = {f.name for fams in scrapes for f in fams}
    check(all(n.startswith("txgate_") for n in names), f"{len(names)} families, every name txgate_*")
    values = {v for fams in scrapes for f in fams for s in f.samples for v in s.labels.values()}
    leaked = [v for v in values if "orders" in v or "payments" in v or v.startswith(("o-", "h-", "r-", "u-"))]
    check(not leaked, f"no label value from a path or an id ({len(values)} distinct values)")
    check("/v1/collections/{collection}/documents" in values, "routes are labelled by template")

    print("== the same, as the Prometheus server scraped it (every second, throughout)")
    ups = prom.query('up{job="txgate"}')
    check(len(ups) == 2 and all(v == 1 for v in ups.values()), "both instances are up")
    low = prom.query('min_over_time(up{job="txgate"}[5m])')
    check(len(low) == 2 and all(v == 1 for v in low.values()),
          "no scrape failed, during the hanging receiver and the overload included")
    got = prom.until('sum(txgate_http_requests_total{status="429"})', 10)
    check(got == 10, f"sum of 429s over both instances: {got}")
    got = prom.until('sum(txgate_deliveries_total{outcome="delivered"})', 13)
    check(got == 13, f"deliveries delivered over both instances: {got}")
    created = sum(n for (_, m, _, st), n in sent.items() if m == "POST" and st == "201")
    got = prom.until(f'sum(txgate_http_requests_total{{route="{DOCS}",method="POST",status="201"}})', created)
    check(got == created, f"documents created over both instances: {got}, {created} sent")
    got = prom.until('sum(txgate_transactions_total{outcome="committed"})', 13)
    check(got == 13, f"transactions committed: {got}")


if __name__ == "__main__":
    main()
