//! The accept loop: every connection is served by hyper's HTTP/1.1
//! connection with a timer, so a client has a bounded time to send each
//! request's headers, and a kept-alive connection a bounded idle time
//! between requests (hyper starts the header timer as soon as it waits for
//! a request). Body and handler time are bounded in the middleware
//! ([`super::limits`]). At shutdown the listener closes, idle connections
//! close, and in-flight requests finish.

use std::future::Future;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

/// Largest request head hyper buffers. The limits clients are held to are
/// lower and answered with a problem ([`super::limits::head_limits`]); a
/// head past this one gets hyper's own bare 431 and the connection closes.
const MAX_HEAD_BUFFER: usize = 512 * 1024;

/// Most header fields hyper parses (see [`MAX_HEAD_BUFFER`]).
const MAX_HEADER_FIELDS: usize = 1024;

/// Serve `router` on `listener` until `shutdown` completes, then wait for
/// the open connections to finish their requests, for `drain` at most:
/// the connections still open then are closed, their requests dropped
/// unanswered (as a crash would; nothing unacknowledged is promised).
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_buf_size(MAX_HEAD_BUFFER)
        .max_headers(MAX_HEADER_FIELDS);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of file descriptors or similar: wait, then go on
                    // (a connection reset before it was accepted is not
                    // worth a pause).
                    if !matches!(
                        err.kind(),
                        std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::ConnectionReset
                    ) {
                        tracing::warn!(error = %err, "accepting a connection failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(stream), service));
        connections.spawn(async move {
            if let Err(err) = connection.await {
                // A timeout or a client that went away: routine.
                tracing::debug!(error = %err, "connection ended with an error");
            }
        });
        // Reap the connections that ended.
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            connections = connections.len(),
            drain_ms = drain.as_millis() as u64,
            "connections still busy at the shutdown timeout: closed"
        );
        connections.abort_all();
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}
