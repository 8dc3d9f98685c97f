package storage

import "testing"

// TestSameValue: absent and empty differ; present values compare by bytes.
func TestSameValue(t *testing.T) {
	for _, c := range []struct {
		v, seen []byte
		same    bool
	}{
		{nil, nil, true},
		{[]byte{}, []byte{}, true},
		{[]byte("a"), []byte("a"), true},
		{nil, []byte{}, false},
		{[]byte{}, nil, false},
		{[]byte("a"), []byte("b"), false},
		{[]byte("a"), nil, false},
	} {
		if got := SameValue(c.v, c.seen); got != c.same {
			t.Errorf("SameValue(%q (nil %t), %q (nil %t)) = %t, want %t", c.v, c.v == nil, c.seen, c.seen == nil, got, c.same)
		}
	}
}
