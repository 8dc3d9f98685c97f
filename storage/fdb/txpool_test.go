//go:build fdb

package fdb_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/fdb-etcd/fdb-etcd/storage"
	"github.com/fdb-etcd/fdb-etcd/storage/fdb/fdbtest"
)

// TestReusedTransactionsCarryNothingOver: a call's transaction serves the
// next call once it ends (txpool.go), and what the first did — writes it
// gave up, the read version it read at — is not the next one's. Repeated,
// since the pool may drop what it is given.
func TestReusedTransactionsCarryNothingOver(t *testing.T) {
	db := fdbtest.Open(t)
	giveUp := errors.New("given up")
	for i := range 20 {
		left := "left" + strconv.Itoa(i)
		err := db.Update(ctx(t), func(tx storage.Tx) error {
			tx.Set([]byte(left), []byte("x"))
			return giveUp
		})
		if !errors.Is(err, giveUp) {
			t.Fatalf("the Update that gives up: %v", err)
		}
		set(t, db, "k", strconv.Itoa(i))
		if v := get(t, db, left); v != nil {
			t.Fatalf("%s, written by an Update that gave up, is %q after the next Update", left, v)
		}
		if v := string(get(t, db, "k")); v != strconv.Itoa(i) {
			t.Fatalf("k is %q after writing %d", v, i)
		}
	}
}

// TestCanceledCallsLeaveNoCanceledTransaction: a call whose context ends
// cancels its transaction, and no later call gets that transaction.
func TestCanceledCallsLeaveNoCanceledTransaction(t *testing.T) {
	db := fdbtest.Open(t)
	set(t, db, "k", "v")
	for i := range 50 {
		c, cancel := context.WithCancel(ctx(t))
		err := db.View(c, func(tx storage.ReadTx) error {
			_, err := tx.Get([]byte("k"))
			cancel()
			return err
		})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("the canceled View: %v", err)
		}
		if v := string(get(t, db, "k")); v != "v" {
			t.Fatalf("after %d canceled Views, k is %q", i+1, v)
		}
	}
}
