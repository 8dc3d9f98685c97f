package mvcc

// latestValues holds, for the keys whose newest revisions the log tail took
// in, the value that revision put, so that the tail knows the previous value
// of a later write of the key that did not read it.
//
// A write reads its key's index entry — revision, version, lease — but not
// its value unless the request asked for prev_kv; kube-apiserver's updates
// (a Txn comparing the mod revision, then a Put) never do. Yet its watchers
// all ask for previous values, and a revision whose previous value the tail
// does not know is read from storage by every watch hub, the write owner's
// and every replica's that follows its commit feed. Finding the value among
// the tail's revisions covers only a key written again within the tail's few
// MiB; a node's status, a pod deleted minutes after it started, fell out of
// it, and in make scale's profile nearly half of the hubs' reads of new
// revisions went to storage. One value per key reaches much further back.
//
// A value is served only for exactly the revision that wrote it: a value is
// never changed once written, so (key, revision) names it whatever another
// process or a compaction did since. Bounded by bytes, oldest write first,
// counting each recorded write so that a key rewritten often cannot grow it.
// Not safe for concurrent use: the tail guards it with its lock.
type latestValues struct {
	maxBytes int
	byKey    map[string]latestValue
	// order lists the writes as recorded, oldest from head on; a write
	// whose key was written again since is skipped when it leaves.
	order []keyRev
	head  int
	size  int
}

type latestValue struct {
	rev   int64
	value []byte // never modified
}

type keyRev struct {
	key string
	rev int64
}

// What a held value and a recorded write cost besides their bytes: a map
// entry and its string header, and an order record.
const (
	latestValueOverhead = 80
	latestOrderOverhead = 32
)

func newLatestValues(maxBytes int) *latestValues {
	return &latestValues{maxBytes: maxBytes, byKey: make(map[string]latestValue)}
}

// get returns the value revision rev put at key, if held.
func (l *latestValues) get(key []byte, rev int64) ([]byte, bool) {
	v, ok := l.byKey[string(key)]
	if !ok || v.rev != rev {
		return nil, false
	}
	return v.value, true
}

// put records that revision rev put value at key; revisions of one key come
// in ascending order.
func (l *latestValues) put(key []byte, rev int64, value []byte) {
	k := string(key)
	cost := valueCost(k, value) + latestOrderOverhead + len(k)
	if cost > l.maxBytes {
		l.forget(key)
		return
	}
	if old, ok := l.byKey[k]; ok {
		if old.rev >= rev {
			return
		}
		l.size -= valueCost(k, old.value)
	}
	l.byKey[k] = latestValue{rev: rev, value: value}
	l.order = append(l.order, keyRev{key: k, rev: rev})
	l.size += cost
	for l.size > l.maxBytes {
		l.dropOldest()
	}
}

// forget records that key was deleted, or written without a value held.
func (l *latestValues) forget(key []byte) {
	if old, ok := l.byKey[string(key)]; ok {
		l.size -= valueCost(string(key), old.value)
		delete(l.byKey, string(key))
	}
}

func valueCost(key string, value []byte) int { return latestValueOverhead + len(key) + len(value) }

// dropOldest lets the oldest recorded write go, and its value with it if
// the key was not written since.
func (l *latestValues) dropOldest() {
	kr := l.order[l.head]
	l.order[l.head] = keyRev{}
	l.head++
	l.size -= latestOrderOverhead + len(kr.key)
	if v, ok := l.byKey[kr.key]; ok && v.rev == kr.rev {
		l.size -= valueCost(kr.key, v.value)
		delete(l.byKey, kr.key)
	}
	if l.head == len(l.order) {
		l.order, l.head = l.order[:0], 0
	} else if l.head > len(l.order)/2 && l.head > 1024 {
		n := copy(l.order, l.order[l.head:])
		clear(l.order[n:])
		l.order, l.head = l.order[:n], 0
	}
}
