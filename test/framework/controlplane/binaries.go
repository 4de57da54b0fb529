package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

const (
	// EnvK8sBinDir names the directory holding kube-apiserver and
	// kube-scheduler (test.mk sets it to <repo>/bin/k8s).
	EnvK8sBinDir = "TESSERA_TEST_K8S_BIN_DIR"
	// EnvEtcd names the etcd binary (a path, or a name looked up on PATH).
	EnvEtcd = "TESSERA_TEST_ETCD"
)

// Binaries are the executables a ControlPlane runs.
type Binaries struct {
	Etcd      string
	APIServer string
	Scheduler string
	// ControllerManager is needed only by StartControllerManager.
	ControllerManager string
}

// BinariesFromEnv resolves the binaries from $TESSERA_TEST_K8S_BIN_DIR
// (default: bin/k8s in the repository that contains the working directory;
// a relative path is relative to the repository's test/ directory)
// and $TESSERA_TEST_ETCD (default: etcd on PATH). It fails, naming the make
// target that provides them, when one is missing.
func BinariesFromEnv() (Binaries, error) {
	binDir := os.Getenv(EnvK8sBinDir)
	if binDir == "" || !filepath.IsAbs(binDir) {
		root, err := RepoRoot()
		if err != nil {
			return Binaries{}, fmt.Errorf("%s is %q: %w", EnvK8sBinDir, binDir, err)
		}
		if binDir == "" {
			binDir = filepath.Join(root, "bin", "k8s")
		} else {
			// go test runs each package in its own directory: a relative
			// path is taken from test/, where `go test ./...` is run.
			binDir = filepath.Join(root, "test", binDir)
		}
	}
	etcd := os.Getenv(EnvEtcd)
	if etcd == "" {
		etcd = "etcd"
	}
	b := Binaries{
		Etcd:      etcd,
		APIServer: filepath.Join(binDir, "kube-apiserver"),
		Scheduler: filepath.Join(binDir, "kube-scheduler"),
		// Checked when started: most tests run without it.
		ControllerManager: filepath.Join(binDir, "kube-controller-manager"),
	}
	var err error
	if b.Etcd, err = exec.LookPath(b.Etcd); err != nil {
		return Binaries{}, fmt.Errorf("etcd not found (run `make test-deps`, or set %s): %w", EnvEtcd, err)
	}
	return b, b.validate(true)
}

func (b Binaries) validate(withScheduler bool) error {
	errs := []error{checkBinary("etcd", b.Etcd), checkBinary("kube-apiserver", b.APIServer)}
	if withScheduler {
		errs = append(errs, checkBinary("kube-scheduler", b.Scheduler))
	}
	return errors.Join(errs...)
}

// checkBinary reports a binary that is not configured or not executable.
func checkBinary(what, path string) error {
	if path == "" {
		return fmt.Errorf("no %s binary configured", what)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("%s binary (run `make k8s-bins`, or set %s): %w", what, EnvK8sBinDir, err)
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s binary %s is not an executable file", what, path)
	}
	return nil
}

// RepoRoot walks up from the working directory to the repository root: the
// directory that holds test/test.mk. Every test and command of this module
// finds the repository with it.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "test.mk")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no enclosing directory holds test/test.mk")
		}
		dir = parent
	}
}
