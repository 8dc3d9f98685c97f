# Benchmark targets; include from the top-level Makefile with
#   include bench/bench.mk
# Both targets build etcd v3.6.16 and kine v0.17.5 from the Go module proxy
# on first use (cached in bench/.bin) and fdb-etcd from ./cmd/fdb-etcd.

BENCH_FLAGS ?=

.PHONY: bench bench-quick
bench: ## full comparison fdb-etcd vs etcd vs kine (20-25 min on 2 cores)
	cd bench && go run ./cmd/bench -out results.md -json results.json $(BENCH_FLAGS)

bench-quick: ## smoke test of the benchmark harness (< 2 min once binaries are cached)
	cd bench && go run ./cmd/bench -quick -out results-quick.md $(BENCH_FLAGS)
