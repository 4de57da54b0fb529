package cdispec

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/gpu"
)

type sound struct{ err error }

func (s sound) CheckHealth(int) error                                { return s.err }
func (s sound) WatchXIDs(context.Context, chan<- gpu.XIDEvent) error { return nil }

const spec = `cdiVersion: "0.6.0"
kind: nvidia.com/gpu
devices:
  - name: GPU-a
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
  - name: "0"
    containerEdits:
      deviceNodes: [{path: /dev/nvidia0, type: c, major: 195, minor: 0}]
`

func TestChecker(t *testing.T) {
	dir := t.TempDir()
	names := map[int][]string{0: {"nvidia.com/gpu=GPU-a"}, 1: {"nvidia.com/gpu=GPU-b"}}
	c := Checker{Checker: sound{}, Dirs: []string{dir, filepath.Join(dir, "absent")}, Names: func(i int) []string { return names[i] }}
	for _, i := range []int{0, 1} {
		if err := c.CheckHealth(i); err == nil || !strings.Contains(err.Error(), names[i][0]) || !strings.Contains(err.Error(), "nvidia-ctk cdi generate") {
			t.Errorf("GPU %d without a spec: %v, want an error naming %s and the fix", i, err, names[i][0])
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "nvidia.yaml"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.CheckHealth(0); err != nil {
		t.Errorf("GPU 0 named by the spec: %v", err)
	}
	if err := c.CheckHealth(1); err == nil || !strings.Contains(err.Error(), "nvidia.com/gpu=GPU-b") {
		t.Errorf("GPU 1, not in the spec: %v", err)
	}
	// The GPU's own fault comes first.
	c.Checker = sound{err: errors.New("fell off the bus")}
	if err := c.CheckHealth(0); err == nil || err.Error() != "fell off the bus" {
		t.Errorf("a faulty GPU: %v", err)
	}
}

func TestMissingBadSpec(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "bad.yaml"), []byte("kind: [garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing, err := Missing([]string{dir}, []string{"nvidia.com/gpu=GPU-a"})
	if err == nil && len(missing) != 1 {
		t.Errorf("a garbage spec: missing %v, err %v; want the name missing or an error", missing, err)
	}
}
