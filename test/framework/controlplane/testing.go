package controlplane

import (
	"os"
	"path/filepath"
	"testing"
)

// EnvArtifactsDir names a directory where StartForTest copies the
// components' logs of failed tests (one folder per test).
const EnvArtifactsDir = "TESSERA_TEST_ARTIFACTS"

// StartForTest starts a control plane for t with opts (Binaries from
// BinariesFromEnv when opts.Binaries is zero) and fails t when that does not
// work. Cleanup stops everything; when t has failed, it first prints the tail
// of every component log (and copies whole logs to $TESSERA_TEST_ARTIFACTS).
func StartForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	if opts.Binaries == (Binaries{}) {
		b, err := BinariesFromEnv()
		if err != nil {
			t.Fatalf("control plane binaries: %v", err)
		}
		opts.Binaries = b
	}
	cp, err := Start(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane logs (dir %s):\n%s", cp.Dir(), cp.logTails(32<<10))
			if dst := os.Getenv(EnvArtifactsDir); dst != "" {
				copyLogs(t, cp.Dir(), filepath.Join(dst, filepath.Clean("/" + t.Name())[1:]))
			}
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

func copyLogs(t testing.TB, srcDir, dstDir string) {
	logs, _ := filepath.Glob(filepath.Join(srcDir, "*.log"))
	if err := os.MkdirAll(dstDir, 0o755); err != nil {
		t.Logf("copy logs: %v", err)
		return
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err == nil {
			err = os.WriteFile(filepath.Join(dstDir, filepath.Base(l)), b, 0o644)
		}
		if err != nil {
			t.Logf("copy log %s: %v", l, err)
		}
	}
	t.Logf("control plane logs copied to %s", dstDir)
}
