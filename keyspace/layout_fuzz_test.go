package keyspace

import (
	"bytes"
	"testing"
)

// FuzzLayoutKeys checks the rest of the mvcc layout the way FuzzHistoryKey
// checks history keys: chunk keys sort by (key, revision, index) and stay in
// their version's range; log keys round-trip and sort by (revision, part);
// lease and attachment keys round-trip; and no two families interleave.
func FuzzLayoutKeys(f *testing.F) {
	f.Add([]byte("a"), int64(1), uint16(1), []byte("a\x00"), int64(2), uint16(3))
	f.Add([]byte("\x00\xff"), int64(1<<40), uint16(0), []byte("\x00"), int64(0), uint16(65535))
	f.Add([]byte(""), int64(7), uint16(2), []byte("\xff\xff"), int64(7), uint16(1))
	f.Fuzz(func(t *testing.T, k1 []byte, r1 int64, i1 uint16, k2 []byte, r2 int64, i2 uint16) {
		if r1 < 0 || r2 < 0 {
			return
		}
		c1, c2 := Chunk(k1, r1, int(i1)), Chunk(k2, r2, int(i2))
		want := bytes.Compare(k1, k2)
		if want == 0 {
			want = cmpInt(r1, r2)
		}
		if want == 0 {
			want = cmpInt(int64(i1), int64(i2))
		}
		if got := bytes.Compare(c1, c2); got != want {
			t.Fatalf("chunk order of %q@%d#%d vs %q@%d#%d: %d, want %d", k1, r1, i1, k2, r2, i2, got, want)
		}
		b, e := ChunkVersion(k1, r1)
		if bytes.Compare(c1, b) < 0 || bytes.Compare(c1, e) >= 0 {
			t.Fatalf("chunk %q@%d#%d outside its version range", k1, r1, i1)
		}
		if in := bytes.Compare(c2, b) >= 0 && bytes.Compare(c2, e) < 0; in != (bytes.Equal(k1, k2) && r1 == r2) {
			t.Fatalf("chunk %q@%d#%d in the range of %q@%d: %v", k2, r2, i2, k1, r1, in)
		}

		l1, l2 := Log(r1, int(i1)), Log(r2, int(i2))
		rev, part, err := ParseLog(l1)
		if err != nil || rev != r1 || part != int(i1) {
			t.Fatalf("log key round trip %d/%d: %d/%d %v", r1, i1, rev, part, err)
		}
		want = cmpInt(r1, r2)
		if want == 0 {
			want = cmpInt(int64(i1), int64(i2))
		}
		if got := bytes.Compare(l1, l2); got != want {
			t.Fatalf("log order %d/%d vs %d/%d: %d, want %d", r1, i1, r2, i2, got, want)
		}
		if bytes.Compare(l1, LogFrom(r1)) < 0 || bytes.Compare(l1, LogFrom(r1+1)) >= 0 && r1 < 1<<62 {
			t.Fatalf("log key %d/%d outside [LogFrom(%d), LogFrom(%d))", r1, i1, r1, r1+1)
		}

		if id, err := ParseLease(Lease(r1)); err != nil || id != r1 {
			t.Fatalf("lease key round trip %d: %d %v", r1, id, err)
		}
		j := JournalRecord(uint64(r1), uint32(i1))
		if n, part, err := ParseJournalRecord(j); err != nil || n != uint64(r1) || part != uint32(i1) {
			t.Fatalf("journal key round trip %d/%d: %d/%d %v", r1, i1, n, part, err)
		}
		if jb, je := JournalAll(); bytes.Compare(j, jb) < 0 || bytes.Compare(j, je) >= 0 {
			t.Fatalf("journal key %x outside JournalAll", j)
		}
		a := Attach(r1, k1)
		if !bytes.HasPrefix(a, AttachPrefix(r1)) || !bytes.Equal(a[len(AttachPrefix(r1)):], k1) {
			t.Fatalf("attach key of %d/%q", r1, k1)
		}

		// Families never interleave: every key sorts by its family byte
		// first, and each family's range holds only its own keys.
		keys := [][]byte{Head, Compaction, Latest(k1), History(k1, r1), c1, l1, a, Lease(r1), Batch(uint64(r1), uint64(i1)), Singleton(string(k1)), JournalCounter, j}
		for i := 1; i < len(keys); i++ {
			if keys[i-1][0] > keys[i][0] {
				t.Fatalf("family %x after %x", keys[i][0], keys[i-1][0])
			}
		}
		lb, le := LatestRange(k1, nil)
		for _, k := range keys {
			if in := bytes.Compare(k, lb) >= 0 && bytes.Compare(k, le) < 0; in != (k[0] == Latest(nil)[0]) {
				t.Fatalf("key %x in the latest range of %q: %v", k, k1, in)
			}
		}
		hb, he := HistoryAll()
		for _, k := range keys {
			if in := bytes.Compare(k, hb) >= 0 && bytes.Compare(k, he) < 0; in != (k[0] == hb[0]) {
				t.Fatalf("key %x in the history family: %v", k, in)
			}
		}
	})
}
