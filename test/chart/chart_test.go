// Package chart tests the Helm chart charts/tessera against a real
// kube-apiserver and kube-scheduler: every object the chart renders, with
// its default values and with the other scheduler wirings, is applied with
// a server-side dry run (the API server validates and admits it as it would
// an install, and stores nothing), after the chart's CRDs are created for
// real; the KubeSchedulerConfiguration it renders is run by the real
// kube-scheduler (the tessera-scheduler Deployment's as its ServiceAccount,
// under the chart's RBAC, taking its leader election lease), mode plugin's
// by tessera-scheduler (kube-scheduler with Tessera's plugin, the extender
// in its process) as the extender's ServiceAccount; and the
// README's helm install, then helm upgrade and uninstall, run against the
// API server for real. helm is built from hack/tools (go tool helm) unless
// $TESSERA_TEST_HELM names a binary.
package chart

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

const (
	// releaseNS is the namespace the chart is installed in (the README's
	// helm install -n tessera-system).
	releaseNS = "tessera-system"
	// kubeVersion is the test cluster's (test/go.mod's k8s.io/kubernetes).
	kubeVersion = install.KubeVersion
	// fieldManager is the dry-run applies' field manager.
	fieldManager = "tessera-chart-test"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// variant is one way of installing the chart.
type variant struct {
	name string
	args []string // helm template flags besides the release, namespace and kube version
	// want are objects (kind/namespace/name, namespace empty for cluster
	// objects) the rendering must hold; absent, objects it must not.
	want, absent []string
	// schedulerProfiles are the profiles of the rendered
	// KubeSchedulerConfiguration (ConfigMap tessera-scheduler-config).
	schedulerProfiles []string
	// https: the extender serves HTTPS with a CA the chart generated.
	https bool
	// webhooks are the names of tessera-gang's webhooks, in order (an
	// https variant; default gang and queue).
	webhooks []string
	// plugin: scheduler.mode plugin, tessera-scheduler with the extender in
	// its process.
	plugin bool
	// verbAuth: kube-scheduler authenticates to the extender's verbs with
	// the client certificate of Secret tessera-scheduler-client-tls.
	verbAuth bool
}

var common = []string{
	"CustomResourceDefinition//elasticquotas.scheduling.x-k8s.io",
	"CustomResourceDefinition//podgroups.scheduling.x-k8s.io",
	"CustomResourceDefinition//queues.tessera.dev",
	"DaemonSet/tessera-system/tessera-node",
	"ConfigMap/tessera-system/tessera-node-config",
	"ServiceAccount/tessera-system/tessera-node",
	"ClusterRole//tessera-node",
	"ClusterRole//tessera-extender",
	"ClusterRole//tessera-tenant-view",
	"ClusterRole//tessera-tenant-edit",
	"ClusterRole//tessera-queue-reader",
	"MutatingWebhookConfiguration//tessera-gang",
	"ValidatingAdmissionPolicy//tessera-state-annotations",
	"ValidatingAdmissionPolicyBinding//tessera-state-annotations",
	"ValidatingAdmissionPolicy//tessera-gpu-placement",
	"ValidatingAdmissionPolicyBinding//tessera-gpu-placement",
	"ValidatingAdmissionPolicy//tessera-hints",
	"ValidatingAdmissionPolicyBinding//tessera-hints",
}

var variants = []variant{
	{
		name: "defaults",
		want: append(slices.Clone(common),
			"Deployment/tessera-system/tessera-extender",
			"Service/tessera-system/tessera-extender",
			"Secret/tessera-system/tessera-extender-tls",
			"Secret/tessera-system/tessera-scheduler-client-tls",
			"Role/tessera-system/tessera-extender-seal-key",
			"Role/tessera-system/tessera-node-seal-key",
			"Deployment/tessera-system/tessera-scheduler",
			"ConfigMap/tessera-system/tessera-scheduler-config",
			"ServiceAccount/tessera-system/tessera-scheduler",
			"ClusterRoleBinding//tessera-scheduler",
			"RoleBinding/kube-system/tessera-scheduler-authentication-reader",
		),
		absent:            []string{"Namespace//tessera-system"},
		schedulerProfiles: []string{"tessera-scheduler"},
		https:             true,
		verbAuth:          true,
	},
	{
		// With the nvidia.com/gpu compatibility webhook: its match
		// condition is compiled by the API server.
		name:     "scheduler-configmap",
		args:     []string{"--set", "scheduler.mode=configmap,extender.webhooks.nvidiaGPU=true"},
		webhooks: []string{"nvidia-gpu.tessera.dev", "gang.tessera.dev", "queue.tessera.dev"},
		want: append(slices.Clone(common),
			"Deployment/tessera-system/tessera-extender",
			"ConfigMap/tessera-system/tessera-scheduler-config",
			"Secret/tessera-system/tessera-scheduler-client-tls",
		),
		absent:            []string{"Deployment/tessera-system/tessera-scheduler", "ServiceAccount/tessera-system/tessera-scheduler"},
		schedulerProfiles: []string{"default-scheduler", "tessera-scheduler"},
		https:             true,
		verbAuth:          true,
	},
	{
		// Verb authentication turned off: no client certificate, no
		// --verbs-client-ca.
		name: "verb-auth-off",
		args: []string{"--set", "extender.tls.verbAuth=false"},
		want: append(slices.Clone(common),
			"Deployment/tessera-system/tessera-extender",
			"Deployment/tessera-system/tessera-scheduler",
		),
		absent:            []string{"Secret/tessera-system/tessera-scheduler-client-tls"},
		schedulerProfiles: []string{"tessera-scheduler"},
		https:             true,
	},
	{
		// The values deploy/ is rendered with (make deploy).
		name: "deploy-values",
		args: []string{"-f", "charts/deploy-values.yaml"},
		want: append(slices.Clone(common),
			"Namespace//tessera-system",
			"Deployment/kube-system/tessera-extender",
			"Service/kube-system/tessera-extender",
			"Role/kube-system/tessera-node-seal-key",
		),
		absent: []string{"Secret/kube-system/tessera-extender-tls", "ConfigMap/kube-system/tessera-scheduler-config"},
	},
	{
		// tessera-scheduler in place of the extender's Deployment and the
		// stock kube-scheduler; the extender's Service, TLS, webhooks and
		// RBAC stay.
		name:   "scheduler-plugin",
		args:   []string{"--set", "scheduler.mode=plugin"},
		plugin: true,
		want: append(slices.Clone(common),
			"Deployment/tessera-system/tessera-scheduler",
			"ConfigMap/tessera-system/tessera-scheduler-config",
			"Service/tessera-system/tessera-extender",
			"Secret/tessera-system/tessera-extender-tls",
			"ServiceAccount/tessera-system/tessera-extender",
			"ClusterRoleBinding//tessera-extender",
			"Role/tessera-system/tessera-extender-seal-key",
			"ClusterRoleBinding//tessera-scheduler",
			"ClusterRoleBinding//tessera-scheduler-volume",
			"RoleBinding/kube-system/tessera-scheduler-authentication-reader",
			"Role/tessera-system/tessera-scheduler-lease",
			"RoleBinding/tessera-system/tessera-scheduler-lease",
		),
		// The plugin's extender serves no verbs: no client certificate.
		absent:            []string{"Deployment/tessera-system/tessera-extender", "ServiceAccount/tessera-system/tessera-scheduler", "Secret/tessera-system/tessera-scheduler-client-tls"},
		schedulerProfiles: []string{"tessera-scheduler"},
		https:             true,
	},
}

// TestChartObjectsAreAccepted renders each variant and dry-run applies
// every object it holds; one rejection fails the test.
func TestChartObjectsAreAccepted(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)

	rendered := map[string][]*unstructured.Unstructured{}
	for _, v := range variants {
		objs := render(t, helm, repo, filepath.Join(repo, "charts", "tessera"), v.args...)
		checkRendering(t, v, objs)
		if v.plugin {
			checkPluginWiring(t, repo, v, objs)
		}
		rendered[v.name] = objs
	}
	if t.Failed() {
		t.FailNow()
	}

	// tessera-scheduler's identity, as a pod of the chart's Deployment
	// would have it (its ServiceAccount's user name and groups).
	schedSA := &controlplane.User{Name: "system:serviceaccount:" + releaseNS + ":tessera-scheduler",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS}}
	// Mode plugin's: tessera-scheduler runs as the extender's.
	extSA := &controlplane.User{Name: "system:serviceaccount:" + releaseNS + ":tessera-extender",
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + releaseNS}}
	cp := controlplane.StartForTest(t, controlplane.Options{Users: []*controlplane.User{schedSA, extSA}})
	ctx := t.Context()
	for _, ns := range []string{releaseNS, "kube-system"} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The CRDs for real (every variant ships the same files), so that the
	// API server serves their kinds.
	crds := crdsOf(rendered[variants[0].name])
	for _, v := range variants[1:] {
		if got := crdsOf(rendered[v.name]); !sameObjects(got, crds) {
			t.Fatalf("variant %s renders other CRDs than %s", v.name, variants[0].name)
		}
	}
	for _, crd := range crds {
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
			t.Fatalf("create CustomResourceDefinition %s: %v", crd.GetName(), err)
		}
		if err := install.WaitEstablished(ctx, dyn, crd.GetName()); err != nil {
			t.Fatal(err)
		}
	}
	mapper, err := newMapper(cp)
	if err != nil {
		t.Fatal(err)
	}

	// The dry run really validates: an object the API server must refuse
	// is refused by the same path.
	t.Run("a broken object is refused", func(t *testing.T) {
		ds := find(rendered[variants[0].name], "DaemonSet", releaseNS, "tessera-node").DeepCopy()
		if err := unstructured.SetNestedField(ds.Object, "Not_A_DNS_Label", "spec", "template", "spec", "serviceAccountName"); err != nil {
			t.Fatal(err)
		}
		err := dryRunApply(ctx, dyn, mapper, ds)
		if err == nil || !apierrors.IsInvalid(err) {
			t.Fatalf("dry-run apply of a DaemonSet with serviceAccountName Not_A_DNS_Label: got %v, want Invalid", err)
		}
	})

	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			n := 0
			for _, o := range rendered[v.name] {
				if o.GetKind() == "CustomResourceDefinition" {
					continue
				}
				if err := dryRunApply(ctx, dyn, mapper, o); err != nil {
					t.Errorf("%s: rejected: %v", key(o), err)
					continue
				}
				n++
			}
			t.Logf("%d objects accepted (dry run), %d CRDs created", n, len(crds))
		})
	}

	// The KubeSchedulerConfiguration of each wiring runs in the real
	// kube-scheduler, which decodes it strictly and validates its profiles
	// and extenders (the CA in tlsConfig included). Mode deployment's runs
	// as tessera-scheduler's ServiceAccount, with the chart's RBAC created
	// for real and its own leader election: it must sync its informers
	// (readyz) and take its lease. Mode configmap's is for the cluster's
	// kube-scheduler: it runs as system:kube-scheduler. Mode plugin's is
	// run by tessera-scheduler (runPluginScheduler).
	for _, v := range variants {
		if v.schedulerProfiles == nil {
			continue
		}
		if v.plugin {
			t.Run(v.name+"/tessera-scheduler", func(t *testing.T) {
				runPluginScheduler(ctx, t, repo, cp, dyn, mapper, extSA, rendered[v.name])
			})
			continue
		}
		t.Run(v.name+"/kube-scheduler", func(t *testing.T) {
			cfg := schedulerConfig(t, rendered[v.name])
			deployment := find(rendered[v.name], "Deployment", releaseNS, "tessera-scheduler") != nil
			if deployment {
				for _, o := range rendered[v.name] {
					if isSchedulerRBAC(o) {
						if err := createOrReplace(ctx, dyn, mapper, o); err != nil {
							t.Fatalf("create %s: %v", key(o), err)
						}
					}
				}
				kubeconfig := filepath.Join(t.TempDir(), "tessera-scheduler.kubeconfig")
				if err := writeKubeconfig(kubeconfig, cp, schedSA); err != nil {
					t.Fatal(err)
				}
				cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig}
			}
			if v.verbAuth {
				clientCertFiles(t, rendered[v.name], cfg)
			}
			raw, err := yaml.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "scheduler-config.yaml")
			if err := os.WriteFile(file, raw, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := cp.StartScheduler(ctx, controlplane.SchedulerOptions{ConfigFile: file}); err != nil {
				t.Fatalf("kube-scheduler with the chart's configuration (%s): %v", v.name, err)
			}
			defer func() {
				if err := cp.StopScheduler(); err != nil {
					t.Error(err)
				}
			}()
			if deployment {
				holder, err := waitLease(ctx, dyn, releaseNS, "tessera-scheduler")
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("kube-scheduler as %s holds the lease %s/tessera-scheduler (%s)", schedSA.Name, releaseNS, holder)
			}
		})
	}
}

// isSchedulerRBAC: the ServiceAccount and RBAC objects of mode deployment.
func isSchedulerRBAC(o *unstructured.Unstructured) bool {
	if o.GetLabels()["app.kubernetes.io/name"] != "tessera-scheduler" {
		return false
	}
	return o.GetKind() == "ServiceAccount" || o.GroupVersionKind().Group == "rbac.authorization.k8s.io"
}

// createFor creates o for real.
func createFor(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("no API for %s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
	}
	return ri.Create(ctx, o, metav1.CreateOptions{FieldManager: fieldManager})
}

// writeKubeconfig writes a kubeconfig for u's static token.
func writeKubeconfig(path string, cp *controlplane.ControlPlane, u *controlplane.User) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: cp.APIServerURL, CertificateAuthority: cp.CAFile()}
	cfg.AuthInfos["user"] = &clientcmdapi.AuthInfo{Token: u.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "user"}
	cfg.CurrentContext = "test"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	return nil
}

// waitLease waits until the Lease ns/name has a holder and returns it.
func waitLease(ctx context.Context, dyn dynamic.Interface, ns, name string) (string, error) {
	leases := dyn.Resource(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}).Namespace(ns)
	var holder, last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		holder, _, _ = unstructured.NestedString(l.Object, "spec", "holderIdentity")
		return holder != "", nil
	})
	if err != nil {
		return "", fmt.Errorf("no holder of the Lease %s/%s: %w (last: %s)", ns, name, err, last)
	}
	return holder, nil
}

// TestHelmInstallAndUpgrade installs the chart with its defaults, as the
// README says, on a real API server (no nodes: nothing runs, every object is
// created), then upgrades it: the generated CA survives the upgrade (the
// Secret is read back with lookup), so the webhooks' caBundle and
// kube-scheduler's caData do not change; uninstalling keeps the CRDs.
func TestHelmInstallAndUpgrade(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)
	cp := controlplane.StartForTest(t, controlplane.Options{})
	ctx := t.Context()
	kc := []string{"--kubeconfig", cp.KubeconfigPath(), "--namespace", releaseNS}
	chart := filepath.Join(repo, "charts", "tessera")

	stdout, stderr, err := runHelm(helm, repo, append([]string{"install", "tessera", chart, "--create-namespace"}, kc...)...)
	if err != nil {
		t.Fatalf("helm install tessera charts/tessera -n %s --create-namespace: %v\n%s%s", releaseNS, err, stdout, stderr)
	}
	if !strings.Contains(stdout, "STATUS: deployed") || !strings.Contains(stdout, "schedulerName: tessera-scheduler") {
		t.Errorf("helm install printed no deployed status or no NOTES:\n%s", stdout)
	}
	t.Logf("helm install:\n%s", stdout)
	client := cp.Client()
	caOf := func() (secret, webhook, scheduler string) {
		t.Helper()
		s, err := client.CoreV1().Secrets(releaseNS).Get(ctx, "tessera-extender-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-gang", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cm, err := client.CoreV1().ConfigMaps(releaseNS).Get(ctx, "tessera-scheduler-config", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var cfg struct {
			Extenders []struct {
				TLSConfig struct {
					CAData []byte `json:"caData"`
				} `json:"tlsConfig"`
			} `json:"extenders"`
		}
		if err := yaml.Unmarshal([]byte(cm.Data["scheduler-config.yaml"]), &cfg); err != nil || len(cfg.Extenders) == 0 {
			t.Fatalf("scheduler-config.yaml: %v (%d extenders)", err, len(cfg.Extenders))
		}
		return string(s.Data["ca.crt"]), string(w.Webhooks[0].ClientConfig.CABundle), string(cfg.Extenders[0].TLSConfig.CAData)
	}
	clientOf := func() string {
		t.Helper()
		s, err := client.CoreV1().Secrets(releaseNS).Get(ctx, "tessera-scheduler-client-tls", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data["tls.crt"])
	}
	s1, w1, c1 := caOf()
	k1 := clientOf()
	if s1 == "" || w1 != s1 || c1 != s1 {
		t.Fatalf("after install: the webhook's caBundle and the scheduler's caData are not the Secret's ca.crt")
	}
	for _, name := range []string{"tessera-extender", "tessera-scheduler"} {
		if _, err := client.AppsV1().Deployments(releaseNS).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("after install: Deployment %s: %v", name, err)
		}
	}
	if _, err := client.AppsV1().DaemonSets(releaseNS).Get(ctx, "tessera-node", metav1.GetOptions{}); err != nil {
		t.Errorf("after install: DaemonSet tessera-node: %v", err)
	}

	if stdout, stderr, err := runHelm(helm, repo, append([]string{"upgrade", "tessera", chart}, kc...)...); err != nil {
		t.Fatalf("helm upgrade: %v\n%s%s", err, stdout, stderr)
	}
	s2, w2, c2 := caOf()
	if s2 != s1 || w2 != s1 || c2 != s1 {
		t.Fatalf("helm upgrade changed the extender's CA (Secret changed: %v, webhook: %v, scheduler: %v)", s2 != s1, w2 != s1, c2 != s1)
	}
	if k2 := clientOf(); k2 != k1 {
		t.Error("helm upgrade changed kube-scheduler's client certificate")
	}

	if stdout, stderr, err := runHelm(helm, repo, append([]string{"uninstall", "tessera"}, kc...)...); err != nil {
		t.Fatalf("helm uninstall: %v\n%s%s", err, stdout, stderr)
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(crdGVR).Get(ctx, "queues.tessera.dev", metav1.GetOptions{}); err != nil {
		t.Errorf("after helm uninstall the Queue CRD is gone (crds/ are kept by Helm): %v", err)
	}
}

// TestDashboards: every file under the chart's dashboards/ becomes a
// ConfigMap labelled grafana_dashboard: "1" holding the file, none when
// the directory is missing or dashboards.enabled is false.
func TestDashboards(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)
	chart := copyChart(t, filepath.Join(repo, "charts", "tessera"))
	dashboards := func(objs []*unstructured.Unstructured) map[string]*unstructured.Unstructured {
		out := map[string]*unstructured.Unstructured{}
		for _, o := range objs {
			if o.GetKind() == "ConfigMap" && o.GetLabels()["grafana_dashboard"] == "1" {
				out[o.GetName()] = o
			}
		}
		return out
	}

	if err := os.RemoveAll(filepath.Join(chart, "dashboards")); err != nil {
		t.Fatal(err)
	}
	if got := dashboards(render(t, helm, repo, chart)); len(got) != 0 {
		t.Fatalf("no dashboards/ directory: %d dashboard ConfigMaps, want none", len(got))
	}

	files := map[string]string{
		"tessera.json":      `{"title": "Tessera GPUs", "panels": []}`,
		"Queues Board.json": "{\n  \"title\": \"Queues\"\n}\n",
	}
	if err := os.MkdirAll(filepath.Join(chart, "dashboards"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(chart, "dashboards", name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := dashboards(render(t, helm, repo, chart))
	wantNames := map[string]string{"tessera-dashboard-tessera": "tessera.json", "tessera-dashboard-queues-board": "Queues Board.json"}
	if len(got) != len(wantNames) {
		t.Fatalf("dashboard ConfigMaps %v, want %v", keys(got), wantNames)
	}
	for cm, file := range wantNames {
		o, ok := got[cm]
		if !ok {
			t.Fatalf("no ConfigMap %s for dashboards/%s (got %v)", cm, file, keys(got))
		}
		if o.GetNamespace() != releaseNS {
			t.Errorf("ConfigMap %s in namespace %q, want %s", cm, o.GetNamespace(), releaseNS)
		}
		data, _, _ := unstructured.NestedStringMap(o.Object, "data")
		// The chart's |- block drops the final newline only.
		if data[file] != strings.TrimSuffix(files[file], "\n") {
			t.Errorf("ConfigMap %s data[%q] = %q, want the file %q", cm, file, data[file], files[file])
		}
	}
	if got := dashboards(render(t, helm, repo, chart, "--set", "dashboards.enabled=false")); len(got) != 0 {
		t.Fatalf("dashboards.enabled=false: %d dashboard ConfigMaps, want none", len(got))
	}
}

// TestSchemaRefusesUnknownValues: values.schema.json closes every section,
// so a misspelt value fails the install instead of being ignored.
func TestSchemaRefusesUnknownValues(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)
	for _, set := range []string{"extender.polcy=binpack", "scheduler.mode=second", "extender.tls.mode=cert-manager", "nodes.logLevel=3"} {
		_, stderr, err := runHelm(helm, repo, "template", "tessera", filepath.Join(repo, "charts", "tessera"), "--kube-version", kubeVersion, "--set", set)
		if err == nil {
			t.Errorf("helm template --set %s: rendered, want the schema to refuse it", set)
			continue
		}
		if !strings.Contains(stderr, "schema") {
			t.Errorf("helm template --set %s: %v, want a schema error: %s", set, err, stderr)
		}
	}
}

// checkRendering checks what a variant must and must not hold, and the
// TLS wiring: the webhooks' caBundle and kube-scheduler's caData are the
// CA of the Secret, whose certificate is valid for the Service's name.
func checkRendering(t *testing.T, v variant, objs []*unstructured.Unstructured) {
	t.Helper()
	have := map[string]bool{}
	for _, o := range objs {
		k := key(o)
		if have[k] {
			t.Errorf("%s: %s rendered twice", v.name, k)
		}
		have[k] = true
	}
	for _, k := range v.want {
		if !have[k] {
			t.Errorf("%s: no %s among the %d rendered objects", v.name, k, len(objs))
		}
	}
	for _, k := range v.absent {
		if have[k] {
			t.Errorf("%s: %s rendered, want it absent", v.name, k)
		}
	}
	if v.schedulerProfiles != nil {
		cfg := schedulerConfig(t, objs)
		var profiles []string
		ps, _ := cfg["profiles"].([]any)
		for _, p := range ps {
			m, _ := p.(map[string]any)
			profiles = append(profiles, fmt.Sprint(m["schedulerName"]))
		}
		if !slices.Equal(profiles, v.schedulerProfiles) {
			t.Errorf("%s: scheduler profiles %v, want %v", v.name, profiles, v.schedulerProfiles)
		}
	}
	if !v.https {
		return
	}
	secret := find(objs, "Secret", releaseNS, "tessera-extender-tls")
	whc := find(objs, "MutatingWebhookConfiguration", "", "tessera-gang")
	if secret == nil || whc == nil {
		t.Errorf("%s: no Secret tessera-extender-tls or no MutatingWebhookConfiguration tessera-gang", v.name)
		return
	}
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	ca := data["ca.crt"]
	webhooks, _, _ := unstructured.NestedSlice(whc.Object, "webhooks")
	wantHooks := v.webhooks
	if wantHooks == nil {
		wantHooks = []string{"gang.tessera.dev", "queue.tessera.dev"}
	}
	var names []string
	for _, w := range webhooks {
		names = append(names, fmt.Sprint(w.(map[string]any)["name"]))
	}
	if !slices.Equal(names, wantHooks) {
		t.Errorf("%s: webhooks %v, want %v", v.name, names, wantHooks)
	}
	for _, w := range webhooks {
		bundle, _, _ := unstructured.NestedString(w.(map[string]any), "clientConfig", "caBundle")
		if bundle == "" || bundle != ca {
			t.Errorf("%s: webhook %v caBundle is not the Secret's ca.crt", v.name, w.(map[string]any)["name"])
		}
	}
	exts, _ := schedulerConfig(t, objs)["extenders"].([]any)
	for _, e := range exts {
		m := e.(map[string]any)
		tlsCfg, _ := m["tlsConfig"].(map[string]any)
		if m["enableHTTPS"] != true || tlsCfg == nil || tlsCfg["caData"] != ca {
			t.Errorf("%s: extender %v: enableHTTPS %v, tlsConfig.caData not the Secret's ca.crt", v.name, m["urlPrefix"], m["enableHTTPS"])
		}
		if m["urlPrefix"] != "https://tessera-extender.tessera-system.svc:8888" {
			t.Errorf("%s: urlPrefix %v", v.name, m["urlPrefix"])
		}
	}
	if err := verifyServing(ca, data["tls.crt"], "tessera-extender.tessera-system.svc"); err != nil {
		t.Errorf("%s: %v", v.name, err)
	}
	checkVerbAuth(t, v, objs, ca)
}

// clientDir is where the chart has kube-scheduler find its client
// certificate for the extender's verbs (tlsConfig certFile and keyFile).
const clientDir = "/etc/tessera-scheduler-client"

// checkVerbAuth checks the wiring of verb authentication: with it, the
// Secret tessera-scheduler-client-tls holds a client certificate the CA ca
// signed, the extender trusts that Secret's ca.crt (--verbs-client-ca, a
// mounted file), every extender entry names the certificate in tlsConfig,
// and tessera-scheduler (mode deployment) mounts it there; without it,
// none of that is rendered.
func checkVerbAuth(t *testing.T, v variant, objs []*unstructured.Unstructured, ca string) {
	t.Helper()
	const secretName = "tessera-scheduler-client-tls"
	var flags []string
	ext := find(objs, "Deployment", releaseNS, "tessera-extender")
	if ext != nil {
		cs, _, _ := unstructured.NestedSlice(ext.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "args")
		flags = args
	}
	var caFlag string
	for _, f := range flags {
		if file, ok := strings.CutPrefix(f, "--verbs-client-ca="); ok {
			caFlag = file
		}
	}
	exts, _ := schedulerConfig(t, objs)["extenders"].([]any)
	if !v.verbAuth {
		if caFlag != "" || find(objs, "Secret", releaseNS, secretName) != nil {
			t.Errorf("%s: --verbs-client-ca=%q or Secret %s rendered without verb authentication", v.name, caFlag, secretName)
		}
		for _, e := range exts {
			if tc, _ := e.(map[string]any)["tlsConfig"].(map[string]any); tc["certFile"] != nil {
				t.Errorf("%s: a client certificate in tlsConfig without verb authentication", v.name)
			}
		}
		return
	}
	secret := find(objs, "Secret", releaseNS, secretName)
	if secret == nil {
		t.Errorf("%s: no Secret %s", v.name, secretName)
		return
	}
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	if data["ca.crt"] != ca {
		t.Errorf("%s: Secret %s's ca.crt is not the extender's CA", v.name, secretName)
	}
	if err := verifyCert(ca, data["tls.crt"], "", x509.ExtKeyUsageClientAuth); err != nil {
		t.Errorf("%s: kube-scheduler's client certificate: %v", v.name, err)
	}
	if caFlag == "" || mountedFrom(ext, "extender", caFlag) != secretName+"/ca.crt" {
		t.Errorf("%s: --verbs-client-ca=%q is not Secret %s's ca.crt as mounted", v.name, caFlag, secretName)
	}
	for _, e := range exts {
		m := e.(map[string]any)
		tc, _ := m["tlsConfig"].(map[string]any)
		if tc["certFile"] != clientDir+"/tls.crt" || tc["keyFile"] != clientDir+"/tls.key" {
			t.Errorf("%s: extender %v: tlsConfig certFile %v, keyFile %v, want %s/tls.{crt,key}", v.name, m["urlPrefix"], tc["certFile"], tc["keyFile"], clientDir)
		}
	}
	if sched := find(objs, "Deployment", releaseNS, "tessera-scheduler"); sched != nil {
		for _, f := range []string{"tls.crt", "tls.key"} {
			if got := mountedFrom(sched, "kube-scheduler", clientDir+"/"+f); got != secretName+"/"+f {
				t.Errorf("%s: tessera-scheduler's %s/%s is %q, want Secret %s's %s", v.name, clientDir, f, got, secretName, f)
			}
		}
	}
}

// mountedFrom names "SECRET/KEY" of the Secret key that container of
// Deployment d sees at file (a volumeMount of a Secret volume with items),
// or "".
func mountedFrom(d *unstructured.Unstructured, container, file string) string {
	spec, _, _ := unstructured.NestedMap(d.Object, "spec", "template", "spec")
	vols, _ := spec["volumes"].([]any)
	cs, _ := spec["containers"].([]any)
	for _, c := range cs {
		cm := c.(map[string]any)
		if cm["name"] != container {
			continue
		}
		mounts, _ := cm["volumeMounts"].([]any)
		for _, m := range mounts {
			mm := m.(map[string]any)
			rel, ok := strings.CutPrefix(file, fmt.Sprint(mm["mountPath"])+"/")
			if !ok {
				continue
			}
			for _, vol := range vols {
				vm := vol.(map[string]any)
				if vm["name"] != mm["name"] {
					continue
				}
				sec, _ := vm["secret"].(map[string]any)
				if sec == nil {
					return ""
				}
				items, _ := sec["items"].([]any)
				for _, it := range items {
					im := it.(map[string]any)
					if im["path"] == rel {
						return fmt.Sprintf("%v/%v", sec["secretName"], im["key"])
					}
				}
				if len(items) == 0 {
					return fmt.Sprintf("%v/%s", sec["secretName"], rel)
				}
			}
		}
	}
	return ""
}

// clientCertFiles writes the client certificate and key of Secret
// tessera-scheduler-client-tls to files and points every extender entry's
// tlsConfig at them, as the mount at clientDir does in a pod.
func clientCertFiles(t *testing.T, objs []*unstructured.Unstructured, cfg map[string]any) {
	t.Helper()
	secret := find(objs, "Secret", releaseNS, "tessera-scheduler-client-tls")
	if secret == nil {
		t.Fatal("no Secret tessera-scheduler-client-tls")
	}
	data, _, _ := unstructured.NestedStringMap(secret.Object, "data")
	dir := t.TempDir()
	files := map[string]string{}
	for _, k := range []string{"tls.crt", "tls.key"} {
		raw, err := base64.StdEncoding.DecodeString(data[k])
		if err != nil {
			t.Fatalf("Secret tessera-scheduler-client-tls %s: %v", k, err)
		}
		files[k] = filepath.Join(dir, k)
		if err := os.WriteFile(files[k], raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exts, _ := cfg["extenders"].([]any)
	for _, e := range exts {
		if tc, _ := e.(map[string]any)["tlsConfig"].(map[string]any); tc != nil {
			tc["certFile"], tc["keyFile"] = files["tls.crt"], files["tls.key"]
		}
	}
}

// verifyServing checks that the base64 PEM certificate crt is signed by
// the base64 PEM CA ca and valid for serving dnsName.
func verifyServing(ca, crt, dnsName string) error {
	return verifyCert(ca, crt, dnsName, x509.ExtKeyUsageServerAuth)
}

// verifyCert checks that the base64 PEM certificate crt is signed by the
// base64 PEM CA ca and valid for usage (and dnsName, when not empty).
func verifyCert(ca, crt, dnsName string, usage x509.ExtKeyUsage) error {
	decode := func(what, b64 string) (*x509.Certificate, error) {
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		block, _ := pem.Decode(raw)
		if block == nil {
			return nil, fmt.Errorf("%s: no PEM block", what)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		return c, nil
	}
	caCert, err := decode("ca.crt", ca)
	if err != nil {
		return err
	}
	cert, err := decode("tls.crt", crt)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, DNSName: dnsName, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("the certificate does not verify for %q (usage %v) against the generated CA: %w", dnsName, usage, err)
	}
	return nil
}

// schedulerConfig is the KubeSchedulerConfiguration of the ConfigMap
// tessera-scheduler-config.
func schedulerConfig(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	var cm *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && o.GetName() == "tessera-scheduler-config" {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap tessera-scheduler-config")
	}
	raw, _, _ := unstructured.NestedString(cm.Object, "data", "scheduler-config.yaml")
	var cfg map[string]any
	if err := yaml.UnmarshalStrict([]byte(raw), &cfg); err != nil {
		t.Fatalf("ConfigMap tessera-scheduler-config: scheduler-config.yaml: %v", err)
	}
	if cfg["kind"] != "KubeSchedulerConfiguration" {
		t.Fatalf("ConfigMap tessera-scheduler-config holds a %v", cfg["kind"])
	}
	return cfg
}

// dryRunApply server-side applies o with dryRun=All.
func dryRunApply(ctx context.Context, dyn dynamic.Interface, mapper meta.RESTMapper, o *unstructured.Unstructured) error {
	gvk := o.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("no API for %s: %w", gvk, err)
	}
	var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = releaseNS // where helm install -n puts it
		}
		ri = dyn.Resource(m.Resource).Namespace(ns)
	}
	_, err = ri.Apply(ctx, o.GetName(), o, metav1.ApplyOptions{FieldManager: fieldManager, Force: true, DryRun: []string{metav1.DryRunAll}})
	return err
}

func newMapper(cp *controlplane.ControlPlane) (meta.RESTMapper, error) {
	dc, err := discovery.NewDiscoveryClientForConfig(cp.RESTConfig())
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return nil, fmt.Errorf("discover API resources: %w", err)
	}
	return restmapper.NewDiscoveryRESTMapper(groups), nil
}

// render runs helm template on chart (release tessera in tessera-system,
// CRDs included) and returns every object.
func render(t *testing.T, helm, repo, chart string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	all := append([]string{"template", "tessera", chart, "--namespace", releaseNS, "--include-crds", "--kube-version", kubeVersion}, args...)
	stdout, stderr, err := runHelm(helm, repo, all...)
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(all, " "), err, stderr)
	}
	objs, err := decode(stdout)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(all, " "), err)
	}
	if len(objs) == 0 {
		t.Fatalf("helm %s rendered nothing", strings.Join(all, " "))
	}
	return objs
}

func runHelm(helm, dir string, args ...string) (string, string, error) {
	cmd := exec.Command(helm, args...)
	cmd.Dir = dir
	// No repositories, plugins or caches of the machine's user.
	home := os.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "tessera-test-helm", "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "tessera-test-helm", "cache"), "HELM_DATA_HOME="+filepath.Join(home, "tessera-test-helm", "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// decode splits a YAML stream into objects, skipping empty documents.
func decode(stream string) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	var out []*unstructured.Unstructured
	for i := 1; ; i++ {
		var obj map[string]any
		err := d.Decode(&obj)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" || u.GetName() == "" {
			return nil, fmt.Errorf("document %d has no apiVersion, kind or name", i)
		}
		out = append(out, u)
	}
}

func key(o *unstructured.Unstructured) string {
	return o.GetKind() + "/" + o.GetNamespace() + "/" + o.GetName()
}

func find(objs []*unstructured.Unstructured, kind, ns, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetNamespace() == ns && o.GetName() == name {
			return o
		}
	}
	return nil
}

func crdsOf(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "CustomResourceDefinition" {
			out = append(out, o)
		}
	}
	return out
}

func sameObjects(a, b []*unstructured.Unstructured) bool {
	return slices.EqualFunc(a, b, func(x, y *unstructured.Unstructured) bool {
		jx, errx := x.MarshalJSON()
		jy, erry := y.MarshalJSON()
		return errx == nil && erry == nil && bytes.Equal(jx, jy)
	})
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func repoRoot(t *testing.T) string {
	t.Helper()
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

// helmBinary returns $TESSERA_TEST_HELM, or the helm that hack/tools'
// go.mod pins (install.HelmBinary).
func helmBinary(t *testing.T, repo string) string {
	t.Helper()
	helm, err := install.HelmBinary(repo)
	if err != nil {
		t.Fatal(err)
	}
	return helm
}

// copyChart copies the chart directory to a temporary one.
func copyChart(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "tessera")
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, raw, 0o644)
	})
	if err != nil {
		t.Fatalf("copy chart %s: %v", src, err)
	}
	return dst
}
