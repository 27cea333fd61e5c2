//! Slow and malformed clients over raw sockets: a client that trickles its
//! headers or its body, or idles on a kept-alive connection, holds nothing
//! past its timeout; event streams and one key's requests have their caps;
//! oversized heads get a problem; the keyless Host guard takes only a
//! well-formed loopback authority.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use txgate::testing::keys::parse_keys;

use crate::faulty::{Act, Op, rigged_app};
use crate::support::{Backend, TestApp, expect, expect_problem};

fn addr(app: &TestApp) -> String {
    app.base.trim_start_matches("http://").to_owned()
}

/// Send `request` on a new connection and read until the server closes
/// it (or `within` passes): what came back, and whether it was closed.
async fn exchange(app: &TestApp, request: &[u8], within: Duration) -> (String, bool) {
    let mut stream = TcpStream::connect(addr(app)).await.unwrap();
    stream.write_all(request).await.unwrap();
    read_until_closed(&mut stream, within).await
}

async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> (String, bool) {
    let deadline = tokio::time::Instant::now() + within;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_times_out_with_408_frees_its_slot_and_writes_nothing() {
    let app = Arc::new(
        TestApp::spawn_with(Backend::Embedded, |c| {
            c.max_concurrency = 4;
            c.body_timeout = Duration::from_millis(1500);
        })
        .await
        .unwrap(),
    );
    let started = Instant::now();
    // As many slow uploads as there are slots: each announces 100 KB and
    // sends a byte every 200 ms.
    let slow = (0..4).map(|i| {
        let app = Arc::clone(&app);
        tokio::spawn(async move {
            let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
            let head = format!(
                "POST /v1/collections/c/documents HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
                 Content-Length: 100000\r\n\r\n{{\"_id\": \"slow{i}\", \"pad\": \""
            );
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut answer = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                tokio::select! {
                    read = stream.read(&mut buf) => match read {
                        Ok(0) | Err(_) => break,
                        Ok(n) => answer.extend_from_slice(&buf[..n]),
                    },
                    () = tokio::time::sleep(Duration::from_millis(200)) => {
                        if stream.write_all(b"x").await.is_err() { break; }
                    }
                }
            }
            String::from_utf8_lossy(&answer).into_owned()
        })
    });
    let slow: Vec<_> = slow.collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // While they hold every slot, others are refused at once...
    let res = app.post("/v1/collections/c/documents", &json!({"_id": "meanwhile"})).await;
    assert_eq!(res.status(), 429);
    // ...and once their time is up, served again.
    let mut served = None;
    while started.elapsed() < Duration::from_secs(5) {
        let res = app.post("/v1/collections/c/documents", &json!({"_id": "later"})).await;
        if res.status() == 201 {
            served = Some(started.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let served = served.expect("slots come back within the body timeout");
    assert!(served < Duration::from_millis(3000), "{served:?}");
    for task in slow {
        let answer = task.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("application/problem+json") && answer.contains("request_timeout"), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    }
    for i in 0..4 {
        expect_problem(app.get(&format!("/v1/collections/c/documents/slow{i}")).await, 404, "not_found").await;
    }
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_and_idle_connections_are_closed_while_others_are_served() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.header_timeout = Duration::from_millis(1000)).await.unwrap();
    // 300 connections that never finish their headers.
    let mut lorises = Vec::new();
    for _ in 0..300 {
        let mut stream = TcpStream::connect(addr(&app)).await.unwrap();
        stream.write_all(b"GET /v1/collections/c/documents HTTP/1.1\r\nHost: localhost\r\nX-Slow: ").await.unwrap();
        lorises.push(stream);
    }
    // An idle kept-alive connection after one request.
    let mut idle = TcpStream::connect(addr(&app)).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n").await.unwrap();
    let mut first = [0u8; 1024];
    let n = idle.read(&mut first).await.unwrap();
    assert!(String::from_utf8_lossy(&first[..n]).starts_with("HTTP/1.1 200"));
    // Others are served meanwhile.
    expect(app.post("/v1/collections/c/documents", &json!({"_id": "x"})).await, 201).await;
    let started = Instant::now();
    let closed = futures::future::join_all(lorises.iter_mut().map(|s| async move {
        // Keep trickling: one header byte every 300 ms does not reset the
        // timer.
        let deadline = Instant::now() + Duration::from_secs(4);
        let mut buf = [0u8; 256];
        while Instant::now() < deadline {
            if s.write_all(b"a").await.is_err() {
                return true;
            }
            match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => {} // a 408 or similar before the close
                Err(_) => {}
            }
        }
        false
    }))
    .await;
    let open = closed.iter().filter(|c| !**c).count();
    assert_eq!(open, 0, "{open} slowloris connections still open after {:?}", started.elapsed());
    let (_, idle_closed) = read_until_closed(&mut idle, Duration::from_secs(2)).await;
    assert!(idle_closed, "an idle kept-alive connection is closed");
    expect(app.get("/v1/collections/c/documents/x").await, 200).await;
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_are_capped_per_instance_and_slots_come_back() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.max_streams = 3).await.unwrap();
    let open =
        || async { app.request(Method::GET, "/v1/events").header("accept", "text/event-stream").send().await.unwrap() };
    let mut streams = Vec::new();
    for _ in 0..3 {
        let res = open().await;
        assert_eq!(res.status(), 200);
        streams.push(res);
    }
    let refused = open().await;
    assert!(refused.headers().get("retry-after").is_some());
    expect_problem(refused, 429, "overloaded").await;
    // Pages are not streams.
    expect(app.request(Method::GET, "/v1/events").header("accept", "application/json").send().await.unwrap(), 200)
        .await;
    drop(streams.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = open().await;
        if res.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "a closed stream's slot comes back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

/// One key opens at most its share of the instance's event streams (429
/// past it, for that key only): the other keys still open theirs, and a
/// closed stream gives its slot back to its key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_holds_at_most_its_share_of_the_event_streams() {
    const GREEDY: &str = "greedy-key-0123456789abcdef";
    const OTHER: &str = "other-key-0123456789abcdefg";
    let keys = parse_keys(&format!("{GREEDY}:read,{OTHER}:read")).unwrap();
    let app = TestApp::spawn_with(Backend::Embedded, move |c| {
        c.api_keys = keys;
        c.max_streams = 10;
        c.max_streams_per_key = 3;
    })
    .await
    .unwrap();
    let open = |key: &'static str| {
        let request = app.request(Method::GET, "/v1/events").bearer_auth(key).header("accept", "text/event-stream");
        async move { request.send().await.unwrap() }
    };
    let mut streams = Vec::new();
    for _ in 0..3 {
        let res = open(GREEDY).await;
        assert_eq!(res.status(), 200);
        streams.push(res);
    }
    let refused = open(GREEDY).await;
    assert!(refused.headers().get("retry-after").is_some());
    let problem = expect_problem(refused, 429, "overloaded").await;
    assert!(problem["detail"].as_str().unwrap().contains("TXGATE_MAX_STREAMS_PER_KEY"), "{problem}");
    // Another key is served, and pages are not streams.
    for _ in 0..3 {
        let res = open(OTHER).await;
        assert_eq!(res.status(), 200);
        streams.push(res);
    }
    let page = app.request(Method::GET, "/v1/events").bearer_auth(GREEDY).header("accept", "application/json");
    expect(page.send().await.unwrap(), 200).await;
    drop(streams.remove(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let res = open(GREEDY).await;
        if res.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "a closed stream's slot comes back to its key");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_holds_at_most_its_share_of_the_concurrency_limit() {
    const GREEDY: &str = "greedy-key-0123456789abcdef";
    const OTHER: &str = "other-key-0123456789abcdefg";
    let rule = |op: &Op| {
        if op.coll == "slow" && op.kind != "get" { Act::Delay(Duration::from_millis(600)) } else { Act::Pass }
    };
    let keys = parse_keys(&format!("{GREEDY}:write,{OTHER}:write")).unwrap();
    let app = rigged_app(
        Backend::Embedded,
        move |c| {
            c.api_keys = keys;
            c.max_concurrency = 8;
            c.max_concurrency_per_key = 2;
        },
        rule,
    )
    .await
    .unwrap();
    let app = Arc::new(app);
    let greedy = (0..6).map(|i| {
        let app = Arc::clone(&app);
        async move {
            let res = app
                .request(Method::POST, "/v1/collections/slow/documents")
                .bearer_auth(GREEDY)
                .json(&json!({"_id": format!("g{i}")}))
                .send()
                .await
                .unwrap();
            let status = res.status().as_u16();
            if status == 429 {
                let body: serde_json::Value = res.json().await.unwrap();
                assert_eq!(body["code"], "overloaded");
                assert!(body["detail"].as_str().unwrap().contains("TXGATE_MAX_CONCURRENCY_PER_KEY"), "{body}");
            }
            status
        }
    });
    let other = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let res = app
            .request(Method::POST, "/v1/collections/slow/documents")
            .bearer_auth(OTHER)
            .json(&json!({"_id": "o"}))
            .send()
            .await
            .unwrap();
        res.status().as_u16()
    };
    let (statuses, other) = tokio::join!(futures::future::join_all(greedy), other);
    assert_eq!(other, 201, "another key is served while one is at its share");
    assert_eq!(statuses.iter().filter(|s| **s == 201).count(), 2, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 429).count(), 4, "{statuses:?}");
    Arc::into_inner(app).unwrap().stop().await;
}

#[tokio::test]
async fn oversized_heads_get_a_problem() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let mut many = app.request(Method::GET, "/v1/collections/c/documents");
    for i in 0..150 {
        many = many.header(format!("x-h{i}"), "v");
    }
    let body = expect_problem(many.send().await.unwrap(), 431, "headers_too_large").await;
    assert!(body["detail"].as_str().unwrap().contains("100"), "{body}");
    let big = app.request(Method::GET, "/v1/collections/c/documents").header("x-big", "a".repeat(100 * 1024));
    expect_problem(big.send().await.unwrap(), 431, "headers_too_large").await;
    expect(app.get("/v1/collections/c/documents").await, 200).await;
    app.stop().await;
}

#[tokio::test]
async fn the_keyless_host_guard_takes_only_one_well_formed_loopback_authority() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let path = "/v1/collections/c/documents";
    let port = addr(&app).rsplit(':').next().unwrap().to_owned();
    for host in ["[::1]evil.com", "[::1]:80evil.com", "localhost:80:80", "localhost@evil.com", "::1"] {
        let res = app.request(Method::GET, path).header("host", host).send().await.unwrap();
        expect_problem(res, 403, "forbidden").await;
    }
    let within = Duration::from_secs(3);
    for (what, request) in [
        ("duplicate Host", format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nHost: evil.com\r\n\r\n")),
        ("duplicate loopback Host", format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nHost: localhost\r\n\r\n")),
        ("missing Host", format!("GET {path} HTTP/1.0\r\n\r\n")),
        ("foreign absolute form", format!("GET http://evil.com{path} HTTP/1.1\r\nHost: localhost\r\n\r\n")),
        (
            "foreign absolute form with a port",
            format!("GET http://evil.com:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
        ),
    ] {
        let (answer, _) = exchange(&app, request.as_bytes(), within).await;
        assert!(answer.starts_with("HTTP/1.1 403") || answer.starts_with("HTTP/1.0 403"), "{what}: {answer}");
    }
    let ok = format!("GET http://localhost:{port}{path} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n");
    let (answer, _) = exchange(&app, ok.as_bytes(), within).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    app.stop().await;
}
