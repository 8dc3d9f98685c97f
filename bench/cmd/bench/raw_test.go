package main

import (
	"testing"

	"github.com/fdb-etcd/fdb-etcd/bench/internal/servers"
	"github.com/fdb-etcd/fdb-etcd/bench/internal/workload"
)

// TestRawSpecBatched: fdb-raw-batched group-commits the write rows and has
// no equivalent for the others; fdb-raw runs every row with an equivalent
// one transaction per operation.
func TestRawSpecBatched(t *testing.T) {
	p := workload.Quick()
	for _, w := range workload.All(p) {
		plain := rawSpec(servers.FDBRaw, w, p)
		batched := rawSpec(servers.FDBRawBatched, w, p)
		if plain.Batched {
			t.Errorf("%s: fdb-raw batches", w.Name())
		}
		switch {
		case plain.Op == "":
			if batched.Op != "" {
				t.Errorf("%s: batched has an operation without a plain one", w.Name())
			}
		case plain.Batchable:
			if batched.Op != plain.Op || !batched.Batched {
				t.Errorf("%s: batched spec %+v, want %s batched", w.Name(), batched, plain.Op)
			}
		default:
			if batched.Op != "" || batched.None == "" {
				t.Errorf("%s: batched spec %+v, want none with a reason", w.Name(), batched)
			}
		}
	}
}
