# syntax=docker/dockerfile:1
# Build stage: compile a release binary.
FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml build.rs ./
COPY src ./src
COPY migrations ./migrations
COPY openapi ./openapi
RUN cargo build --release --locked --bin txgate && strip target/release/txgate

# Runtime stage: a small image with only the binary, running as non-root.
FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/txgate --create-home txgate
COPY --from=build /src/target/release/txgate /usr/local/bin/txgate
USER txgate
WORKDIR /var/lib/txgate
ENV TXGATE_DATA_DIR=/var/lib/txgate/data \
    TXGATE_LOG_FORMAT=json
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/txgate"]
CMD ["serve"]
