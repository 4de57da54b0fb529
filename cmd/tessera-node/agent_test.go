package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
)

func TestAgentCommand(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		runs bool
	}{
		{"agent", true},
		{"--nvml=mock:dgx-a100", true},
		{"-device-plugin-dir", true},
		{"-h", false},
		{"--help", false},
		{"help", false},
		{"topology", false},
		{"agnt", false},
	} {
		if got := agentCommand(tc.arg) == tc.arg; got != tc.runs {
			t.Errorf("agentCommand(%q) selects the agent: %v, want %v", tc.arg, got, tc.runs)
		}
	}
}

func TestParseAgentArgs(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "cfg.yaml")
	if err := os.WriteFile(cfgFile, []byte("apiVersion: tessera.dev/v1alpha1\nkind: NodeAgentConfig\nmemoryUnitMiB: 512\nmemoryReserveMiB: 100\ndeviceListStrategy: [envvar]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, cfg, err := parseAgentArgs([]string{"--config", cfgFile, "--memory-reserve-mib=2048", "--ignore-xids=13,79", "--resources", "tessera.dev/gpu, tessera.dev/gpu-core", "--device-plugin-dir", dir, "--health-check-interval=5s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if f.pluginDir != dir {
		t.Errorf("plugin dir %q", f.pluginDir)
	}
	want := api.NewNodeAgentConfig()
	want.MemoryUnitMiB = 512                                 // from the file
	want.MemoryReserveMiB = 2048                             // the flag overrides the file
	want.DeviceListStrategy = []string{api.DeviceListEnvvar} // from the file
	want.IgnoredXIDs = []uint64{13, 79}
	want.Resources = []corev1.ResourceName{api.ResourceGPU, api.ResourceGPUCore}
	want.HealthCheckInterval.Duration = 5 * time.Second
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	_, cfg, err = parseAgentArgs([]string{"--ignore-xids=none"}, io.Discard)
	if err != nil || len(cfg.IgnoredXIDs) != 0 || cfg.IgnoredXIDs == nil {
		t.Errorf("--ignore-xids=none = %v, %v; want an empty list", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--ignore-xids=13,x"}, `--ignore-xids: "x" is not an XID number`},
		{[]string{"--resources=nvidia.com/gpu"}, "nvidia.com/gpu"},
		{[]string{"--resources= "}, "at least one resource"},
		{[]string{"--device-list-strategy=envvar,volume-mounts"}, "choose one"},
		{[]string{"--config", filepath.Join(dir, "absent.yaml")}, "reading --config"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
	} {
		if _, _, err := parseAgentArgs(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseAgentArgs(%v) = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// registrar records registrations on kubelet.sock in a directory.
type registrar struct {
	pluginapi.UnimplementedRegistrationServer
	mu  sync.Mutex
	got []string
}

func (r *registrar) Register(_ context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, req.ResourceName+" "+req.Endpoint)
	return &pluginapi.Empty{}, nil
}

func (r *registrar) registrations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]string(nil), r.got...)
	sort.Strings(out)
	return out
}

func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	return lis.Addr().String()
}

// The command line of the "must show": a mock dgx-a100 registers
// with whatever kubelet listens in the directory, with no API server.
func TestRunAgentRegistersWithTheKubelet(t *testing.T) {
	dir, err := os.MkdirTemp("", "tn")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	reg := &registrar{}
	srv := grpc.NewServer()
	pluginapi.RegisterRegistrationServer(srv, reg)
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	defer srv.Stop()

	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nvml=mock:dgx-a100", "--device-plugin-dir", dir, "--node-name", "n1", "--metrics-addr", addr,
			"--pod-resources-socket", filepath.Join(dir, "no-pod-resources.sock"),
			// No runtime listens there: the NRI plugin keeps retrying.
			"--nri-socket", filepath.Join(dir, "nri.sock"), "--state-dir", filepath.Join(dir, "state"),
			// No CDI spec names the mock GPUs here (the real node's test has one).
			"--cdi-spec-dirs="}, &stdout, &stderr)
	}()
	want := []string{
		"tessera.dev/gpu tessera-gpu.sock",
		"tessera.dev/gpu-core tessera-gpu-core.sock",
		"tessera.dev/gpu-memory tessera-gpu-memory.sock",
	}
	deadline := time.Now().Add(30 * time.Second)
	for !cmp.Equal(want, reg.registrations()) {
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("registrations (-want +got):\n%s", cmp.Diff(want, reg.registrations()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `tessera_node_devices{resource="tessera.dev/gpu",state="healthy"} 8`) {
		t.Errorf("/metrics lacks the 8 healthy GPUs:\n%s", body)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run = %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("run did not stop")
	}
}

// TestAPIServerConfig checks when the agent talks to an API server; the
// kubeconfig format itself is internal/kubeclient's (client-go's clientcmd).
func TestAPIServerConfig(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
current-context: c
contexts: [{name: c, context: {cluster: k, user: u}}]
clusters: [{name: k, cluster: {server: "https://10.0.0.1:6443"}}]
users: [{name: u, user: {token: secret}}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := apiServerConfig(kubeconfig, "n1")
	if err != nil || cfg == nil || cfg.Host != "https://10.0.0.1:6443" || cfg.BearerToken != "secret" {
		t.Errorf("apiServerConfig(kubeconfig, n1) = %+v, %v", cfg, err)
	}
	if _, err := apiServerConfig(kubeconfig, ""); err == nil || !strings.Contains(err.Error(), "--node-name") {
		t.Errorf("--kubeconfig without a node name = %v", err)
	}
	if _, err := apiServerConfig(filepath.Join(t.TempDir(), "absent"), "n1"); err == nil {
		t.Error("a missing kubeconfig was accepted")
	}
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if cfg, err := apiServerConfig("", "n1"); cfg != nil || err != nil {
		t.Errorf("no kubeconfig outside a pod = %v, %v; want no API server", cfg, err)
	}
	if cfg, err := apiServerConfig("", ""); cfg != nil || err != nil {
		t.Errorf("no kubeconfig and no node name = %v, %v; want no API server", cfg, err)
	}
}

// readManifests decodes the objects of a multi-document YAML file.
func readManifests(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, d := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, []byte(d))
		}
	}
	return docs
}

func TestDeployManifests(t *testing.T) {
	const deploy = "../../deploy/node/"
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(readManifests(t, deploy+"daemonset.yaml")[0], &ds); err != nil {
		t.Fatalf("daemonset.yaml: %v", err)
	}
	spec := ds.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		t.Fatalf("%d containers", len(spec.Containers))
	}
	c := spec.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != agentCommandName {
		t.Fatalf("args %v do not start the agent", c.Args)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(readManifests(t, deploy+"configmap.yaml")[0], &cm); err != nil {
		t.Fatal(err)
	}
	// The args with the ConfigMap's file where the pod mounts it.
	local := filepath.Join(t.TempDir(), "config.yaml")
	var configPath string
	args := append([]string(nil), c.Args[1:]...)
	for i, a := range args {
		if p, ok := strings.CutPrefix(a, "--config="); ok {
			configPath, args[i] = p, "--config="+local
		}
	}
	data, ok := cm.Data[filepath.Base(configPath)]
	if !ok {
		t.Fatalf("the ConfigMap has no %s for --config=%s", filepath.Base(configPath), configPath)
	}
	if err := os.WriteFile(local, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	f, _, err := parseAgentArgs(args, io.Discard)
	if err != nil {
		t.Fatalf("the DaemonSet's args with its ConfigMap do not parse: %v", err)
	}
	// Every path the agent uses is mounted from the host.
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for _, p := range []string{f.pluginDir, filepath.Dir(f.podResourcesSocket)} {
		if hostPaths[mounts[p]] != p {
			t.Errorf("%s is not mounted from the host's %s", p, p)
		}
	}
	if _, ok := mounts[filepath.Dir(configPath)]; !ok {
		t.Errorf("--config %s is not mounted", configPath)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
		t.Errorf("no resource requests: %v", c.Resources)
	}
	if len(spec.NodeSelector) == 0 || len(spec.Tolerations) == 0 {
		t.Errorf("nodeSelector %v, tolerations %v", spec.NodeSelector, spec.Tolerations)
	}
	if c.SecurityContext == nil || c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged {
		t.Errorf("the agent runs privileged: %v", c.SecurityContext)
	}
	nodeName := false
	for _, e := range c.Env {
		nodeName = nodeName || e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName"
	}
	if !nodeName {
		t.Error("NODE_NAME is not set from spec.nodeName")
	}

	var sa corev1.ServiceAccount
	if err := yaml.UnmarshalStrict(readManifests(t, deploy+"serviceaccount.yaml")[0], &sa); err != nil {
		t.Fatal(err)
	}
	if spec.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
		t.Errorf("DaemonSet runs as %s/%s, the ServiceAccount is %s/%s", ds.Namespace, spec.ServiceAccountName, sa.Namespace, sa.Name)
	}
	docs := readManifests(t, deploy+"rbac.yaml")
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	if err := yaml.UnmarshalStrict(docs[0], &role); err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(docs[1], &binding); err != nil {
		t.Fatal(err)
	}
	// Least rights: exactly what package kube calls, and the Events its
	// recorder (client-go's, core/v1) creates and patches (a repeated Event
	// is patched to count up).
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("ClusterRole rules (-want +got):\n%s", diff)
	}
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != sa.Namespace {
		t.Errorf("binding %+v does not bind %s to %s/%s", binding, role.Name, sa.Namespace, sa.Name)
	}
}
