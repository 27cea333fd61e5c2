"""The container image, run as an operator runs it (docs/operating.md, "Docker"):
a volume, an API key, a webhook receiver on the host, a kill -9 and a
graceful stop; then three containers of it on one MongoDB-wire server
(TXGATE_TEST_MONGODB_URI, as scripts/test sets it), writing one document
through all three, then one killed. Python's standard library only.

    python3 scenario.py <image> [docker-command]

Exits non-zero on the first broken promise.
"""

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
import urllib.error
import urllib.request

IMAGE = sys.argv[1]
DOCKER = sys.argv[2] if len(sys.argv) > 2 else "docker"
RUN_ID = secrets.token_hex(4)
KEY = "img-" + secrets.token_hex(12)
VOLUME = f"txgate-test-{RUN_ID}"
DOCS = "/v1/collections/orders/documents"
DATA = "/var/lib/txgate/data"
made = []  # containers to remove at the end


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok: {what}", flush=True)


def docker(*args, check_rc=True, timeout=120):
    res = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check_rc and res.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {res.returncode}\n{res.stdout}{res.stderr}")
    return res


def inspect(ref, fmt):
    return docker("inspect", "--format", fmt, ref).stdout.strip()


def logs(name):
    res = docker("logs", name, check_rc=False)
    return res.stdout + res.stderr


def log_events(name):
    """The gateway's JSON log lines of `name`, parsed."""
    out = []
    for line in logs(name).splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


class Receiver:
    """A webhook receiver on the host, on every interface (the container
    reaches it through the bridge's gateway address)."""

    def __init__(self):
        self.got = []
        self.hanging = 0
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path.startswith("/hang"):
                    me.hanging += 1
                    time.sleep(60)
                    return
                me.got.append((self.path, json.loads(body or b"null")))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, n, within):
        until = time.monotonic() + within
        while len(self.got) < n and time.monotonic() < until:
            time.sleep(0.05)
        return len(self.got) >= n


class Gateway:
    """One container of the image on the test's volume; with `port`, on the
    host's network instead (to reach a server on the host's loopback),
    serving on 127.0.0.1:`port` with no volume."""

    def __init__(self, name, env, port=None):
        self.name = f"txgate-{RUN_ID}-{name}"
        if port is None:
            args = ["run", "-d", "--name", self.name, "--read-only", "-v", f"{VOLUME}:{DATA}",
                    "-p", "127.0.0.1::8080", "--add-host", "host.docker.internal:host-gateway"]
        else:
            args = ["run", "-d", "--name", self.name, "--read-only", "--network", "host",
                    "-e", f"TXGATE_LISTEN=127.0.0.1:{port}"]
        for k, v in env.items():
            args += ["-e", f"{k}={v}"]
        self.started = time.monotonic()
        docker(*args, IMAGE)
        made.append(self.name)
        if port is None:
            mapped = docker("port", self.name, "8080/tcp").stdout.splitlines()[0].strip()
            self.base = "http://" + mapped.replace("0.0.0.0", "127.0.0.1")
        else:
            self.base = f"http://127.0.0.1:{port}"

    def call(self, method, path, body=None, headers=None, key=KEY):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if key:
            req.add_header("authorization", f"Bearer {key}")
        if data is not None:
            req.add_header("content-type", "application/json")
        for k, v in (headers or {}).items():
            req.add_header(k, v)
        try:
            with urllib.request.urlopen(req, timeout=30) as res:
                raw = res.read()
                return res.status, res.headers, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, err.headers, json.loads(raw) if raw else None

    def wait_ready(self, within=30):
        until = time.monotonic() + within
        while time.monotonic() < until:
            try:
                if self.call("GET", "/readyz", key=None)[0] == 200:
                    return time.monotonic() - self.started
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if inspect(self.name, "{{.State.Running}}") != "true":
                raise AssertionError(f"{self.name} exited:\n{logs(self.name)}")
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not ready within {within} s:\n{logs(self.name)}")


def main():
    print(f"== the image {IMAGE}")
    size = int(inspect(IMAGE, "{{.Size}}"))
    print(f"  size: {size / 1e6:.1f} MB")
    check(size < 120e6, f"the image is under 120 MB ({size / 1e6:.1f} MB)")
    config = json.loads(inspect(IMAGE, "{{json .Config}}"))
    check(config["User"] == "10001:10001", "it runs as uid 10001, not root")
    check(DATA in (config.get("Volumes") or {}), f"{DATA} is a declared volume")
    check(config["Healthcheck"]["Test"][:3] == ["CMD", "/usr/local/bin/txgate", "healthcheck"],
          "its health check is `txgate healthcheck`")
    check(config.get("StopSignal") == "SIGTERM", "its stop signal is SIGTERM")
    version = docker("run", "--rm", IMAGE, "--version").stdout.strip()
    check(version.startswith("txgate "), f"`docker run IMAGE --version`: {version}")

    print("== without API keys it refuses to listen on all interfaces, and says how to set them")
    res = docker("run", "--rm", IMAGE, check_rc=False, timeout=30)
    check(res.returncode != 0, f"exit {res.returncode}")
    check("TXGATE_API_KEYS=" in res.stdout + res.stderr, "the error names TXGATE_API_KEYS with an example")

    # The host, as containers reach it: `--add-host host.docker.internal:host-gateway`.
    receiver = Receiver()
    hook_url = f"http://host.docker.internal:{receiver.port}/hooks/orders"
    env = {"TXGATE_API_KEYS": f"{KEY}:admin", "TXGATE_HOOK_ALLOW": f"host.docker.internal:{receiver.port}"}
    docker("volume", "create", VOLUME)

    print("== started with a volume, an API key and --read-only")
    a = Gateway("a", env)
    took = a.wait_ready()
    print(f"  start: ready {took:.2f} s after `docker run`")
    check(took < 10, f"ready within 10 s ({took:.2f} s)")
    check(docker("exec", a.name, "id", "-u").stdout.strip() == "10001", "the process runs as uid 10001")
    status, _, body = a.call("GET", DOCS + "/nope", key=None)
    check(status == 401, f"a request without a key: {status}")
    with urllib.request.urlopen(a.base + "/console/app.js", timeout=30) as res:
        csp = res.headers.get("content-security-policy", "")
        check(res.status == 200 and "script-src 'self'" in csp, f"the console is in the image: {res.status}, CSP {csp!r}")

    print("== documents, a transaction with a hook, a conflict")
    status, headers, body = a.call("POST", DOCS, {"_id": "o-1", "total": 5})
    check(status == 201 and body["version"] == 1, f"create: {status}")
    status, headers, body = a.call("GET", DOCS + "/o-1")
    check(status == 200 and body["data"] == {"total": 5} and headers.get("ETag") == '"1"', f"read: {status}")
    txn = {"actions": [
        {"op": "update", "collection": "orders", "id": "o-1", "if_version": 1, "set": {"total": 7}},
        {"op": "insert", "collection": "orders", "id": "o-2", "data": {"total": 3}},
    ], "hooks": [{"url": hook_url}]}
    status, _, body = a.call("POST", "/v1/transactions", txn)
    check(status == 200, f"a transaction of two actions with a hook: {status} {body}")
    check(receiver.wait(1, 20), "the hook reached the receiver on the host")
    status, _, body = a.call("PUT", DOCS + "/o-1", {"total": 1}, {"If-Match": '"1"'})
    check(status == 409 and body["code"] == "version_conflict", f"a stale write: {status} {body and body['code']}")

    print("== kill -9, then a new container on the same volume")
    acked = {"o-1": (2, {"total": 7}), "o-2": (1, {"total": 3})}
    for i in range(40):
        status, _, body = a.call("POST", DOCS, {"_id": f"k-{i}", "i": i})
        check(status == 201, f"k-{i} acknowledged") if i == 39 else None
        acked[f"k-{i}"] = (1, {"i": i})
    txn = {"actions": [{"op": "insert", "collection": "orders", "id": "k-txn", "data": {"last": True}}],
           "hooks": [{"url": hook_url}]}
    status, _, _ = a.call("POST", "/v1/transactions", txn)
    check(status == 200, "a last transaction with a hook, acknowledged")
    acked["k-txn"] = (1, {"last": True})
    docker("kill", "-s", "KILL", a.name)
    b = Gateway("b", env)
    took = b.wait_ready()
    print(f"  start after kill -9: ready in {took:.2f} s")
    lost = []
    for id_, (version, data) in acked.items():
        status, _, body = b.call("GET", f"{DOCS}/{id_}")
        if status != 200 or body["version"] != version or body["data"] != data:
            lost.append((id_, status, body))
    check(not lost, f"all {len(acked)} acknowledged documents are there ({lost[:3]})")
    check(receiver.wait(2, 30), "the last transaction's hook was delivered, before the kill or after it")
    check("k-txn" in json.dumps(receiver.got[1][1]), "and it is that transaction's")
    replays = [e for e in log_events(b.name) if e.get("message") == "replayed the embedded store's journal"]
    print(f"  journal entries replayed at that start: {sum(e.get('entries', 0) for e in replays)}")

    print("== docker stop: a graceful stop, an event stream open, a receiver that hangs")
    stream = urllib.request.Request(b.base + "/v1/events", headers={
        "accept": "text/event-stream", "authorization": f"Bearer {KEY}"})
    held = urllib.request.urlopen(stream, timeout=30)
    check(held.status == 200, "an event stream is open")
    hang = f"http://host.docker.internal:{receiver.port}/hang"
    txn = {"actions": [{"op": "insert", "collection": "orders", "id": "k-hang", "data": {}}], "hooks": [{"url": hang}]}
    status, _, _ = b.call("POST", "/v1/transactions", txn)
    check(status == 200, "a transaction whose hook's receiver hangs (the attempt times out after 15 s)")
    until = time.monotonic() + 10
    while receiver.hanging == 0 and time.monotonic() < until:
        time.sleep(0.05)
    check(receiver.hanging == 1, "its delivery attempt is in flight")
    started = time.monotonic()
    docker("stop", b.name, timeout=60)
    took = time.monotonic() - started
    print(f"  stop: {took:.2f} s")
    check(took < 10, f"docker stop finished within 10 s ({took:.2f} s)")
    check(inspect(b.name, "{{.State.ExitCode}}") == "0", "the gateway exited 0 (not killed at the grace period)")
    messages = [e.get("message") for e in log_events(b.name)]
    check("store closed" in messages and "shutdown complete" in messages,
          "its log says the store was closed and the shutdown completed")
    held.close()

    print("== the next start replays nothing")
    c = Gateway("c", env)
    c.wait_ready()
    events = log_events(c.name)
    check(any(e.get("message") == "journal: nothing to replay" for e in events),
          "its log says: journal: nothing to replay")
    check(not any(e.get("message") == "replayed the embedded store's journal" for e in events),
          "and no journal entry was replayed")
    status, _, body = c.call("GET", f"{DOCS}/k-txn")
    check(status == 200, "the documents are still there")

    print("== the health check")
    until = time.monotonic() + 45
    health = ""
    while time.monotonic() < until:
        health = inspect(c.name, "{{.State.Health.Status}}")
        if health != "starting":
            break
        time.sleep(0.5)
    check(health == "healthy", f"docker reports the container {health}")
    probe = docker("exec", c.name, "txgate", "healthcheck")
    check(probe.returncode == 0, "`txgate healthcheck` inside it exits 0")
    docker("stop", c.name, timeout=60)
    probe = docker("run", "--rm", "--entrypoint", "/usr/local/bin/txgate", IMAGE, "healthcheck",
                   "--timeout-ms", "500", check_rc=False)
    check(probe.returncode == 1 and "not ready" in probe.stderr,
          f"with nothing serving it exits 1: {probe.stderr.strip()}")
    several_on_mongodb()
    print("docker image: PASS")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def several_on_mongodb():
    """Three containers on one MongoDB: 60 increments of one document sent
    through all three at once, each with an If-Match, retried on 409, land
    exactly once each; then one is killed and the others serve on."""
    print("== three containers on one MongoDB")
    uri = os.environ.get("TXGATE_TEST_MONGODB_URI")
    check(bool(uri), "TXGATE_TEST_MONGODB_URI names a MongoDB-wire server (scripts/test starts one)")
    env = {"TXGATE_MONGODB_URI": uri, "TXGATE_MONGODB_DATABASE": f"docker_{RUN_ID}",
           "TXGATE_API_KEYS": f"{KEY}:admin"}
    nodes = [Gateway(f"m{i}", env, port=free_port()) for i in range(3)]
    for node in nodes:
        node.wait_ready()
    started = [e for e in log_events(nodes[0].name) if e.get("message") == "mongodb server (buildInfo)"]
    check(bool(started), f"the gateway logs the server it is on: {started[0].get('server') if started else None}")
    status, _, _ = nodes[0].call("POST", "/v1/collections/counters/documents", {"_id": "c", "n": 0})
    check(status == 201, "a counter is created through the first container")

    def bump(i):
        node = nodes[i % 3]
        for _ in range(200):
            status, _, doc = node.call("GET", "/v1/collections/counters/documents/c")
            if status != 200:
                time.sleep(0.05)
                continue
            status, _, _ = node.call("PATCH", "/v1/collections/counters/documents/c", {"inc": {"n": 1}},
                                     headers={"if-match": f'"{doc["version"]}"'})
            if status == 200:
                return True
            if status not in (409, 503):
                raise AssertionError(f"increment {i}: {status}")
        raise AssertionError(f"increment {i} never landed")

    with concurrent.futures.ThreadPoolExecutor(max_workers=12) as pool:
        done = list(pool.map(bump, range(60)))
    check(all(done), "60 compare-and-set increments through three containers were each answered once")
    docker("kill", nodes[2].name)
    status, _, doc = nodes[1].call("GET", "/v1/collections/counters/documents/c")
    check(status == 200 and doc["data"]["n"] == 60 and doc["version"] == 61,
          f"none lost across containers: n={doc['data']['n']}, version {doc['version']}")
    for node in nodes[:2]:
        docker("stop", node.name, timeout=60)


if __name__ == "__main__":
    try:
        main()
    finally:
        for name in made:
            docker("rm", "-f", name, check_rc=False)
        docker("volume", "rm", "-f", VOLUME, check_rc=False)
