# fdb-etcd — build, run and test.
GO        ?= go
BIN       ?= bin
DATA_DIR  ?= default.etcd
LISTEN    ?= http://127.0.0.1:2379
PKGS      := ./...
# TESTHOOKS is the build tag of the test machinery kept out of the product
# binary: the persisted-request journal and its export, and the storage
# fault flags (cmd/fdb-etcd/testhooks.go). The robustness suite builds
# fdb-etcd with it; TESTHOOKS_RUN are the tests that need it.
TESTHOOKS     := fdbetcd_testhooks
TESTHOOKS_RUN := Export|Journal|ParseFaults|FaultsReporter
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X main.version=$(VERSION)

.PHONY: fdb-clients docker test-deploy build build-fdb run run-fdb test test-short lint test-fdb clean conformance

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

# build-fdb needs cgo and the FoundationDB 7.3 client library (libfdb_c).
build-fdb:
	CGO_ENABLED=1 $(GO) build -tags fdb -ldflags "$(LDFLAGS)" -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

# run serves the etcd API on the embedded store in ./$(DATA_DIR).
run: build
	$(BIN)/fdb-etcd --name default --data-dir $(DATA_DIR) --listen-client-urls $(LISTEN) --log-format console

# run-fdb is run on FoundationDB: a throwaway single-process fdbserver on a
# loopback port (its data is deleted on exit) and fdb-etcd on it, serving the
# etcd API on $(LISTEN). Ctrl-C stops both.
run-fdb: build-fdb
	@if [ -n "$(FDB_MISSING)" ]; then echo "run-fdb: FoundationDB is not installed: $(FDB_MISSING)" >&2; exit 1; fi
	$(GO) run ./internal/fdbserver/withfdb sh -c 'exec $(BIN)/fdb-etcd --name default --backend fdb --fdb-cluster-file "$$FDB_CLUSTER_FILE" --listen-client-urls $(LISTEN) --log-format console'

lint:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -tags $(TESTHOOKS) $(PKGS)

# test is what CI runs: formatting, vet, the race-enabled unit and server
# tests, and the differential test against a real embedded etcd (also with
# fdb-etcd serving it to a tenant beside a busy second tenant). mvcc's crash
# tests run once more without the race detector: under it they check only a
# sample of their crash images (reopening an image is 40 times slower).
test: lint
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	$(GO) test -race -count=1 -timeout 30m -tags $(TESTHOOKS) -run '$(TESTHOOKS_RUN)' ./mvcc/ ./cmd/fdb-etcd/
	$(GO) test -count=1 -run '^TestCrash' ./mvcc/
	$(MAKE) --no-print-directory -j2 --output-sync=target etcdcompat etcdcompat-tenant
	cd test/snapshot && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory robustness-short
	$(MAKE) --no-print-directory test-deploy
	cd bench && $(GO) test -count=1 ./...
	@if [ -n "$(FDB_MISSING)" ]; then echo "skipping FoundationDB tests: $(FDB_MISSING) (make test-fdb runs them)"; else $(MAKE) --no-print-directory test-fdb; fi

# FoundationDB (build tag fdb) needs cgo, the 7.3 client library and headers,
# and fdbserver and fdbcli for the throwaway clusters the tests start (or a
# cluster named by FDB_CLUSTER_FILE). It is found, in this order:
#   1. FDB_HOME, a directory with lib/libfdb_c.so, include/foundationdb/ and
#      bin/fdbserver, bin/fdbcli;
#   2. the official packages' locations (/usr/lib/libfdb_c.so,
#      /usr/include/foundationdb/, fdbserver and fdbcli on PATH or in /usr/sbin);
#   3. ../shared/fdb beside the checkout, in FDB_HOME's layout.
# With a directory (1 or 3), cgo gets its include and library paths and an
# rpath, and its bin/ goes first on PATH, so nothing is installed system-wide.
# FDB_MISSING says why FoundationDB cannot be used, empty when it can.
FDB_SYSTEM_LIB    := /usr/lib/libfdb_c.so
FDB_SYSTEM_HEADER := /usr/include/foundationdb/fdb_c.h
FDB_SIBLING       := $(abspath $(CURDIR)/../shared/fdb)
ifeq ($(FDB_HOME),)
  ifeq ($(wildcard $(FDB_SYSTEM_LIB))$(wildcard $(FDB_SYSTEM_HEADER)),$(FDB_SYSTEM_LIB)$(FDB_SYSTEM_HEADER))
    FDB_FOUND := system
    export PATH := $(PATH):/usr/sbin
  else ifneq ($(wildcard $(FDB_SIBLING)/lib/libfdb_c.so),)
    FDB_HOME := $(FDB_SIBLING)
  endif
endif
ifneq ($(FDB_HOME),)
  FDB_FOUND := $(FDB_HOME)
  export FDB_HOME
  export CGO_CFLAGS  := $(strip $(CGO_CFLAGS) -I$(FDB_HOME)/include)
  export CGO_LDFLAGS := $(strip $(CGO_LDFLAGS) -L$(FDB_HOME)/lib -Wl,-rpath,$(FDB_HOME)/lib)
  export PATH := $(FDB_HOME)/bin:$(PATH)
  FDB_LIB    := $(FDB_HOME)/lib/libfdb_c.so
  FDB_HEADER := $(FDB_HOME)/include/foundationdb/fdb_c.h
else
  FDB_LIB    := $(FDB_SYSTEM_LIB)
  FDB_HEADER := $(FDB_SYSTEM_HEADER)
endif
# FDB_PKGS are the packages whose tests run on FoundationDB under test-fdb:
# the backend's own tests, and the suites above the storage interface, which
# open their store through internal/testdb.
FDB_PKGS   := ./internal/fdbserver/... ./internal/groupcommit/... ./storage/fdb/... ./revision/... ./mvcc/... ./snapshot/... ./watchhub/... ./owner/... ./lease/... ./server/... ./tenant/... ./migrate/... ./cmd/...
FDB_MISSING = $(shell PATH='$(PATH)'; \
	if [ -z "$(FDB_FOUND)" ]; then echo "no FDB_HOME, no $(FDB_SYSTEM_LIB) with headers, no $(FDB_SIBLING)"; \
	elif [ ! -e "$(FDB_LIB)" ]; then echo "$(FDB_LIB) not found"; \
	elif [ ! -e "$(FDB_HEADER)" ]; then echo "$(FDB_HEADER) not found"; \
	elif [ -z "$$FDB_CLUSTER_FILE" ] && ! command -v fdbserver >/dev/null 2>&1; then echo "fdbserver not found"; \
	elif [ -z "$$FDB_CLUSTER_FILE" ] && ! command -v fdbcli >/dev/null 2>&1; then echo "fdbcli not found"; fi)

.PHONY: fdb-env
# fdb-env prints where FoundationDB was found (eval "$$(make -s fdb-env)" sets
# up a shell for go test -tags fdb by hand).
fdb-env:
	@if [ -n "$(FDB_MISSING)" ]; then echo "# FoundationDB not usable: $(FDB_MISSING)" >&2; exit 1; fi
	@echo "export PATH='$(PATH)'"
	@if [ -n "$(FDB_HOME)" ]; then echo "export FDB_HOME='$(FDB_HOME)' CGO_CFLAGS='$(CGO_CFLAGS)' CGO_LDFLAGS='$(CGO_LDFLAGS)'"; fi

# test-fdb runs only the FoundationDB tests and fails if FoundationDB is missing.
test-fdb:
	@if [ -n "$(FDB_MISSING)" ]; then echo "test-fdb: FoundationDB is not installed: $(FDB_MISSING)" >&2; exit 1; fi
	CGO_ENABLED=1 $(GO) vet -tags fdb $(FDB_PKGS)
	CGO_ENABLED=1 FDB_TESTS_REQUIRED=1 FDB_ETCD_TEST_BACKEND=fdb $(GO) test -tags fdb -race -count=1 $(FDB_PKGS)
	CGO_ENABLED=1 FDB_TESTS_REQUIRED=1 FDB_ETCD_TEST_BACKEND=fdb $(GO) test -tags fdb,$(TESTHOOKS) -race -count=1 -run '$(TESTHOOKS_RUN)' ./mvcc/
	$(MAKE) --no-print-directory etcdcompat-fdb etcdcompat-fdb-tenant
	$(GO) run ./internal/fdbserver/withfdb sh -c 'cd test/snapshot && SNAPSHOT_BACKEND=fdb $(GO) test -count=1 ./...'

# The differential test against a real etcd, on each store in a plain
# keyspace and as a tenant beside a busy second tenant. Its tests run four
# at a time (each starts its own pair of servers and mostly waits on their
# commits): the embedded plain run alone 141 → 51 s, on FoundationDB
# 176 → 120 s. make test runs the embedded two side by side (-j2; 97 s
# here, against 159 s side by side one test at a time); test-fdb runs the
# FoundationDB two one after the other: each already keeps 1.6 of the two
# cores busy.
etcdcompat:
	cd test/etcdcompat && $(GO) test -count=1 -parallel 4 ./...
etcdcompat-tenant:
	cd test/etcdcompat && ETCDCOMPAT_TENANT=1 $(GO) test -count=1 -parallel 4 ./...
etcdcompat-fdb:
	$(GO) run ./internal/fdbserver/withfdb sh -c 'cd test/etcdcompat && ETCDCOMPAT_BACKEND=fdb $(GO) test -count=1 -parallel 4 ./...'
etcdcompat-fdb-tenant:
	$(GO) run ./internal/fdbserver/withfdb sh -c 'cd test/etcdcompat && ETCDCOMPAT_BACKEND=fdb ETCDCOMPAT_TENANT=1 $(GO) test -count=1 -parallel 4 ./...'
.PHONY: etcdcompat etcdcompat-tenant etcdcompat-fdb etcdcompat-fdb-tenant

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
# With FoundationDB found (see above), both also run fdb-etcd on a 5-process
# FoundationDB cluster (TestRobustnessFDB): the short run forced recoveries
# with replicas killed, the long one every FoundationDB fault under both
# traffic profiles; a FoundationDB scenario that cannot run then fails.
.PHONY: robustness robustness-short fuzz-short
ROBUSTNESS_ENV = $(if $(FDB_MISSING),,CGO_ENABLED=1 FDB_TESTS_REQUIRED=1)
FUZZ_TARGETS := ./mvcc:FuzzValueChunking ./keyspace:FuzzLayoutKeys ./keyspace:FuzzHistoryKey ./server/kv:FuzzValidate ./server/watch:FuzzWatchRequests
FUZZTIME     ?= 5s
robustness-short:
	cd test/robustness && $(ROBUSTNESS_ENV) $(GO) test -count=1 -timeout 30m ./...
	$(MAKE) --no-print-directory fuzz-short

# Go before 1.27 can fail a target just as -fuzztime ends, with "context
# deadline exceeded" and no failing input (golang/go#75804, a race in its
# fuzzing coordinator, likelier on busy cores): such a run is repeated once.
# A run that found a failing input fails at once.
fuzz-short:
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		for try in 1 2; do echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
			out=$$($(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5x $$pkg 2>&1); rc=$$?; echo "$$out"; \
			[ $$rc -eq 0 ] && break; \
			if [ $$try -eq 1 ] && echo "$$out" | grep -q 'context deadline exceeded' && ! echo "$$out" | grep -q 'Failing input written'; then \
				echo "fuzz: $$fn ended in Go's -fuzztime race (golang/go#75804) with no failing input: once more"; continue; fi; \
			exit 1; done; done

robustness:
	cd test/robustness && $(ROBUSTNESS_ENV) ROBUSTNESS_LONG=1 $(GO) test -count=1 -timeout 240m -v ./...
	ROBUSTNESS_LONG=1 $(GO) test -tags $(TESTHOOKS) -count=1 -run 'TestCrashConsistency|TestExportPersisted' -v ./mvcc
	$(MAKE) --no-print-directory fuzz-short FUZZTIME=60s

# conformance runs k8s.io/apiserver's storage test suite and end-to-end
# kube-apiserver scenarios against fdb-etcd, with an embedded etcd as the
# reference (own module under test/apiserver-conformance, Kubernetes 1.37):
# fdb-etcd on its embedded store, and, when FoundationDB is found as above,
# three fdb-etcd replicas on a throwaway fdbserver (CONFORMANCE_FDB=0 skips
# them, 1 requires them). The kube binaries are built once into
# ~/.cache/fdb-etcd/ and reused.
CONFORMANCE_FDB ?= $(if $(FDB_MISSING),0,1)
conformance:
	@if [ "$(CONFORMANCE_FDB)" = 0 ]; then echo "conformance: fdb-etcd on FoundationDB not run: $(if $(FDB_MISSING),$(FDB_MISSING),CONFORMANCE_FDB=0)"; fi
	cd test/apiserver-conformance && CONFORMANCE_FDB=$(CONFORMANCE_FDB) ./hack/run.sh

# conformance-fdb-faults runs kube-apiserver and a client-go workload
# (writes, consistent LISTs, a watch, an informer) on three fdb-etcd replicas
# on a five-process `double ssd-2` FoundationDB cluster while an fdbserver
# storage process, the replica owning writes and (a forced recovery) every
# fdbserver fail, and checks that nothing acknowledged was lost, no watch
# skipped or relisted, and reports each fault's write unavailability
# (TestFDBFaults; several minutes, so not part of make conformance).
.PHONY: conformance-fdb-faults
conformance-fdb-faults:
	@if [ -n "$(FDB_MISSING)" ]; then echo "conformance-fdb-faults: FoundationDB is not installed: $(FDB_MISSING)" >&2; exit 1; fi
	@kubebin="$${KUBE_BIN_DIR:-$$(cd test/apiserver-conformance && hack/build-kube.sh | tail -n1)}" && \
	cd test/apiserver-conformance && CONFORMANCE_FDB=1 CONFORMANCE_FDB_FAULTS=1 KUBE_BIN_DIR="$$kubebin" \
	$(GO) test -count=1 -timeout 30m -run '^TestFDBFaults$$' -v ./scenarios -args -report $(CURDIR)/test/apiserver-conformance/results/fdb-faults.md

# conformance-mirror runs TestMirrorCutover alone (it also runs in make
# conformance): kube-apiserver with a client-go workload on etcd, `fdb-etcd
# mirror` following it, and a cut-over to fdb-etcd under the running
# apiserver; checks no informer relisted and nothing acknowledged was lost,
# and reports the mirror's lag.
.PHONY: conformance-mirror
conformance-mirror:
	@kubebin="$${KUBE_BIN_DIR:-$$(cd test/apiserver-conformance && hack/build-kube.sh | tail -n1)}" && \
	cd test/apiserver-conformance && CONFORMANCE_FDB=0 CONFORMANCE_MIRROR=1 KUBE_BIN_DIR="$$kubebin" \
	$(GO) test -count=1 -timeout 20m -run '^TestMirrorCutover$$' -v ./scenarios $(if $(MIRROR_CUTOVER),-args -mirror-cutover=$(MIRROR_CUTOVER))

# conformance-dropin installs fdb-etcd as `etcd` on PATH and runs Kubernetes'
# own integration tests (test/integration/apiserver and apimachinery of the
# pinned release, through their unchanged framework) with it; own module
# under test/apiserver-conformance/dropin. The first run compiles them
# (~20 min on 2 cores). DROPIN_BACKEND=fdb runs them on FoundationDB.
.PHONY: conformance-dropin
conformance-dropin:
	$(if $(filter fdb,$(DROPIN_BACKEND)),$(GO) run ./internal/fdbserver/withfdb) sh -c 'cd test/apiserver-conformance/dropin && $(GO) test -count=1 -timeout 180m -v ./... -args -report $(CURDIR)/test/apiserver-conformance/dropin/results/dropin.md'

# conformance-all runs the same for every supported Kubernetes minor, one
# after the other (hack/matrix.sh; KUBE_VERSIONS to choose): the kube
# binaries of each are built once (niced, 5-15 min of CPU each) and cached,
# the reports go to test/apiserver-conformance/results/<version>/ and a
# table of all of them to results/matrix.md. FoundationDB as for
# conformance: every minor runs the three-replica half when it is found.
.PHONY: conformance-all
conformance-all:
	@if [ "$(CONFORMANCE_FDB)" = 0 ]; then echo "conformance-all: fdb-etcd on FoundationDB not run: $(if $(FDB_MISSING),$(FDB_MISSING),CONFORMANCE_FDB=0)"; fi
	cd test/apiserver-conformance && CONFORMANCE_FDB=$(CONFORMANCE_FDB) ./hack/matrix.sh

# scale runs a simulated Kubernetes cluster (kube-apiserver, controller-
# manager and scheduler at the conformance module's Kubernetes version,
# kwok for the kubelets) on etcd, fdb-etcd on Pebble and three fdb-etcd
# replicas on a throwaway FoundationDB, and reports the apiserver's SLIs
# side by side in test/scale/results/ (report.md, p99.png, results.json).
# The full profile takes about 20 min per store; SCALE_FLAGS=-preset=smoke
# is a few minutes in all. Without FoundationDB the fdb store is left out.
# etcd (the version Kubernetes pins) and kwok are built once from the Go
# module proxy through the pinned modules in test/scale/tools/.
.PHONY: scale
SCALE_BIN   := $(CURDIR)/test/scale/.bin
SCALE_FLAGS ?=
SCALE_RUN    = $(if $(FDB_MISSING),,$(if $(FDB_CLUSTER_FILE),,$(GO) run ./internal/fdbserver/withfdb)) \
	$(GO) -C test/scale run ./cmd/scale -out results \
	-kube-bin-dir "$$kubebin" -kwok $(SCALE_BIN)/kwok -kwok-module "$$kwokmod" \
	-etcd $(SCALE_BIN)/etcd -fdb-etcd $(SCALE_BIN)/fdb-etcd \
	$(if $(FDB_MISSING),-stores etcd$(COMMA)pebble,-fdb-etcd-fdb $(SCALE_BIN)/fdb-etcd-fdb)
COMMA := ,
scale: $(SCALE_BIN)/etcd $(SCALE_BIN)/kwok
	$(GO) build -ldflags "$(LDFLAGS)" -o $(SCALE_BIN)/fdb-etcd ./cmd/fdb-etcd
	@if [ -n "$(FDB_MISSING)" ]; then echo "scale: leaving out fdb-etcd on FoundationDB: $(FDB_MISSING)"; \
	else set -x; CGO_ENABLED=1 $(GO) build -tags fdb -ldflags "$(LDFLAGS)" -o $(SCALE_BIN)/fdb-etcd-fdb ./cmd/fdb-etcd; fi
	@kubebin="$${KUBE_BIN_DIR:-$$(cd test/apiserver-conformance && hack/build-kube.sh | tail -n1)}" && \
	kwokmod="$$(cd test/scale/tools/kwok && $(GO) list -m -f '{{.Dir}}' sigs.k8s.io/kwok)" && \
	echo "scale: kube binaries in $$kubebin" && \
	$(SCALE_RUN) $(SCALE_FLAGS)

$(SCALE_BIN)/etcd: test/scale/tools/etcd/go.mod test/scale/tools/etcd/go.sum
	cd test/scale/tools/etcd && $(GO) build -trimpath -o $@ go.etcd.io/etcd/server/v3

$(SCALE_BIN)/kwok: test/scale/tools/kwok/go.mod test/scale/tools/kwok/go.sum
	cd test/scale/tools/kwok && $(GO) build -trimpath -o $@ sigs.k8s.io/kwok/cmd/kwok

# bench and bench-quick: fdb-etcd side by side with etcd and kine.
include bench/bench.mk

clean:
	rm -rf $(BIN)
