// Package controlplane runs a real Kubernetes control plane for tests: etcd,
// kube-apiserver and, optionally, kube-scheduler as child processes on
// loopback, each with its own data and log files in a temporary directory.
//
// Nothing here is faked: the binaries are the ones built from
// k8s.io/kubernetes by `make k8s-bins` (see test/test.mk) and etcd is
// Debian's etcd-server. kube-controller-manager runs only when started
// (StartControllerManager; the local clusters do); there is no kubelet: see
// CreateReadyNode for what that means for Nodes.
package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework/freeport"
)

const (
	// AdminUser is the identity of Client(): a member of system:masters.
	AdminUser = "tessera-test-admin"
	// SchedulerUser is the identity kube-scheduler runs as; the API server's
	// bootstrap RBAC policy grants it the usual scheduler permissions.
	SchedulerUser = "system:kube-scheduler"
	// ControllerManagerUser is the identity kube-controller-manager runs
	// as; with --use-service-account-credentials each controller then acts
	// as its own ServiceAccount in kube-system (the API server's bootstrap
	// RBAC policy), as in a kubeadm cluster.
	ControllerManagerUser = "system:kube-controller-manager"

	defaultStartTimeout = 90 * time.Second
	stopGracePeriod     = 10 * time.Second
)

// Options configure Start. Only Binaries is required.
type Options struct {
	Binaries Binaries
	// BaseDir is where the control plane's temporary directory is created
	// (data, certificates, configuration and logs). Empty: os.TempDir().
	BaseDir string
	// Scheduler, when set, makes Start also run kube-scheduler.
	Scheduler *SchedulerOptions
	// Users are extra identities that get a static bearer token (Token is
	// filled in by Start); use RESTConfigFor to act as them. Their
	// permissions come from RBAC objects the test creates, or from Groups
	// (e.g. system:masters).
	Users []*User
	// EtcdArgs and APIServerArgs are appended to the flags Start passes.
	EtcdArgs      []string
	APIServerArgs []string
	// StartTimeout bounds the wait for each component to become ready.
	// Zero: 90s.
	StartTimeout time.Duration
}

// SchedulerOptions configure kube-scheduler.
type SchedulerOptions struct {
	// ConfigFile is a KubeSchedulerConfiguration (YAML). Start fills in
	// clientConnection.kubeconfig and turns leader election off unless the
	// file sets them. Empty: the default configuration.
	ConfigFile string
	// Args are appended to the flags the harness passes.
	Args []string
	// Binary runs instead of Options.Binaries.Scheduler: a kube-scheduler
	// built with plugins (tessera-scheduler). Empty: kube-scheduler.
	Binary string
}

// ControlPlane is a running etcd + kube-apiserver (+ kube-scheduler).
type ControlPlane struct {
	opts       Options
	dir        string
	ownsDir    bool
	timeout    time.Duration
	admin      *User
	schedUser  *User
	kcmUser    *User
	caFile     string
	kubeconfig string

	// EtcdURL is the client URL of etcd (http://127.0.0.1:port).
	EtcdURL string
	// APIServerURL is https://127.0.0.1:port.
	APIServerURL string

	restConfig *rest.Config
	client     kubernetes.Interface

	mu        sync.Mutex
	etcd      *process
	apiserver *process
	scheduler *process
	// controllerManager: StartControllerManager's.
	controllerManager *process
	schedDir          int // counts scheduler starts, for distinct log files
	stopped           bool
}

// Start runs etcd and kube-apiserver (and kube-scheduler when
// opts.Scheduler is set) and waits until each reports ready. On error,
// everything already started is stopped again. The caller must call Stop.
//
// Ports are picked free just before each process starts; should another
// process grab one in between ("address already in use" in a log), Start
// tries again from scratch, at most three times in all.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	if err := opts.Binaries.validate(opts.Scheduler != nil); err != nil {
		return nil, err
	}
	const attempts = 3
	for i := 1; ; i++ {
		cp, err := startOnce(ctx, opts)
		if err == nil || i == attempts || !strings.Contains(err.Error(), "address already in use") || ctx.Err() != nil {
			return cp, err
		}
		klog.InfoS("Control plane port was taken, starting again", "attempt", i, "err", err)
	}
}

func startOnce(ctx context.Context, opts Options) (*ControlPlane, error) {
	dir, err := os.MkdirTemp(opts.BaseDir, "tessera-controlplane-")
	if err != nil {
		return nil, fmt.Errorf("create control plane directory: %w", err)
	}
	cp := &ControlPlane{opts: opts, dir: dir, ownsDir: true, timeout: opts.StartTimeout}
	if cp.timeout <= 0 {
		cp.timeout = defaultStartTimeout
	}
	if err := cp.start(ctx); err != nil {
		logs := cp.logTails(16 << 10)
		if stopErr := cp.Stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		return nil, fmt.Errorf("start control plane: %w\n%s", err, logs)
	}
	return cp, nil
}

func (cp *ControlPlane) start(ctx context.Context) error {
	started := time.Now()
	if err := cp.startEtcd(ctx); err != nil {
		return err
	}
	if err := cp.startAPIServer(ctx); err != nil {
		return err
	}
	if err := cp.EnsureNamespace(ctx, "default"); err != nil {
		return err
	}
	if cp.opts.Scheduler != nil {
		if err := cp.StartScheduler(ctx, *cp.opts.Scheduler); err != nil {
			return err
		}
	}
	klog.InfoS("Control plane ready", "apiserver", cp.APIServerURL, "etcd", cp.EtcdURL,
		"scheduler", cp.opts.Scheduler != nil, "dir", cp.dir, "took", time.Since(started).Round(time.Millisecond))
	return nil
}

func (cp *ControlPlane) startEtcd(ctx context.Context) error {
	ports, err := freeport.Ports(2)
	if err != nil {
		return err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	args := []string{
		"--name=default",
		"--data-dir=" + filepath.Join(cp.dir, "etcd-data"),
		"--listen-client-urls=" + client,
		"--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer,
		"--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=default=" + peer,
		"--initial-cluster-state=new",
		"--logger=zap",
		"--log-outputs=stderr",
	}
	args = append(args, cp.opts.EtcdArgs...)
	p, err := startProcess("etcd", cp.opts.Binaries.Etcd, args, cp.dir)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.etcd = p
	cp.EtcdURL = client
	cp.mu.Unlock()

	hc := &http.Client{Timeout: 5 * time.Second}
	return p.waitFor(ctx, "etcd /health", cp.timeout, func(ctx context.Context) error {
		return httpGetOK(ctx, hc, client+"/health", "")
	})
}

func (cp *ControlPlane) startAPIServer(ctx context.Context) error {
	certDir := filepath.Join(cp.dir, "apiserver-certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return fmt.Errorf("create apiserver cert dir: %w", err)
	}
	saKey, saPub, err := writeServiceAccountKey(cp.dir)
	if err != nil {
		return err
	}
	cp.admin = &User{Name: AdminUser, Groups: []string{"system:masters"}}
	cp.schedUser = &User{Name: SchedulerUser}
	cp.kcmUser = &User{Name: ControllerManagerUser}
	users := append([]*User{cp.admin, cp.schedUser, cp.kcmUser}, cp.opts.Users...)
	for _, u := range users {
		if u.Token, err = randomToken(); err != nil {
			return err
		}
	}
	tokenFile := filepath.Join(cp.dir, "tokens.csv")
	if err := writeTokenFile(tokenFile, users); err != nil {
		return err
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		return err
	}
	cp.APIServerURL = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	// kube-apiserver writes a self-signed serving certificate (and the CA
	// that signed it) to --cert-dir; clients trust that bundle.
	cp.caFile = filepath.Join(certDir, "apiserver.crt")

	args := []string{
		"--etcd-servers=" + cp.EtcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokenFile,
		"--anonymous-auth=false",
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.96.0.0/24",
		"--allow-privileged=true",
		// Real test nodes (framework/realnode) have names no DNS resolves:
		// logs and exec reach their kubelet at its InternalIP.
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		"--v=1",
	}
	args = append(args, cp.opts.APIServerArgs...)
	p, err := startProcess("kube-apiserver", cp.opts.Binaries.APIServer, args, cp.dir)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.apiserver = p
	cp.mu.Unlock()

	cp.restConfig = cp.RESTConfigFor(cp.admin)
	cp.kubeconfig = filepath.Join(cp.dir, "admin.kubeconfig")
	if err := writeKubeconfig(cp.kubeconfig, cp.APIServerURL, cp.caFile, AdminUser, cp.admin.Token); err != nil {
		return err
	}
	// The CA file appears once the server has generated its certificate,
	// so the readiness check uses its own insecure client; later clients
	// verify the server against the CA.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // readiness probe only
	}}
	if err := p.waitFor(ctx, "kube-apiserver /readyz", cp.timeout, func(ctx context.Context) error {
		return httpGetOK(ctx, hc, cp.APIServerURL+"/readyz", cp.admin.Token)
	}); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cp.restConfig)
	if err != nil {
		return fmt.Errorf("create clientset: %w", err)
	}
	cp.client = cs
	// Prove the CA bundle works before anybody relies on it.
	if _, err := cs.Discovery().ServerVersion(); err != nil {
		return fmt.Errorf("query server version with CA %s: %w", cp.caFile, err)
	}
	return nil
}

// StartScheduler runs kube-scheduler (as SchedulerUser) with o and waits
// for its /readyz. It fails when a scheduler started by this control plane
// is still running.
func (cp *ControlPlane) StartScheduler(ctx context.Context, o SchedulerOptions) error {
	if err := cp.opts.Binaries.validate(true); err != nil {
		return err
	}
	cp.mu.Lock()
	if cp.scheduler != nil && !cp.scheduler.exited() {
		cp.mu.Unlock()
		return errors.New("kube-scheduler is already running")
	}
	cp.schedDir++
	n := cp.schedDir
	cp.mu.Unlock()

	dir := filepath.Join(cp.dir, "scheduler-"+strconv.Itoa(n))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create scheduler dir: %w", err)
	}
	kubeconfig := filepath.Join(dir, "scheduler.kubeconfig")
	if err := writeKubeconfig(kubeconfig, cp.APIServerURL, cp.caFile, SchedulerUser, cp.schedUser.Token); err != nil {
		return err
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := writeSchedulerConfig(o.ConfigFile, cfgPath, kubeconfig); err != nil {
		return err
	}
	ports, err := freeport.Ports(1)
	if err != nil {
		return err
	}
	args := []string{
		"--config=" + cfgPath,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(ports[0]),
		"--cert-dir=" + filepath.Join(dir, "certs"),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--v=2",
	}
	args = append(args, o.Args...)
	name := "kube-scheduler"
	if n > 1 {
		name += "-" + strconv.Itoa(n)
	}
	bin := cp.opts.Binaries.Scheduler
	if o.Binary != "" {
		bin = o.Binary
	}
	p, err := startProcess(name, bin, args, cp.dir)
	if err != nil {
		return err
	}
	cp.mu.Lock()
	cp.scheduler = p
	cp.mu.Unlock()

	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // readiness probe of a self-signed loopback server
	}}
	url := "https://127.0.0.1:" + strconv.Itoa(ports[0]) + "/readyz"
	return p.waitFor(ctx, "kube-scheduler /readyz", cp.timeout, func(ctx context.Context) error {
		return httpGetOK(ctx, hc, url, "")
	})
}

// StopScheduler stops the running kube-scheduler, if any.
func (cp *ControlPlane) StopScheduler() error {
	cp.mu.Lock()
	p := cp.scheduler
	cp.scheduler = nil
	cp.mu.Unlock()
	return p.stop(stopGracePeriod)
}

// writeSchedulerConfig copies the KubeSchedulerConfiguration from src (or a
// minimal one) to dst, pointing clientConnection.kubeconfig at kubeconfig
// and disabling leader election unless src sets them.
func writeSchedulerConfig(src, dst, kubeconfig string) error {
	cfg := map[string]any{
		"apiVersion": "kubescheduler.config.k8s.io/v1",
		"kind":       "KubeSchedulerConfiguration",
	}
	if src != "" {
		raw, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("read scheduler config: %w", err)
		}
		cfg = map[string]any{}
		if err := yaml.Unmarshal(raw, &cfg); err != nil {
			return fmt.Errorf("parse scheduler config %s: %w", src, err)
		}
	}
	setDefault := func(section, key string, value any) error {
		m, ok := cfg[section].(map[string]any)
		if cfg[section] != nil && !ok {
			return fmt.Errorf("scheduler config %s: %s is not a mapping", src, section)
		}
		if m == nil {
			m = map[string]any{}
			cfg[section] = m
		}
		if _, set := m[key]; !set {
			m[key] = value
		}
		return nil
	}
	if err := setDefault("clientConnection", "kubeconfig", kubeconfig); err != nil {
		return err
	}
	if err := setDefault("leaderElection", "leaderElect", false); err != nil {
		return err
	}
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("marshal scheduler config: %w", err)
	}
	if err := os.WriteFile(dst, out, 0o600); err != nil {
		return fmt.Errorf("write scheduler config: %w", err)
	}
	return nil
}

func httpGetOK(ctx context.Context, hc *http.Client, url, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("build request for %s: %w", url, err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, body)
	}
	return nil
}

// Dir is the control plane's working directory (data, certs, logs).
func (cp *ControlPlane) Dir() string { return cp.dir }

// KubeconfigPath is a kubeconfig file for the admin user.
func (cp *ControlPlane) KubeconfigPath() string { return cp.kubeconfig }

// CAFile is the CA bundle that verifies the API server.
func (cp *ControlPlane) CAFile() string { return cp.caFile }

// RESTConfig returns a copy of the admin (system:masters) client config.
func (cp *ControlPlane) RESTConfig() *rest.Config { return rest.CopyConfig(cp.restConfig) }

// Client is an admin clientset.
func (cp *ControlPlane) Client() kubernetes.Interface { return cp.client }

// RESTConfigFor returns a client config that authenticates as u, one of
// Options.Users (or the admin).
func (cp *ControlPlane) RESTConfigFor(u *User) *rest.Config {
	return &rest.Config{
		Host:            cp.APIServerURL,
		BearerToken:     u.Token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: cp.caFile},
		QPS:             100,
		Burst:           200,
		Timeout:         30 * time.Second,
	}
}

// LogFiles maps each started component to its log file.
func (cp *ControlPlane) LogFiles() map[string]string {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	out := map[string]string{}
	for _, p := range []*process{cp.etcd, cp.apiserver, cp.scheduler, cp.controllerManager} {
		if p != nil {
			out[p.name] = p.logPath
		}
	}
	return out
}

// logTails returns the last maxBytes of every log file in the directory.
func (cp *ControlPlane) logTails(maxBytes int64) string {
	logs, _ := filepath.Glob(filepath.Join(cp.dir, "*.log"))
	var out string
	for _, l := range logs {
		out += fmt.Sprintf("===== %s =====\n%s\n", filepath.Base(l), fileTail(l, maxBytes))
	}
	return out
}

// Stop stops kube-controller-manager, kube-scheduler, kube-apiserver and
// etcd (in that order), waiting for each to exit, and removes the working
// directory. It is safe to call more than once.
func (cp *ControlPlane) Stop() error {
	cp.mu.Lock()
	if cp.stopped {
		cp.mu.Unlock()
		return nil
	}
	cp.stopped = true
	procs := []*process{cp.controllerManager, cp.scheduler, cp.apiserver, cp.etcd}
	cp.mu.Unlock()

	var errs []error
	for _, p := range procs {
		if err := p.stop(stopGracePeriod); err != nil {
			errs = append(errs, err)
		}
	}
	if cp.ownsDir {
		if err := os.RemoveAll(cp.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", cp.dir, err))
		}
	}
	klog.V(2).InfoS("Control plane stopped", "dir", cp.dir)
	return errors.Join(errs...)
}
