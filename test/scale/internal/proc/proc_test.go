package proc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestStartUsageStop(t *testing.T) {
	// A duration no other sleep on the machine is likely to have.
	secs := "59." + strconv.Itoa(1+time.Now().Nanosecond()%999999)
	log := filepath.Join(t.TempDir(), "sh.log")
	// A shell that spins for a while (CPU time), says so, then sleeps.
	p, err := Start("sh", "sh", []string{"-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; echo spun; exec sleep ` + secs}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(FileTail(log, 5), "spun") {
		if time.Now().After(deadline) {
			t.Fatalf("no output: %q", FileTail(log, 5))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if pid, err := FindByArg("sleep", secs); err != nil || pid != p.PID() {
		t.Errorf("FindByArg(sleep, %s) = %d, %v; want %d", secs, pid, err, p.PID())
	}
	u, err := ReadUsage(p.PID())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPU <= 0 || u.RSS <= 0 || u.PeakRSS < u.RSS {
		t.Errorf("usage %+v: want CPU > 0, 0 < RSS <= PeakRSS", u)
	}
	p.Stop()
	if exited, _ := p.Exited(); !exited {
		t.Error("still running after Stop")
	}
	if _, err := ReadUsage(p.PID()); err == nil {
		t.Error("usage of an ended process")
	}
	if _, err := FindByArg("sleep", secs); err == nil {
		t.Error("FindByArg found an absent process")
	}
}

func TestReadUsageSelf(t *testing.T) {
	u, err := ReadUsage(os.Getpid())
	if err != nil || u.RSS <= 0 {
		t.Errorf("own usage %+v, %v", u, err)
	}
}
