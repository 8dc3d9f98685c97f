package main

import (
	"testing"
	"time"
)

func TestParseFaults(t *testing.T) {
	o, jump, err := parseFaults("retry=0.1, unknown=0.2,tooold=0.01,agejump=2s,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	if o.RetryProbability != 0.1 || o.CommitUnknownProbability != 0.2 || o.TooOldProbability != 0.01 || o.Seed != 7 || jump != 2*time.Second {
		t.Fatalf("parsed %+v, jump %v", o, jump)
	}
	for _, bad := range []string{"retry", "retry=x", "bogus=1", "agejump=soon"} {
		if _, _, err := parseFaults(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	c, err := parseFlags([]string{"--experimental-storage-faults=retry=0.5", "--experimental-persisted-journal"})
	if err != nil {
		t.Fatal(err)
	}
	if c.test.faults != "retry=0.5" || !c.test.journal {
		t.Fatalf("test hooks %+v", c.test)
	}
}
