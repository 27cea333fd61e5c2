# Developer shortcuts; scripts/test is what CI runs.
.PHONY: run fmt lint test openapi bench

run:
	cargo run --release

fmt:
	cargo fmt --all

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --features test-support -- -D warnings

test:
	scripts/test

openapi:
	cargo run --quiet -- openapi --output openapi/openapi.json

bench:
	scripts/bench
