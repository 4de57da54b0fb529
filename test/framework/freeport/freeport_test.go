package freeport

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

func TestPortsBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow(rangeFile)
	ps, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Errorf("port %d handed out twice in %v", p, ps)
		}
		seen[p] = true
		if low-lowest >= 1000 && (p < lowest || p >= low) {
			t.Errorf("port %d outside %d..%d", p, lowest, low-1)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d: %v", p, err)
			continue
		}
		l.Close()
	}
	if len(ps) != 20 {
		t.Errorf("got %d ports, want 20", len(ps))
	}
}

func TestPickSkipsBusyPorts(t *testing.T) {
	busy := func(p int) bool { return p%2 == 0 } // odd ports are taken
	ps, err := pick(50, 20000, busy)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p%2 != 0 || p < lowest || p >= 20000 {
			t.Errorf("picked %d: busy or out of range", p)
		}
	}
	if _, err := pick(1, 20000, func(int) bool { return false }); err == nil {
		t.Error("no port free: want an error")
	}
	if _, err := pick(-1, 20000, busy); err == nil {
		t.Error("-1 ports: want an error")
	}
}

func TestNoRoomBelowTheRangeFallsBackToTheKernel(t *testing.T) {
	ps, err := pick(3, lowest+10, func(int) bool {
		t.Error("a port below the range was tried")
		return true
	})
	if err != nil || len(ps) != 3 {
		t.Fatalf("pick = %v, %v; want 3 kernel ports", ps, err)
	}
}

func TestEphemeralLow(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		text string
		want int
	}{
		{"32768\t60999\n", 32768},
		{"1024 65535", 1024},
		{"garbage", 0},
		{"a b", 0},
		{"", 0},
	} {
		f := filepath.Join(dir, "range")
		if err := os.WriteFile(f, []byte(c.text), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := ephemeralLow(f); got != c.want {
			t.Errorf("ephemeralLow(%q) = %d, want %d", c.text, got, c.want)
		}
	}
	if got := ephemeralLow(filepath.Join(dir, "missing")); got != 0 {
		t.Errorf("missing file: %d, want 0", got)
	}
}
