# fdb-etcd — build, run and test.
GO        ?= go
BIN       ?= bin
DATA_DIR  ?= default.etcd
LISTEN    ?= http://127.0.0.1:2379
PKGS      := ./...
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)

.PHONY: fdb-clients docker test-deploy build build-fdb run test test-short lint test-fdb clean conformance

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

# build-fdb needs cgo and the FoundationDB 7.3 client library (libfdb_c).
build-fdb:
	CGO_ENABLED=1 $(GO) build -tags fdb -ldflags "$(LDFLAGS)" -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

# run serves the etcd API on the embedded store in ./$(DATA_DIR).
run: build
	$(BIN)/fdb-etcd --name default --data-dir $(DATA_DIR) --listen-client-urls $(LISTEN) --log-format console

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# test is what CI runs: formatting, vet, the race-enabled unit and server
# tests, and the differential test against a real embedded etcd.
test: lint
	$(GO) test -race -count=1 $(PKGS)
	cd test/etcdcompat && $(GO) test -count=1 ./...
	cd test/snapshot && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory robustness-short
	$(MAKE) --no-print-directory test-deploy
	@if [ -n "$(FDB_MISSING)" ]; then echo "skipping FoundationDB tests: $(FDB_MISSING) (make test-fdb runs them)"; else $(MAKE) --no-print-directory test-fdb; fi

# FoundationDB tests (build tag fdb) need cgo, the FoundationDB 7.3 client
# library and headers where the official packages put them, and fdbserver and
# fdbcli on PATH; they start a throwaway fdbserver on a loopback port (or use
# the cluster named by FDB_CLUSTER_FILE). FDB_MISSING says why they can't run.
FDB_LIB    ?= /usr/lib/libfdb_c.so
FDB_HEADER ?= /usr/include/foundationdb/fdb_c.h
# FDB_PKGS are the packages whose tests run on FoundationDB under test-fdb:
# the backend's own tests, and the suites above the storage interface, which
# open their store through internal/testdb.
FDB_PKGS   := ./storage/fdb/... ./mvcc/... ./watchhub/... ./lease/... ./server/... ./cmd/...
FDB_MISSING = $(shell \
	if [ ! -e "$(FDB_LIB)" ]; then echo "$(FDB_LIB) not found"; \
	elif [ ! -e "$(FDB_HEADER)" ]; then echo "$(FDB_HEADER) not found"; \
	elif [ -z "$$FDB_CLUSTER_FILE" ] && ! command -v fdbserver >/dev/null 2>&1; then echo "fdbserver not found on PATH"; \
	elif [ -z "$$FDB_CLUSTER_FILE" ] && ! command -v fdbcli >/dev/null 2>&1; then echo "fdbcli not found on PATH"; fi)

# test-fdb runs only the FoundationDB tests and fails if FoundationDB is missing.
test-fdb:
	@if [ -n "$(FDB_MISSING)" ]; then echo "test-fdb: FoundationDB is not installed: $(FDB_MISSING)" >&2; exit 1; fi
	CGO_ENABLED=1 $(GO) vet -tags fdb $(FDB_PKGS)
	CGO_ENABLED=1 FDB_TESTS_REQUIRED=1 FDB_ETCD_TEST_BACKEND=fdb $(GO) test -tags fdb -race -count=1 $(FDB_PKGS)
	$(GO) run ./internal/fdbserver/withfdb sh -c 'cd test/etcdcompat && ETCDCOMPAT_BACKEND=fdb $(GO) test -count=1 ./...'

# fdb-clients installs the official FoundationDB client package (libfdb_c,
# its headers and fdbcli) on a Debian/Ubuntu machine, as root; the Dockerfile
# runs the same target. FDB_VERSION must stay 7.3.x (API version 730).
FDB_VERSION ?= 7.3.63
FDB_DEB_URL  = https://github.com/apple/foundationdb/releases/download/$(FDB_VERSION)/foundationdb-clients_$(FDB_VERSION)-1_$(FDB_DEB_ARCH).deb
FDB_DEB_ARCH = $(if $(filter arm64 aarch64,$(shell dpkg --print-architecture 2>/dev/null || uname -m)),aarch64,amd64)
fdb-clients:
	curl -fsSL --retry 3 -o /tmp/foundationdb-clients.deb "$(FDB_DEB_URL)"
	dpkg -i /tmp/foundationdb-clients.deb
	rm -f /tmp/foundationdb-clients.deb

# docker builds the image (needs a Docker engine): multi-stage, -tags fdb,
# non-root on debian:bookworm-slim. IMAGE names it.
IMAGE ?= fdb-etcd:$(VERSION)
docker:
	docker build --build-arg VERSION=$(VERSION) --build-arg FDB_VERSION=$(FDB_VERSION) -t $(IMAGE) .

# test-deploy checks the Dockerfile, the kustomize manifests, compose.yaml and
# the Grafana dashboard (own module under test/deploy).
test-deploy:
	cd test/deploy && $(GO) test -count=1 ./...

# robustness-short is what make test runs (a few minutes): etcd's robustness
# traffic and validators (linearizability, watch guarantees) against the
# fdb-etcd binary with no fault, kill -9 + restart, storage faults and
# stalled watchers under compaction; bad input; 10,000 abandoned watch
# streams; unread watchers (test/robustness, own module); then a few seconds
# of each fuzz target. robustness is the long version: every traffic profile
# under every fault with longer runs and more kills, more crash-consistency
# seeds, and a minute of each fuzz target.
.PHONY: robustness robustness-short fuzz-short
FUZZ_TARGETS := ./mvcc:FuzzValueChunking ./keyspace:FuzzLayoutKeys ./keyspace:FuzzHistoryKey ./server/kv:FuzzValidate ./server/watch:FuzzWatchRequests
FUZZTIME     ?= 5s
robustness-short:
	cd test/robustness && $(GO) test -count=1 -timeout 20m ./...
	$(MAKE) --no-print-directory fuzz-short

fuzz-short:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5x $$pkg || exit 1; done

robustness:
	cd test/robustness && ROBUSTNESS_LONG=1 $(GO) test -count=1 -timeout 120m -v ./...
	ROBUSTNESS_LONG=1 $(GO) test -count=1 -run 'TestCrashConsistency|TestExportPersisted' -v ./mvcc
	$(MAKE) --no-print-directory fuzz-short FUZZTIME=60s

# conformance runs k8s.io/apiserver's storage test suite and end-to-end
# kube-apiserver scenarios against fdb-etcd, with an embedded etcd as the
# reference (own module under test/apiserver-conformance, Kubernetes 1.37).
# The kube binaries are built once into ~/.cache/fdb-etcd/ and reused.
conformance:
	cd test/apiserver-conformance && ./hack/run.sh

# bench and bench-quick: fdb-etcd side by side with etcd and kine.
include bench/bench.mk

clean:
	rm -rf $(BIN)
