# fdb-etcd — build, run and test.
GO        ?= go
BIN       ?= bin
DATA_DIR  ?= default.etcd
LISTEN    ?= http://127.0.0.1:2379
PKGS      := ./...

.PHONY: build build-fdb run test test-short lint bench test-fdb clean

build:
	$(GO) build -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

# build-fdb needs cgo and the FoundationDB 7.3 client library (libfdb_c).
build-fdb:
	CGO_ENABLED=1 $(GO) build -tags fdb -o $(BIN)/fdb-etcd ./cmd/fdb-etcd

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

bench:
	cd bench && $(GO) run ./cmd/bench

clean:
	rm -rf $(BIN)
