# Benchmark targets; include from the top-level Makefile with
#   include bench/bench.mk
# Both targets build etcd v3.6.16 and kine v0.17.5 from the Go module proxy
# on first use (cached in bench/.bin) and fdb-etcd from ./cmd/fdb-etcd.
#
# The FoundationDB columns (fdb-etcd-fdb, fdb-etcd-fdb3, and the plain
# FoundationDB client's fdb-raw, fdb-raw-batched) run on the cluster
# FDB_CLUSTER_FILE names or, when it is unset, on a throwaway fdbserver that
# withfdb starts for the run (the memory engine given 4GiB: the put rows
# fill its default 1GiB). FDB_MISSING (top-level Makefile) says why they
# cannot run; the harness then runs without them, even if FDB_CLUSTER_FILE
# is set, since their builds need cgo and libfdb_c (the top-level Makefile
# exports the cgo flags that find it).

GO          ?= go
BENCH_FLAGS ?=
BENCH_RUN    = $(if $(FDB_MISSING),env -u FDB_CLUSTER_FILE,$(if $(FDB_CLUSTER_FILE),,$(GO) run ./internal/fdbserver/withfdb -storage-memory 4GiB)) $(GO) -C bench run ./cmd/bench
BENCH_NOTE   = @if [ -n "$(FDB_MISSING)" ]; then echo "bench: skipping the FoundationDB columns (fdb-etcd-fdb, fdb-etcd-fdb3, fdb-raw, fdb-raw-batched): $(FDB_MISSING)"; fi

.PHONY: bench bench-quick
bench: ## full comparison fdb-etcd vs etcd vs kine (20-25 min on 2 cores; more with FoundationDB)
	$(BENCH_NOTE)
	$(BENCH_RUN) -out results.md -json results.json $(BENCH_FLAGS)

bench-quick: ## smoke test of the benchmark harness (a few minutes once binaries are cached)
	$(BENCH_NOTE)
	$(BENCH_RUN) -quick -out results-quick.md $(BENCH_FLAGS)
