package install

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
)

// DeployURL is the extender address in deploy/extender's scheduler
// configuration: its Service.
const DeployURL = "http://tessera-extender.kube-system.svc:8888"

// SchedulerConfig writes to dst deploy/extender/scheduler-config.yaml with
// every extender whose urlPrefix is DeployURL pointed at url instead (the
// test cluster has no Service). With an https url, those extenders also
// get enableHTTPS and tlsConfig: caData = t's CA, and certFile and keyFile
// = t's client certificate for kube-scheduler (for an extender started
// with --verbs-client-ca), as an install that serves the extender over
// HTTPS configures them. Nothing else changes. t may be nil for an http
// url.
func SchedulerConfig(repoRoot, dst, url string, t *TLS) error {
	const rel = "deploy/extender/scheduler-config.yaml"
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		return fmt.Errorf("read %s: %w", rel, err)
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	exts, _ := cfg["extenders"].([]any)
	https := strings.HasPrefix(url, "https://")
	if https && (t == nil || len(t.CAPEM) == 0) {
		return fmt.Errorf("scheduler config: %s needs the CA of the extender's certificate", url)
	}
	n := 0
	for _, e := range exts {
		m, ok := e.(map[string]any)
		if !ok || m["urlPrefix"] != DeployURL {
			continue
		}
		m["urlPrefix"] = url
		if https {
			m["enableHTTPS"] = true
			tc := map[string]any{"caData": base64.StdEncoding.EncodeToString(t.CAPEM)}
			if t.ClientCertFile != "" {
				tc["certFile"], tc["keyFile"] = t.ClientCertFile, t.ClientKeyFile
			}
			m["tlsConfig"] = tc
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s: no extender with urlPrefix %s", rel, DeployURL)
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

// GangWebhook creates the MutatingWebhookConfiguration of
// deploy/extender/webhook.yaml with each webhook's clientConfig pointed at
// baseURL (e.g. https://127.0.0.1:PORT) plus the path of its Service
// reference, trusting caPEM; rules, matchConditions, namespaceSelector,
// failurePolicy and every other field stay as deployed. It waits until the
// API server calls the webhook: a dry-run create of a gang member in the
// default namespace comes back gated.
func GangWebhook(ctx context.Context, cfg *rest.Config, repoRoot, baseURL string, caPEM []byte) error {
	const rel = "deploy/extender/webhook.yaml"
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		return fmt.Errorf("read %s: %w", rel, err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("clientset: %w", err)
	}
	created := 0
	for i, doc := range splitDocuments(raw) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return fmt.Errorf("%s document %d: %w", rel, i+1, err)
		}
		if meta.Kind != "MutatingWebhookConfiguration" {
			continue
		}
		var whc admissionregistrationv1.MutatingWebhookConfiguration
		if err := yaml.UnmarshalStrict(doc, &whc); err != nil {
			return fmt.Errorf("%s document %d: %w", rel, i+1, err)
		}
		for j := range whc.Webhooks {
			w := &whc.Webhooks[j]
			svc := w.ClientConfig.Service
			if svc == nil || svc.Path == nil {
				return fmt.Errorf("%s: webhook %s has no service path to keep", rel, w.Name)
			}
			url := strings.TrimSuffix(baseURL, "/") + *svc.Path
			w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: slices.Clone(caPEM)}
		}
		if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &whc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create MutatingWebhookConfiguration %s: %w", whc.Name, err)
		}
		created++
	}
	if created == 0 {
		return fmt.Errorf("%s holds no MutatingWebhookConfiguration", rel)
	}
	probe := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "tessera-webhook-probe", Namespace: "default",
			Annotations: map[string]string{api.AnnotationGang: "probe", api.AnnotationGangMinMember: "1"}},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("scheduling gates %v", p.Spec.SchedulingGates)
		return api.HasGangGate(p), nil
	})
	if err != nil {
		return fmt.Errorf("the gang webhook of %s is not called: %w (last dry-run create: %s)", rel, err, last)
	}
	return nil
}
