//! The `txgate` binary: parse the configuration, set up logging, dispatch.

use std::process::ExitCode;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use txgate::config::{Cli, Command, Config, JournalCommand, LogFormat, RulesCommand, StoreConfig};

/// mimalloc instead of the system allocator: a request allocates and frees
/// many small buffers (BSON, JSON, B-tree pages), where glibc's malloc
/// spent a quarter of the gateway's CPU under load.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_tracing(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).init(),
        LogFormat::Text => builder.init(),
    }
    // A panic is logged like any other event, so JSON logs stay JSON.
    std::panic::set_hook(Box::new(|info| {
        tracing::error!(panic = %info, "panic");
    }));
}

async fn shutdown_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown requested");
    token.cancel();
}

async fn serve(config: Config) -> Result<(), String> {
    // Credentials are redacted in the configuration's `Debug`.
    tracing::debug!(config = ?config, "configuration");
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    if config.keyless() {
        if !addr.ip().is_loopback() {
            return Err(format!(
                "refusing to listen on {addr}: no API keys are configured, and without them txgate only \
                 listens on loopback addresses; set TXGATE_API_KEYS to key:scope pairs, for example \
                 TXGATE_API_KEYS=\"$(openssl rand -hex 16):admin\" (scopes: read, write, admin; \
                 see docs/operating.md, \"Configuration\")"
            ));
        }
        tracing::warn!("no API keys configured: serving on loopback only, without authentication");
    } else {
        tracing::info!(
            keys = config.api_keys.len(),
            issuers = config.issuers.len(),
            anonymous = config.anonymous.is_some(),
            "authentication enabled"
        );
    }
    if std::env::var_os("TXGATE_MONGODB_CAS").is_some() {
        tracing::warn!(
            "TXGATE_MONGODB_CAS is no longer supported and is ignored: the server always applies conditional writes"
        );
    }
    let token = CancellationToken::new();
    tokio::spawn(shutdown_signal(token.clone()));
    txgate::run(config, listener, token).await.map_err(|e| e.to_string())
}

async fn migrate(config: Config) -> Result<(), String> {
    let store = txgate::open_store(&config.store).await.map_err(|e| e.to_string())?;
    let applied = txgate::migrate(store.as_ref()).await.map_err(|e| e.to_string())?;
    // Closed as the gateway closes it (checkpointed, the writer joined).
    store.close().await.map_err(|e| e.to_string())?;
    println!("{} migration(s) applied; {} known", applied.len(), txgate::MIGRATIONS.len());
    Ok(())
}

/// `txgate journal truncate --at OFFSET [--dry-run]`: with the gateway
/// stopped (the database is opened to make sure no process holds it), cut
/// the journal there, or say what the cut would keep and drop.
fn truncate_journal(config: &Config, at: u64, dry_run: bool) -> Result<String, String> {
    let StoreConfig::Embedded { data_dir, .. } = &config.store else {
        return Err("the journal belongs to the embedded store; this configuration uses MongoDB".into());
    };
    if !data_dir.is_dir() {
        return Err(format!("{} is not a directory", data_dir.display()));
    }
    let disk = txgate::journal::DirDisk::create(data_dir).map_err(|e| format!("{}: {e}", data_dir.display()))?;
    let journal = disk.path().join(txgate::journal::JOURNAL_FILE);
    let cut = txgate::journal::truncate_journal(&disk, at, dry_run)?;
    let verb = if dry_run { "would be" } else { "are" };
    let acknowledged = match cut.acknowledged {
        Some((from, to)) => {
            format!("; {} acknowledged (synced) entries {verb} lost, LSNs {from} to {to}", to - from + 1)
        }
        None if cut.whole_file => String::new(),
        None => "; none of them acknowledged (synced)".into(),
    };
    let what = if cut.whole_file {
        format!("the whole journal {verb} dropped (every write since the last checkpoint)")
    } else {
        format!(
            "{} entries before offset {at} {verb} kept; {} whole entries from there on {verb} dropped{acknowledged}",
            cut.kept, cut.dropped
        )
    };
    Ok(if dry_run {
        format!("{} (dry run, nothing written): {what}", journal.display())
    } else {
        format!("{}: cut at offset {at}; {what}", journal.display())
    })
}

/// `txgate healthcheck`: `GET /readyz` on the configured address (a
/// wildcard address is asked on its loopback), over plain HTTP/1.1 with
/// the standard library, so it needs no runtime and no other tool.
fn healthcheck(listen: &str, timeout: std::time::Duration) -> Result<(), String> {
    use std::io::{Read, Write};
    use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
    let mut addrs: Vec<SocketAddr> =
        listen.to_socket_addrs().map_err(|e| format!("cannot resolve {listen}: {e}"))?.collect();
    for addr in &mut addrs {
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
    }
    let addr = addrs.first().ok_or_else(|| format!("{listen} names no address"))?;
    let mut stream = TcpStream::connect_timeout(addr, timeout).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| e.to_string())?;
    let host = match addr {
        SocketAddr::V4(v4) => v4.to_string(),
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
    };
    let request = format!("GET /readyz HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).map_err(|e| format!("cannot ask {addr}: {e}"))?;
    // The status line is all that is read; the body is bounded anyway.
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer).map_err(|e| format!("no answer from {addr}: {e}"))?;
    let status_line = answer.split(|b| *b == b'\n').next().map(String::from_utf8_lossy).unwrap_or_default();
    let mut parts = status_line.split_whitespace();
    match (parts.next(), parts.next()) {
        (Some(version), Some("200")) if version.starts_with("HTTP/1.") => Ok(()),
        (Some(version), Some(code)) if version.starts_with("HTTP/") => {
            let body = String::from_utf8_lossy(&answer);
            let detail = body.split("\r\n\r\n").nth(1).unwrap_or("").trim();
            Err(format!("{addr}/readyz answered {code}: {detail}"))
        }
        _ => Err(format!("{addr} did not answer HTTP")),
    }
}

/// `txgate rules test FILE`: each case's line, then a summary.
fn test_rules(file: &std::path::Path) -> ExitCode {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("txgate: cannot read {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    match txgate::test_rules(&text) {
        Ok(outcome) => {
            for line in &outcome.lines {
                println!("{line}");
            }
            println!("{} cases, {} failed", outcome.lines.len(), outcome.failed);
            if outcome.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Err(err) => {
            eprintln!("txgate: {}: {err}", file.display());
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.clone().unwrap_or(Command::Serve);
    // Needs no configuration: rules are tested in memory.
    if let Command::Rules { action: RulesCommand::Test { file } } = &command {
        return test_rules(file);
    }
    let config = match cli.settings.resolve() {
        Ok(config) => config,
        Err(err) => {
            eprintln!("txgate: {err}");
            return ExitCode::from(2);
        }
    };
    if let Command::Openapi { output } = &command {
        let spec = txgate::openapi_json();
        return match output {
            Some(path) => match std::fs::write(path, spec) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("txgate: cannot write {}: {e}", path.display());
                    ExitCode::FAILURE
                }
            },
            None => {
                print!("{spec}");
                ExitCode::SUCCESS
            }
        };
    }
    if let Command::Healthcheck { timeout_ms } = &command {
        return match healthcheck(&config.listen, std::time::Duration::from_millis((*timeout_ms).max(1))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("txgate: not ready: {err}");
                ExitCode::FAILURE
            }
        };
    }
    if let Command::Journal { action: JournalCommand::Truncate { at, dry_run } } = &command {
        return match truncate_journal(&config, *at, *dry_run) {
            Ok(message) => {
                println!("{message}");
                ExitCode::SUCCESS
            }
            Err(err) => {
                eprintln!("txgate: {err}");
                ExitCode::FAILURE
            }
        };
    }
    init_tracing(config.log_format);
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    let result = runtime.block_on(async {
        match command {
            Command::Migrate => migrate(config).await,
            _ => serve(config).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = %err, "txgate stopped");
            ExitCode::FAILURE
        }
    }
}
