// Package extenderenv runs tessera-extender against the real kube-scheduler
// for tests: a control plane (etcd, kube-apiserver) from
// framework/controlplane, the extender built from cmd/tessera-extender and
// run as its own process as the ServiceAccount of deploy/extender, with
// every RBAC document of deploy/ applied unchanged (framework/install),
// and kube-scheduler configured by deploy/extender/scheduler-config.yaml
// (only the extender's address replaced). Helpers create fake GPU Nodes
// (the inventory annotation and the extended resources a node agent
// publishes), pods and gang members, wait for bindings, read Events and
// watch every Binding.
//
// deploy/admission's policy is not installed here: the tests plant
// Tessera's decisions themselves, as the admin (pre-bound pods'
// assignments, FakeAgent's whole-GPU assignments), and the policy refuses
// that to anyone but Tessera's ServiceAccounts. They seal them with the
// key the extender made (Env.Sealer), as Tessera does. test/admission and
// test/e2e run with the policy.
//
//	e := extenderenv.Start(t, extenderenv.Options{ExtenderArgs: []string{"--gang-resync=500ms"}})
//	e.CreateNode(t, extenderenv.NodeSpec{Name: "n0", GPUs: 8})
//	e.CreatePod(t, extenderenv.PodSpec{Name: "p", GPUs: 8, Gang: "g", GangMinMember: 1})
//	e.WaitBound(t, "default", "p", time.Minute)
//
// With Options.InProcess the extender and kube-scheduler are one process
// instead: tessera-scheduler (scheduler/, kube-scheduler with Tessera's
// plugin) configured by deploy/scheduler/scheduler-config.yaml, the
// plugin's flags those the extender would get, the extender in it still
// as its ServiceAccount and serving Ext.Addr.
//
// Every helper fails the test (t.Fatal) on an API error. Missing binaries
// (kube-apiserver, kube-scheduler, etcd, or a tessera-extender that does
// not build) fail the test; nothing is skipped.
package extenderenv

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/sealkey"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/freeport"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

const (
	// DeployURL is the urlPrefix of deploy/extender/scheduler-config.yaml;
	// Start replaces it with the address of the extender it runs.
	DeployURL = install.DeployURL
	// ExtenderUser is the identity the extender runs as: its
	// ServiceAccount, bound by deploy/extender/rbac.yaml.
	ExtenderUser = install.ExtenderUserName
	// DefaultNamespace is where pods go when PodSpec.Namespace is empty.
	DefaultNamespace = "default"
)

// Options configure Start.
type Options struct {
	// ExtenderArgs are appended to the extender's flags, after
	// --kubeconfig, --listen, --policy=binpack and --v=2 (a later flag
	// wins), e.g. "--gang-levels=rack", "--gang-resync=500ms".
	ExtenderArgs []string
	// Agent runs FakeAgent, the stand-in for the node agents that records
	// the GPUs of every bound whole-GPU pod in its assignment annotation.
	Agent bool
	// Users are further identities of the control plane (see
	// controlplane.Options.Users).
	Users []*controlplane.User
	// InProcess runs tessera-scheduler (kube-scheduler with Tessera's
	// plugin, built from scheduler/) instead of the extender process and
	// the stock kube-scheduler, as a user of the plugin would: configured
	// by deploy/scheduler/scheduler-config.yaml with the plugin's flags
	// (the extender in its process) set to --kubeconfig (the extender's
	// ServiceAccount), --listen, --policy=binpack, --v=2 and ExtenderArgs.
	// Ext then stands for the extender inside the scheduler: Addr serves
	// /readyz, /status, /metrics and the webhooks; the log is the
	// scheduler's; Start, Stop and Kill start and stop the scheduler.
	InProcess bool
}

// Env is a running control plane, extender and kube-scheduler.
type Env struct {
	CP     *controlplane.ControlPlane
	Client kubernetes.Interface // admin (system:masters)
	Ext    *Extender
	Agent  *FakeAgent // nil unless Options.Agent
	// Sealer seals with the key the extender keeps in the Secret
	// kube-system/tessera-seal-key: what the tests write as Tessera's
	// decisions (CreatePod's Assign, FakeAgent) is sealed with it, or the
	// extender would ignore it.
	Sealer *api.Sealer
}

// Start starts everything for t and registers its cleanup. When t has
// failed, the cleanup logs the extender log's tail and, with
// $TESSERA_TEST_ARTIFACTS set, copies the whole log there (next to the
// control plane's logs).
func Start(t testing.TB, opts Options) *Env {
	t.Helper()
	user := install.ExtenderUser()
	cp := controlplane.StartForTest(t, controlplane.Options{Users: append([]*controlplane.User{user}, opts.Users...)})
	ctx := t.Context()
	client := cp.Client()

	// RBAC exactly as deployed: the ServiceAccounts, (Cluster)Roles and
	// bindings of deploy/extender and deploy/node.
	if err := install.RBAC(ctx, cp.RESTConfig(), RepoRoot(t)); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "extender.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.CAFile()}
	kc.AuthInfos["tessera-extender"] = &clientcmdapi.AuthInfo{Token: user.Token}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "tessera-extender"}
	kc.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	if opts.InProcess {
		return startInProcess(t, opts, cp, kubeconfig, dir)
	}
	ext := &Extender{t: t, bin: ExtenderBinary(t), kubeconfig: kubeconfig, addr: FreeAddr(t),
		logPath: filepath.Join(dir, "extender.log"), args: opts.ExtenderArgs}
	ext.Start(ctx)
	t.Cleanup(func() {
		ext.Stop()
		if t.Failed() {
			t.Logf("extender log (%s):\n%s", ext.logPath, ext.LogTail())
			if dst := os.Getenv(controlplane.EnvArtifactsDir); dst != "" {
				d := filepath.Join(dst, filepath.Clean("/" + t.Name())[1:])
				if b, err := os.ReadFile(ext.logPath); err == nil && os.MkdirAll(d, 0o755) == nil {
					_ = os.WriteFile(filepath.Join(d, "tessera-extender.log"), b, 0o644)
				}
			}
		}
	})

	// Ready means the extender has its seal key: read it, as the node
	// agents do, to seal what the tests write as Tessera.
	sealer, err := sealkey.Wait(ctx, sealkey.In(client, "kube-system"), 100*time.Millisecond)
	if err != nil {
		t.Fatalf("the extender's seal key: %v", err)
	}

	// The scheduler configuration exactly as deployed, but for the address.
	cfg := filepath.Join(dir, "scheduler-config.yaml")
	if err := install.SchedulerConfig(RepoRoot(t), cfg, "http://"+ext.addr, nil); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: cfg}); err != nil {
		t.Fatal(err)
	}
	e := &Env{CP: cp, Client: client, Ext: ext, Sealer: sealer}
	e.startAgent(t, opts)
	return e
}

// startAgent starts FakeAgent when opts ask for it.
func (e *Env) startAgent(t testing.TB, opts Options) {
	if !opts.Agent {
		return
	}
	e.Agent = &FakeAgent{Client: e.Client, Sealer: e.Sealer}
	actx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.Agent.Run(actx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// startInProcess is Start with Options.InProcess: tessera-scheduler,
// whose plugin runs the extender as kubeconfig (the extender's identity).
func startInProcess(t testing.TB, opts Options, cp *controlplane.ControlPlane, kubeconfig, dir string) *Env {
	t.Helper()
	ctx := t.Context()
	addr := FreeAddr(t)
	flags := append([]string{"--kubeconfig=" + kubeconfig, "--listen=" + addr, "--policy=binpack", "--v=2"}, opts.ExtenderArgs...)
	cfg := filepath.Join(dir, "tessera-scheduler-config.yaml")
	if err := install.PluginSchedulerConfig(RepoRoot(t), cfg, flags); err != nil {
		t.Fatal(err)
	}
	ext := &Extender{t: t, kubeconfig: kubeconfig, addr: addr, args: opts.ExtenderArgs,
		cp: cp, sched: &controlplane.SchedulerOptions{ConfigFile: cfg, Binary: SchedulerBinary(t)}}
	// The control plane's cleanup (registered before) prints and copies
	// the scheduler's log, which holds the extender's, when t failed.
	t.Cleanup(ext.Stop)
	ext.Start(ctx)
	sealer, err := sealkey.Wait(ctx, sealkey.In(cp.Client(), "kube-system"), 100*time.Millisecond)
	if err != nil {
		t.Fatalf("the extender's seal key: %v", err)
	}
	e := &Env{CP: cp, Client: cp.Client(), Ext: ext, Sealer: sealer}
	e.startAgent(t, opts)
	return e
}

// EnsureNamespace creates namespace ns (and its default ServiceAccount)
// unless it exists.
func (e *Env) EnsureNamespace(t testing.TB, ns string) {
	t.Helper()
	if err := e.CP.EnsureNamespace(t.Context(), ns); err != nil {
		t.Fatal(err)
	}
}

// RepoRoot is the repository root: the directory above the working
// directory that holds test/test.mk.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "test", "test.mk")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no directory above the working directory holds test/test.mk")
		}
		dir = parent
	}
}

// builtOnce is a command built once per test binary.
type builtOnce struct {
	once sync.Once
	bin  string
	err  error
}

// get builds the command pkg of the Go module in dir (relative to the
// repository) as name, the first time, and returns its path.
func (b *builtOnce) get(t testing.TB, dir, pkg, name string) string {
	t.Helper()
	root := RepoRoot(t)
	b.once.Do(func() {
		tmp, err := os.MkdirTemp("", name+"-bin-")
		if err != nil {
			b.err = err
			return
		}
		b.bin = filepath.Join(tmp, name)
		cmd := exec.Command("go", "build", "-o", b.bin, pkg)
		cmd.Dir = filepath.Join(root, dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build %s: %w\n%s", name, err, out)
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.bin
}

var extenderBin, schedulerBin builtOnce

// ExtenderBinary builds cmd/tessera-extender once per test binary and
// returns its path.
func ExtenderBinary(t testing.TB) string {
	t.Helper()
	return extenderBin.get(t, ".", "./cmd/tessera-extender", "tessera-extender")
}

// SchedulerBinary builds tessera-scheduler (cmd/tessera-scheduler of the
// scheduler/ module: kube-scheduler with Tessera's plugin) once per test
// binary and returns its path.
func SchedulerBinary(t testing.TB) string {
	t.Helper()
	return schedulerBin.get(t, "scheduler", "./cmd/tessera-scheduler", "tessera-scheduler")
}

// FreeAddr returns a loopback address with a port free at the time.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := freeport.Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// Extender is tessera-extender running as its own process. Its log (all
// starts appended) is LogPath.
//
// With Options.InProcess it is the extender inside tessera-scheduler:
// Start, Stop and Kill start and stop the scheduler through the control
// plane, and the log is the scheduler's (one file per start; LogPath is
// the latest, Log and LogTail read them all).
type Extender struct {
	t          testing.TB
	bin        string
	kubeconfig string
	addr       string
	logPath    string
	args       []string
	mu         sync.Mutex
	cmd        *exec.Cmd
	done       chan struct{}
	starts     int

	// In process: the control plane runs the scheduler with sched.
	cp       *controlplane.ControlPlane
	sched    *controlplane.SchedulerOptions
	logPaths []string
	running  bool
}

// InProcess reports whether the extender runs inside tessera-scheduler.
func (x *Extender) InProcess() bool { return x.sched != nil }

// Addr is the extender's host:port.
func (x *Extender) Addr() string { return x.addr }

// LogPath is the extender's log file: in process, the log of the
// scheduler's latest start.
func (x *Extender) LogPath() string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.logPath
}

// Start starts the process and waits until /readyz answers 200 (its
// caches synced). Start after Stop or Kill restarts it on the same address.
func (x *Extender) Start(ctx context.Context) {
	x.t.Helper()
	if x.InProcess() {
		x.startScheduler(ctx)
		return
	}
	x.mu.Lock()
	x.starts++
	logf, err := os.OpenFile(x.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		x.mu.Unlock()
		x.t.Fatal(err)
	}
	fmt.Fprintf(logf, "==== start %d at %s\n", x.starts, time.Now().Format(time.RFC3339Nano))
	args := append([]string{"--kubeconfig=" + x.kubeconfig, "--listen=" + x.addr, "--policy=binpack", "--v=2"}, x.args...)
	cmd := exec.Command(x.bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		x.mu.Unlock()
		logf.Close()
		x.t.Fatalf("start extender: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logf.Close(); close(done) }()
	x.cmd, x.done = cmd, done
	x.mu.Unlock()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		select {
		case <-done:
			return false, errors.New("extender exited")
		default:
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+x.addr+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		x.t.Fatalf("extender not ready: %v\n%s", err, x.LogTail())
	}
}

// startScheduler starts tessera-scheduler and waits until the extender in
// it answers /readyz with 200 (its caches synced).
func (x *Extender) startScheduler(ctx context.Context) {
	x.t.Helper()
	if err := x.cp.StartScheduler(ctx, *x.sched); err != nil {
		x.t.Fatalf("start tessera-scheduler: %v", err)
	}
	x.mu.Lock()
	x.starts++
	x.running = true
	for name, path := range x.cp.LogFiles() {
		if strings.HasPrefix(name, "kube-scheduler") {
			x.logPath = path
			x.logPaths = append(x.logPaths, path)
		}
	}
	x.mu.Unlock()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		return readyz(ctx, x.addr), nil
	})
	if err != nil {
		x.t.Fatalf("the extender in tessera-scheduler is not ready: %v\n%s", err, x.LogTail())
	}
}

func readyz(ctx context.Context, addr string) bool {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// stopScheduler stops tessera-scheduler (SIGTERM to its process group,
// SIGKILL after the control plane's grace period).
func (x *Extender) stopScheduler() {
	x.mu.Lock()
	running := x.running
	x.running = false
	x.mu.Unlock()
	if !running {
		return
	}
	if err := x.cp.StopScheduler(); err != nil {
		x.t.Logf("stop tessera-scheduler: %v", err)
	}
}

// Kill sends SIGKILL: no graceful shutdown, what is in memory is lost. In
// process it stops the scheduler as Stop does (the control plane sends
// SIGTERM first); its in-memory state is lost either way.
func (x *Extender) Kill() {
	if x.InProcess() {
		x.stopScheduler()
		return
	}
	x.mu.Lock()
	cmd, done := x.cmd, x.done
	x.cmd = nil
	x.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Stop sends SIGTERM and waits (SIGKILL after 15s).
func (x *Extender) Stop() {
	if x.InProcess() {
		x.stopScheduler()
		return
	}
	x.mu.Lock()
	cmd, done := x.cmd, x.done
	x.cmd = nil
	x.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// LogTail is the last 32 KiB of the extender's log.
func (x *Extender) LogTail() string {
	b := x.read()
	if len(b) > 32<<10 {
		b = b[len(b)-32<<10:]
	}
	return string(b)
}

// Log is the extender's whole log.
func (x *Extender) Log() string { return string(x.read()) }

// read returns the log: in process, the scheduler's logs of every start
// in order.
func (x *Extender) read() []byte {
	x.mu.Lock()
	paths := []string{x.logPath}
	if x.InProcess() {
		paths = slices.Clone(x.logPaths)
	}
	x.mu.Unlock()
	var out []byte
	for _, p := range paths {
		b, _ := os.ReadFile(p)
		out = append(out, b...)
	}
	return out
}
