package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/freeport"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

const (
	// deployURL is the urlPrefix of deploy/extender/scheduler-config.yaml;
	// the benchmark replaces it with the address of the extender it runs.
	deployURL = "http://tessera-extender.kube-system.svc:8888"
	// extenderUser is the identity the extender runs as, bound to the
	// ClusterRole of deploy/extender/rbac.yaml.
	extenderUser = "tessera-extender"
)

// buildExtender builds cmd/tessera-extender in the main module into dir.
func buildExtender(ctx context.Context, repo, dir string) (string, error) {
	bin := filepath.Join(dir, "tessera-extender")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/tessera-extender")
	cmd.Dir = repo
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tessera-extender: %w\n%s", err, out)
	}
	return bin, nil
}

// buildScheduler builds tessera-scheduler (the scheduler/ module:
// kube-scheduler with Tessera's plugin) into dir.
func buildScheduler(ctx context.Context, repo, dir string) (string, error) {
	bin := filepath.Join(dir, "tessera-scheduler")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/tessera-scheduler")
	cmd.Dir = filepath.Join(repo, "scheduler")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build tessera-scheduler: %w\n%s", err, out)
	}
	return bin, nil
}

// pluginConfig writes deploy/scheduler/scheduler-config.yaml (the
// configuration of tessera-scheduler) into dir with flags as the Tessera
// plugin's args in every profile (install.PluginSchedulerConfig).
func pluginConfig(repo, dir string, flags []string) (string, error) {
	path := filepath.Join(dir, "scheduler-plugin.yaml")
	if err := install.PluginSchedulerConfig(repo, path, flags); err != nil {
		return "", err
	}
	return path, nil
}

// extenderArgs are the flags the benchmark runs the extender with, alone
// or in tessera-scheduler, before the --extender-flag ones.
func extenderArgs(kubeconfig, addr string) []string {
	return []string{"--kubeconfig=" + kubeconfig, "--listen=" + addr, "--policy=binpack", "--v=1"}
}

// readDeploy reads the YAML document of kind from a deploy/extender file.
func readDeploy(repo, file, kind string, into any) error {
	raw, err := os.ReadFile(filepath.Join(repo, "deploy", "extender", file))
	if err != nil {
		return fmt.Errorf("read deploy file: %w", err)
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if meta.Kind == kind {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				return fmt.Errorf("%s %s: %w", file, kind, err)
			}
			return nil
		}
	}
	return fmt.Errorf("%s has no %s", file, kind)
}

// setupExtenderAccess creates deploy/'s ClusterRole and seal-key Role
// bound to user and writes a kubeconfig for it into dir.
func setupExtenderAccess(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, user *controlplane.User, repo, dir string) (string, error) {
	var role rbacv1.ClusterRole
	if err := readDeploy(repo, "rbac.yaml", "ClusterRole", &role); err != nil {
		return "", err
	}
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create ClusterRole: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-extender-bench"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: user.Name}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return "", fmt.Errorf("create ClusterRoleBinding: %w", err)
	}
	// The extender reads (or creates) its seal key before it serves.
	if err := setupSealKeyAccess(ctx, client, repo, user.Name); err != nil {
		return "", err
	}
	kubeconfig := filepath.Join(dir, "extender.kubeconfig")
	kc := clientcmdapi.NewConfig()
	kc.Clusters["bench"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.CAFile()}
	kc.AuthInfos[user.Name] = &clientcmdapi.AuthInfo{Token: user.Token}
	kc.Contexts["bench"] = &clientcmdapi.Context{Cluster: "bench", AuthInfo: user.Name}
	kc.CurrentContext = "bench"
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", fmt.Errorf("write extender kubeconfig: %w", err)
	}
	return kubeconfig, nil
}

// schedulerConfigs writes deploy/'s KubeSchedulerConfiguration pointed at
// extenderAddr (with) and the same file without its extenders (without).
func schedulerConfigs(repo, dir, extenderAddr string) (with, without string, err error) {
	raw, err := os.ReadFile(filepath.Join(repo, "deploy", "extender", "scheduler-config.yaml"))
	if err != nil {
		return "", "", fmt.Errorf("read scheduler config: %w", err)
	}
	if !bytes.Contains(raw, []byte(deployURL)) {
		return "", "", fmt.Errorf("scheduler-config.yaml does not use %s", deployURL)
	}
	with = filepath.Join(dir, "scheduler-with-extender.yaml")
	if err := os.WriteFile(with, bytes.ReplaceAll(raw, []byte(deployURL), []byte("http://"+extenderAddr)), 0o600); err != nil {
		return "", "", fmt.Errorf("write scheduler config: %w", err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return "", "", fmt.Errorf("parse scheduler config: %w", err)
	}
	if _, ok := cfg["extenders"]; !ok {
		return "", "", errors.New("scheduler-config.yaml has no extenders")
	}
	delete(cfg, "extenders")
	out, err := yaml.Marshal(cfg)
	if err != nil {
		return "", "", fmt.Errorf("marshal scheduler config: %w", err)
	}
	without = filepath.Join(dir, "scheduler-without-extender.yaml")
	if err := os.WriteFile(without, out, 0o600); err != nil {
		return "", "", fmt.Errorf("write scheduler config: %w", err)
	}
	return with, without, nil
}

func freeAddr() (string, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return "", fmt.Errorf("pick a free port: %w", err)
	}
	return addr, nil
}

// extenderProc is tessera-extender running as its own process.
type extenderProc struct {
	addr    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
}

// startExtender runs bin with deploy's flags and extra, and waits (at most
// timeout) for its /readyz.
func startExtender(ctx context.Context, bin, kubeconfig, addr, logPath string, extra []string, timeout time.Duration) (*extenderProc, error) {
	args := append(extenderArgs(kubeconfig, addr), extra...)
	e, err := startProc(ctx, bin, args, nil, logPath, "http://"+addr+"/readyz", timeout)
	if err != nil {
		return nil, fmt.Errorf("extender: %w", err)
	}
	e.addr = addr
	return e, nil
}

// metrics returns the extender's /metrics text.
func (e *extenderProc) metrics(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.addr+"/metrics", nil)
	if err != nil {
		return nil, fmt.Errorf("metrics request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", resp.Status)
	}
	return body, nil
}

// stop sends SIGTERM, then SIGKILL after 15s, and waits for the exit.
func (e *extenderProc) stop() {
	if e == nil {
		return
	}
	select {
	case <-e.done:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(15 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 8<<10 {
		b = b[len(b)-8<<10:]
	}
	return string(b)
}

// waitReady polls url until it answers 200, for at most timeout.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("readiness request: %w", err)
		}
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s", url, timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
