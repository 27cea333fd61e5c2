# Developer shortcuts; scripts/test is what CI runs.
.PHONY: run fmt lint test openapi bench

run:
	cargo run --release

fmt:
	cargo fmt

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

test:
	scripts/test

openapi:
	cargo run --quiet -- openapi --output openapi/openapi.json

bench:
	scripts/bench
