package chart

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
	"github.com/tessera-gpu/tessera/test/framework/freeport"
)

// envScheduler names a tessera-scheduler binary (make scheduler's
// bin/tessera-scheduler) for the mode plugin test; unset, the test builds
// it from scheduler/ (go build, cached after the first).
const envScheduler = "TESSERA_TEST_TESSERA_SCHEDULER"

// checkPluginWiring checks how mode plugin's objects fit together: the
// tessera-scheduler Deployment runs Tessera's image as the extender's
// ServiceAccount with the ConfigMap's configuration; the Tessera plugin's
// flags are the same in every profile, hold no --v, listen on the port the
// Service tessera-extender targets (which selects the Deployment's pods) and
// read the certificate from the mounted Secret; kube-scheduler's RBAC is
// bound to the extender's ServiceAccount; and the profile's plugins are
// those of deploy/scheduler/scheduler-config.yaml.
func checkPluginWiring(t *testing.T, repo string, v variant, objs []*unstructured.Unstructured) {
	t.Helper()
	fail := func(format string, args ...any) { t.Errorf(v.name+": "+format, args...) }
	dep := find(objs, "Deployment", releaseNS, "tessera-scheduler")
	svc := find(objs, "Service", releaseNS, "tessera-extender")
	ds := find(objs, "DaemonSet", releaseNS, "tessera-node")
	if dep == nil || svc == nil || ds == nil {
		fail("no Deployment tessera-scheduler, Service tessera-extender or DaemonSet tessera-node")
		return
	}
	podSpec, _, _ := unstructured.NestedMap(dep.Object, "spec", "template", "spec")
	if sa := podSpec["serviceAccountName"]; sa != "tessera-extender" {
		fail("tessera-scheduler runs as ServiceAccount %v, want tessera-extender (the identity the admission policy exempts)", sa)
	}
	containers, _ := podSpec["containers"].([]any)
	nodeContainers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	if len(containers) != 1 || len(nodeContainers) == 0 {
		fail("%d containers in tessera-scheduler, %d in tessera-node", len(containers), len(nodeContainers))
		return
	}
	c := containers[0].(map[string]any)
	if img, nodeImg := c["image"], nodeContainers[0].(map[string]any)["image"]; img != nodeImg {
		fail("tessera-scheduler image %v, want Tessera's (tessera-node's %v)", img, nodeImg)
	}
	var cmd []string
	for _, a := range c["command"].([]any) {
		cmd = append(cmd, fmt.Sprint(a))
	}
	if len(cmd) == 0 || cmd[0] != "/usr/local/bin/tessera-scheduler" {
		fail("command %q, want /usr/local/bin/tessera-scheduler", cmd)
	}
	// mounted returns what is mounted at the directory of file: the
	// volume's configMap or secret name.
	volumes, _ := podSpec["volumes"].([]any)
	mounts, _ := c["volumeMounts"].([]any)
	mounted := func(file, kind string) string {
		for _, m := range mounts {
			mm := m.(map[string]any)
			if mm["mountPath"] != path.Dir(file) {
				continue
			}
			for _, vol := range volumes {
				vv := vol.(map[string]any)
				if vv["name"] != mm["name"] {
					continue
				}
				src, _ := vv[kind].(map[string]any)
				if kind == "secret" {
					return fmt.Sprint(src["secretName"])
				}
				return fmt.Sprint(src["name"])
			}
		}
		return ""
	}
	var config string
	for _, a := range cmd {
		if f, ok := strings.CutPrefix(a, "--config="); ok {
			config = f
		}
	}
	if config == "" || path.Base(config) != "scheduler-config.yaml" || mounted(config, "configMap") != "tessera-scheduler-config" {
		fail("--config=%s is not scheduler-config.yaml of the mounted ConfigMap tessera-scheduler-config", config)
	}

	flags, err := pluginFlags(schedulerConfig(t, objs))
	if err != nil {
		fail("%v", err)
		return
	}
	ports, _ := c["ports"].([]any)
	var httpPort string
	for _, p := range ports {
		if pm := p.(map[string]any); pm["name"] == "http" {
			httpPort = fmt.Sprint(pm["containerPort"])
		}
	}
	if !slices.Contains(flags, "--listen=:"+httpPort) {
		fail("the extender's flags %q do not listen on the container port http (%s)", flags, httpPort)
	}
	for _, f := range flags {
		if strings.HasPrefix(f, "--v=") {
			fail("the extender's flags hold %s: it would set the whole process's verbosity", f)
		}
		if file, ok := strings.CutPrefix(f, "--tls-cert="); ok && mounted(file, "secret") != "tessera-extender-tls" {
			fail("--tls-cert=%s is not in the mounted Secret tessera-extender-tls", file)
		}
	}
	if v.https != slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "--tls-cert=") }) {
		fail("https %v, but the extender's flags %q", v.https, flags)
	}

	selector, _, _ := unstructured.NestedStringMap(svc.Object, "spec", "selector")
	podLabels, _, _ := unstructured.NestedStringMap(dep.Object, "spec", "template", "metadata", "labels")
	if len(selector) == 0 {
		fail("Service tessera-extender selects nothing")
	}
	for k, val := range selector {
		if podLabels[k] != val {
			fail("Service tessera-extender's selector %v does not select tessera-scheduler's pods (%v): the webhooks would reach nothing", selector, podLabels)
		}
	}
	for _, name := range []string{"tessera-scheduler", "tessera-scheduler-volume"} {
		crb := find(objs, "ClusterRoleBinding", "", name)
		if crb == nil {
			fail("no ClusterRoleBinding %s", name)
			continue
		}
		subjects, _, _ := unstructured.NestedSlice(crb.Object, "subjects")
		if len(subjects) != 1 || subjects[0].(map[string]any)["name"] != "tessera-extender" {
			fail("ClusterRoleBinding %s binds %v, want the ServiceAccount tessera-extender", name, subjects)
		}
	}

	// The profile's plugins are those of the file tessera-scheduler is
	// given outside the chart (and the benchmark runs).
	raw, err := os.ReadFile(filepath.Join(repo, "deploy", "scheduler", "scheduler-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := yaml.UnmarshalStrict(raw, &file); err != nil {
		t.Fatalf("deploy/scheduler/scheduler-config.yaml: %v", err)
	}
	pluginsOf := func(cfg map[string]any, name string) any {
		ps, _ := cfg["profiles"].([]any)
		for _, p := range ps {
			if m := p.(map[string]any); m["schedulerName"] == name {
				return m["plugins"]
			}
		}
		return nil
	}
	got, want := pluginsOf(schedulerConfig(t, objs), "tessera-scheduler"), pluginsOf(file, "tessera-scheduler")
	if got == nil || !reflect.DeepEqual(got, want) {
		fail("profile tessera-scheduler's plugins %v, want deploy/scheduler/scheduler-config.yaml's %v", got, want)
	}
}

// pluginFlags returns the Tessera plugin's flags, the same in every
// profile (tessera-scheduler refuses others).
func pluginFlags(cfg map[string]any) ([]string, error) {
	var flags []string
	n := 0
	err := eachTesseraArgs(cfg, func(args map[string]any) error {
		var fs []string
		list, _ := args["flags"].([]any)
		for _, f := range list {
			fs = append(fs, fmt.Sprint(f))
		}
		if n > 0 && !slices.Equal(fs, flags) {
			return fmt.Errorf("the Tessera plugin's flags differ between profiles: %q, %q", flags, fs)
		}
		flags, n = fs, n+1
		return nil
	})
	if err == nil && n == 0 {
		err = fmt.Errorf("no profile configures the Tessera plugin")
	}
	return flags, err
}

// eachTesseraArgs calls f with the args of every Tessera pluginConfig entry.
func eachTesseraArgs(cfg map[string]any, f func(args map[string]any) error) error {
	ps, _ := cfg["profiles"].([]any)
	for _, p := range ps {
		pcs, _ := p.(map[string]any)["pluginConfig"].([]any)
		for _, pc := range pcs {
			m, _ := pc.(map[string]any)
			if m == nil || m["name"] != "Tessera" {
				continue
			}
			args, _ := m["args"].(map[string]any)
			if args == nil {
				return fmt.Errorf("pluginConfig Tessera has no args")
			}
			if err := f(args); err != nil {
				return err
			}
		}
	}
	return nil
}

// runPluginScheduler runs tessera-scheduler with mode plugin's rendered
// configuration, as its pod would: as the ServiceAccount tessera-extender
// (extSA) under the chart's RBAC (the extender's and kube-scheduler's,
// created for real), with the generated certificate. Only what a process
// outside a pod must differ: the extender listens on a free loopback port
// and is given a kubeconfig (in a pod, the in-cluster one). It must take
// its lease, and the extender in its process must become ready (/readyz
// over HTTPS, verified with the chart's CA) and create the seal key Secret.
func runPluginScheduler(ctx context.Context, t *testing.T, repo string, cp *controlplane.ControlPlane, dyn dynamic.Interface, mapper meta.RESTMapper, extSA *controlplane.User, objs []*unstructured.Unstructured) {
	bin := schedulerBinary(t)
	for _, o := range objs {
		name := o.GetLabels()["app.kubernetes.io/name"]
		if name != "tessera-scheduler" && name != "tessera-extender" {
			continue
		}
		if o.GetKind() == "ServiceAccount" || o.GroupVersionKind().Group == "rbac.authorization.k8s.io" {
			if err := createOrReplace(ctx, dyn, mapper, o); err != nil {
				t.Fatalf("create %s: %v", key(o), err)
			}
		}
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "tessera-extender.kubeconfig")
	if err := writeKubeconfig(kubeconfig, cp, extSA); err != nil {
		t.Fatal(err)
	}
	secret := find(objs, "Secret", releaseNS, "tessera-extender-tls")
	if secret == nil {
		t.Fatal("no Secret tessera-extender-tls")
	}
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	files := map[string]string{}
	for _, k := range []string{"tls.crt", "tls.key"} {
		raw, err := base64.StdEncoding.DecodeString(data[k])
		if err != nil {
			t.Fatalf("Secret tessera-extender-tls %s: %v", k, err)
		}
		files[k] = filepath.Join(dir, k)
		if err := os.WriteFile(files[k], raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freePort(t)
	cfg := schedulerConfig(t, objs)
	err := eachTesseraArgs(cfg, func(args map[string]any) error {
		list, _ := args["flags"].([]any)
		var out []any
		for _, f := range list {
			s := fmt.Sprint(f)
			switch {
			case strings.HasPrefix(s, "--listen="):
				s = "--listen=127.0.0.1:" + strconv.Itoa(port)
			case strings.HasPrefix(s, "--tls-cert="):
				s = "--tls-cert=" + files["tls.crt"]
			case strings.HasPrefix(s, "--tls-key="):
				s = "--tls-key=" + files["tls.key"]
			}
			out = append(out, s)
		}
		args["flags"] = append(out, "--kubeconfig="+kubeconfig)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
	raw, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "scheduler-config.yaml")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: file, Binary: bin}); err != nil {
		t.Fatalf("tessera-scheduler with the chart's configuration: %v", err)
	}
	defer func() {
		if err := cp.StopScheduler(); err != nil {
			t.Error(err)
		}
	}()
	holder, err := waitLease(ctx, dyn, releaseNS, "tessera-scheduler")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tessera-scheduler as %s holds the lease %s/tessera-scheduler (%s)", extSA.Name, releaseNS, holder)

	ca, err := base64.StdEncoding.DecodeString(data["ca.crt"])
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("Secret tessera-extender-tls: ca.crt holds no certificate")
	}
	// The name the API server calls the webhooks at (the Service's).
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "tessera-extender." + releaseNS + ".svc", MinVersion: tls.VersionTLS12},
	}}
	url := "https://127.0.0.1:" + strconv.Itoa(port) + "/readyz"
	var last string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			last = err.Error()
			return false, nil
		}
		_ = resp.Body.Close()
		last = resp.Status
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("the extender in tessera-scheduler is not ready at %s: %v (last: %s)", url, err, last)
	}
	if _, err := cp.Client().CoreV1().Secrets(releaseNS).Get(ctx, "tessera-seal-key", metav1.GetOptions{}); err != nil {
		t.Errorf("the extender in tessera-scheduler made no seal key Secret %s/tessera-seal-key: %v", releaseNS, err)
	}
	t.Logf("the extender in tessera-scheduler is ready over HTTPS with the chart's certificate")

	// The chart's RBAC covers both: nothing the process asked for in its
	// first seconds (informers, lease, seal key, events) was forbidden.
	time.Sleep(2 * time.Second)
	for name, log := range cp.LogFiles() {
		if !strings.HasPrefix(name, "kube-scheduler") {
			continue
		}
		raw, err := os.ReadFile(log)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "forbidden") {
				t.Errorf("tessera-scheduler (%s) was refused by RBAC: %s", log, line)
			}
		}
	}
}

// createOrReplace creates o, deleting first an object of its name left by
// another variant (mode deployment binds the same names to another
// ServiceAccount).
func createOrReplace(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) error {
	_, err := createFor(ctx, dyn, mapper, o)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	if err := ri.Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	_, err = createFor(ctx, dyn, mapper, o)
	return err
}

// schedulerBinary returns $TESSERA_TEST_TESSERA_SCHEDULER, or
// tessera-scheduler built from the scheduler/ module
// (extenderenv.SchedulerBinary, as the other suites build it).
func schedulerBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(envScheduler); bin != "" {
		return bin
	}
	start := time.Now()
	bin := extenderenv.SchedulerBinary(t)
	t.Logf("built tessera-scheduler in %s", time.Since(start).Round(time.Second))
	return bin
}

// freePort returns a TCP port nothing listens on now (freeport.Port).
func freePort(t *testing.T) int {
	t.Helper()
	p, err := freeport.Port()
	if err != nil {
		t.Fatal(err)
	}
	return p
}
