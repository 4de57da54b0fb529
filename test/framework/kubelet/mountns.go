package kubelet

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DevicePluginDir is where the real device manager always listens
// (kubelet.sock) and keeps its checkpoint; NewManagerImpl takes no path.
const DevicePluginDir = "/var/lib/kubelet/device-plugins"

// envParentMountNS is set for the re-executed test binary to the mount
// namespace of the process that started it (e.g. "mnt:[4026531841]").
const envParentMountNS = "TESSERA_TEST_PARENT_MOUNTNS"

// RunInPrivateMountNamespace is meant for TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(kubelet.RunInPrivateMountNamespace(m)) }
//
// The first time it runs, it re-executes the test binary with the same
// arguments in a new mount namespace with private propagation (Go's
// SysProcAttr.Unshareflags=CLONE_NEWNS, the same as `unshare -m
// --propagation private`) and returns the child's exit code. In the child,
// it mounts a fresh tmpfs on DevicePluginDir and runs the tests. The mount
// goes away with the namespace when the child exits, so the host's (or a
// real kubelet's) device-plugin directory is never touched. Directories the
// parent had to create for the mount point are removed again afterwards.
//
// This needs root (CAP_SYS_ADMIN). Unsharing only the calling thread from
// inside a running Go program would not do: unshare(CLONE_NEWNS) is
// per-thread and the runtime runs goroutines on many threads.
func RunInPrivateMountNamespace(m *testing.M) int {
	return RunMainInPrivateMountNamespace(m.Run)
}

// RunMainInPrivateMountNamespace is RunInPrivateMountNamespace for a
// program's main (e.g. a node simulator, one process per node): the first
// time it re-executes the program in a new mount namespace and returns the
// child's exit code; in the child it mounts a fresh tmpfs on
// DevicePluginDir and returns run's result.
func RunMainInPrivateMountNamespace(run func() int) int {
	if os.Getenv(envParentMountNS) != "" {
		if err := mountPrivateTmpfs(DevicePluginDir); err != nil {
			fmt.Fprintf(os.Stderr, "private mount namespace: %v\n", err)
			return 1
		}
		return run()
	}
	code, err := reexecInMountNamespace(DevicePluginDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "re-exec the tests in a private mount namespace (needs root): %v\n", err)
		return 1
	}
	return code
}

func reexecInMountNamespace(mountPoint string) (int, error) {
	created, err := mkdirAllRecord(mountPoint)
	defer func() {
		// Innermost first; only empty directories we made ourselves.
		for i := len(created) - 1; i >= 0; i-- {
			_ = os.Remove(created[i])
		}
	}()
	if err != nil {
		return 0, err
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return 0, fmt.Errorf("read own mount namespace: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, fmt.Errorf("find test executable: %w", err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envParentMountNS+"="+self)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes / rprivate in the child
		Pdeathsig:    syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("start %s in a new mount namespace: %w", exe, err)
	}
	// Pass on interrupts (the child then prints what was running).
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-sigs:
			_ = cmd.Process.Signal(s)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ee.ExitCode() < 0 {
					return 1, fmt.Errorf("test child: %w", err)
				}
				return ee.ExitCode(), nil
			}
			if err != nil {
				return 0, fmt.Errorf("wait for test child: %w", err)
			}
			return 0, nil
		}
	}
}

// mkdirAllRecord is os.MkdirAll that returns the directories it created.
func mkdirAllRecord(dir string) ([]string, error) {
	var missing []string
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("stat %s: %w", d, err)
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return created, fmt.Errorf("create mount point: %w", err)
		}
		created = append(created, missing[i])
	}
	return created, nil
}

func mountPrivateTmpfs(dir string) error {
	if err := checkPrivateMountNamespace(); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=64m"); err != nil {
		return fmt.Errorf("mount tmpfs on %s: %w", dir, err)
	}
	return nil
}

// checkPrivateMountNamespace fails unless this process was started by
// RunInPrivateMountNamespace and lives in another mount namespace than the
// process that started it.
func checkPrivateMountNamespace() error {
	parent := os.Getenv(envParentMountNS)
	if parent == "" {
		return fmt.Errorf("not started through RunInPrivateMountNamespace; refusing to touch %s", DevicePluginDir)
	}
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return fmt.Errorf("read own mount namespace: %w", err)
	}
	if self == parent {
		return fmt.Errorf("still in the parent's mount namespace (%s); refusing to touch %s", self, DevicePluginDir)
	}
	return nil
}

// checkDevicePluginDir fails unless DevicePluginDir is a tmpfs in a private
// mount namespace, so that a harness never takes over a real kubelet's
// socket or checkpoint.
func checkDevicePluginDir() error {
	if err := checkPrivateMountNamespace(); err != nil {
		return fmt.Errorf("%w (call kubelet.RunInPrivateMountNamespace from TestMain)", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(DevicePluginDir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", DevicePluginDir, err)
	}
	if st.Type != unix.TMPFS_MAGIC {
		return fmt.Errorf("%s is not a tmpfs (type %#x); call kubelet.RunInPrivateMountNamespace from TestMain", DevicePluginDir, st.Type)
	}
	if filepath.Clean(pluginapi.DevicePluginPath) != DevicePluginDir {
		return fmt.Errorf("device plugin path %s differs from %s", pluginapi.DevicePluginPath, DevicePluginDir)
	}
	return nil
}
