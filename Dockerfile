# txgate's container image. Builds from the official images where a
# registry serves them; where none does, scripts/docker-base-images makes
# images under the same two tags from Debian's packages and the machine's
# Rust toolchain. No `# syntax=` line: nothing is pulled for the builder.

# Build stage: the release binary, --locked, crates from the registry
# (crates.io), no debug info, stripped.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_TERM_PROGRESS_WHEN=never
# The dependencies first, in a layer of their own: a change to txgate's
# code rebuilds only txgate (the gateway and its storage engine crate).
COPY Cargo.toml Cargo.lock rustfmt.toml build.rs ./
COPY crates/store/Cargo.toml ./crates/store/
COPY migrations ./migrations
RUN mkdir -p src crates/store/src && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs crates/store/src/lib.rs \
    && cargo build --release --locked --bin txgate \
    && rm -rf src crates/store/src
COPY crates/store/src ./crates/store/src
COPY src ./src
COPY openapi ./openapi
COPY console ./console
RUN touch src/main.rs src/lib.rs crates/store/src/lib.rs \
    && cargo build --release --locked --bin txgate \
    && ./target/release/txgate --version

# Runtime stage: Debian slim, the binary, a non-root user. No CA
# certificates package: both TLS clients (webhooks, MongoDB over TLS) trust
# the Mozilla roots compiled into the binary, never the system's store; a
# private CA for MongoDB is a file named by `tlsCAFile` in the URI.
FROM debian:bookworm-slim
RUN groupadd --system --gid 10001 txgate \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/txgate --no-create-home \
         --shell /usr/sbin/nologin txgate \
    && mkdir -p /var/lib/txgate/data \
    && chown -R 10001:10001 /var/lib/txgate
COPY --from=build /src/target/release/txgate /usr/local/bin/txgate
# Numeric, so an orchestrator can tell it is not root without reading
# /etc/passwd.
USER 10001:10001
WORKDIR /var/lib/txgate
# All interfaces inside the container: API keys are then required
# (TXGATE_API_KEYS); without them the gateway refuses to start and says so.
ENV TXGATE_LISTEN=0.0.0.0:8080 \
    TXGATE_DATA_DIR=/var/lib/txgate/data \
    TXGATE_LOG_FORMAT=json
# The embedded store's files; nothing else is written, so the container's
# own file system may be read-only (`docker run --read-only`).
VOLUME ["/var/lib/txgate/data"]
EXPOSE 8080
# SIGTERM starts a graceful stop: the listener closes, event streams end,
# requests in flight finish, the store is checkpointed and closed.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 \
    CMD ["/usr/local/bin/txgate", "healthcheck", "--timeout-ms", "4000"]
ENTRYPOINT ["/usr/local/bin/txgate"]
CMD ["serve"]
