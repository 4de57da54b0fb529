package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// EnvHelm names a helm binary to use instead of hack/tools' (go tool helm).
const EnvHelm = "TESSERA_TEST_HELM"

// HelmBinary returns $TESSERA_TEST_HELM, or the helm that hack/tools'
// go.mod pins, built (or found in the build cache) by go tool.
func HelmBinary(repoRoot string) (string, error) {
	if p := os.Getenv(EnvHelm); p != "" {
		return p, nil
	}
	cmd := exec.Command("go", "tool", "-n", "helm")
	cmd.Dir = filepath.Join(repoRoot, "hack", "tools")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build helm from hack/tools (go tool -n helm; or set %s): %w\n%s", EnvHelm, err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// KubeVersion is the test cluster's Kubernetes version (test/go.mod's
// k8s.io/kubernetes), for the chart's kubeVersion constraint.
const KubeVersion = "v1.34.2"

// RenderChart runs `helm template tessera charts/tessera` in the
// namespace tessera-system for KubeVersion with args and returns the
// output.
func RenderChart(helm, repoRoot string, args ...string) ([]byte, error) {
	all := append([]string{"template", "tessera", filepath.Join(repoRoot, "charts", "tessera"), "--namespace", "tessera-system", "--kube-version", KubeVersion}, args...)
	cmd := exec.Command(helm, all...)
	home := filepath.Join(os.TempDir(), "tessera-test-helm")
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_DATA_HOME="+filepath.Join(home, "data"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("helm %s: %w\n%s", strings.Join(all, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// ChartWebhooks renders the chart's MutatingWebhookConfiguration
// tessera-gang with set (helm --set values), points its webhooks at
// baseURL with caPEM as the test cluster has no Service, and creates it or
// replaces the one in the cluster. It returns the configuration as it was
// before (nil when there was none), to restore with RestoreWebhooks.
func ChartWebhooks(ctx context.Context, cfg *rest.Config, repoRoot, baseURL string, caPEM []byte, set string) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	helm, err := HelmBinary(repoRoot)
	if err != nil {
		return nil, err
	}
	out, err := RenderChart(helm, repoRoot, "--set", set, "--show-only", "templates/extender/webhook.yaml")
	if err != nil {
		return nil, err
	}
	var whc admissionregistrationv1.MutatingWebhookConfiguration
	for i, doc := range splitDocuments(out) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("rendered webhook document %d: %w", i+1, err)
		}
		if meta.Kind == "MutatingWebhookConfiguration" {
			if err := yaml.UnmarshalStrict(doc, &whc); err != nil {
				return nil, fmt.Errorf("rendered webhook document %d: %w", i+1, err)
			}
		}
	}
	if whc.Name == "" {
		return nil, fmt.Errorf("the chart rendered no MutatingWebhookConfiguration with %s", set)
	}
	for j := range whc.Webhooks {
		w := &whc.Webhooks[j]
		if w.ClientConfig.Service == nil || w.ClientConfig.Service.Path == nil {
			return nil, fmt.Errorf("rendered webhook %s has no service path", w.Name)
		}
		url := strings.TrimSuffix(baseURL, "/") + *w.ClientConfig.Service.Path
		w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: slices.Clone(caPEM)}
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	api := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	old, err := api.Get(ctx, whc.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		old = nil
		_, err = api.Create(ctx, &whc, metav1.CreateOptions{})
	case err == nil:
		whc.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, &whc, metav1.UpdateOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("install the chart's MutatingWebhookConfiguration %s: %w", whc.Name, err)
	}
	return old, nil
}

// RestoreWebhooks puts back the configuration ChartWebhooks replaced (old
// nil: deletes name).
func RestoreWebhooks(ctx context.Context, cfg *rest.Config, name string, old *admissionregistrationv1.MutatingWebhookConfiguration) error {
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	api := client.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if old == nil {
		return api.Delete(ctx, name, metav1.DeleteOptions{})
	}
	cur, err := api.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	restored := old.DeepCopy()
	restored.ResourceVersion = cur.ResourceVersion
	_, err = api.Update(ctx, restored, metav1.UpdateOptions{})
	return err
}
