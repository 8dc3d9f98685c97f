package main

import "testing"

func TestBuggifyFlags(t *testing.T) {
	c, err := parseFlags([]string{"--backend", "fdb", "--fdb-client-buggify",
		"--fdb-client-buggify-section-activated-probability", "50", "--fdb-client-buggify-section-fired-probability", "5"})
	if err != nil {
		t.Fatal(err)
	}
	if b := c.fdbBuggify; !b.Enable || b.SectionActivatedPercent != 50 || b.SectionFiredPercent != 5 {
		t.Fatalf("parsed %+v", b)
	}
	if c, err := parseFlags([]string{"--backend", "fdb"}); err != nil || c.fdbBuggify.Enable {
		t.Fatalf("buggify must be off by default: %+v, %v", c.fdbBuggify, err)
	}
	for _, bad := range [][]string{
		{"--fdb-client-buggify"}, // the embedded backend has no FoundationDB client
		{"--backend", "fdb", "--fdb-client-buggify-section-fired-probability", "5"},
		{"--backend", "fdb", "--fdb-client-buggify", "--fdb-client-buggify-section-activated-probability", "101"},
		{"--backend", "fdb", "--fdb-client-buggify", "--fdb-client-buggify-section-fired-probability", "-1"},
	} {
		if _, err := parseFlags(bad); err == nil {
			t.Errorf("parseFlags(%q) accepted", bad)
		}
	}
}
