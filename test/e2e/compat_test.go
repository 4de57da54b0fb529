package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

// TestNVIDIAGPUCompat installs the chart's webhooks with
// extender.webhooks.nvidiaGPU=true (rendered by helm, pointed at the test
// extender) and runs a pod written for NVIDIA's device plugin: it asks
// nvidia.com/gpu, is created asking tessera.dev/gpu, and runs on Tessera's
// GPUs with exactly them visible. A pod asking both names is refused at
// creation.
func TestNVIDIAGPUCompat(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	ctx := t.Context()
	// The extender's address and CA, as the installed webhooks name them.
	gang, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "tessera-gang", metav1.GetOptions{})
	if err != nil || len(gang.Webhooks) == 0 || gang.Webhooks[0].ClientConfig.URL == nil {
		t.Fatalf("tessera-gang webhook configuration: %v", err)
	}
	cc := gang.Webhooks[0].ClientConfig
	base := strings.TrimSuffix(*cc.URL, "/admission/gang")
	old, err := install.ChartWebhooks(ctx, c.CP.RESTConfig(), repoRoot(), base, cc.CABundle, "extender.webhooks.nvidiaGPU=true")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// t.Context() has ended by now.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := install.RestoreWebhooks(ctx, c.CP.RESTConfig(), "tessera-gang", old); err != nil {
			t.Errorf("restore the webhooks: %v", err)
		}
	})
	ns := namespace(t, c, "compat")
	nvidia := func(name string, extra v1.ResourceList) *v1.Pod {
		rl := v1.ResourceList{api.ResourceNVIDIAGPU: resource.MustParse("2")}
		for k, v := range extra {
			rl[k] = v
		}
		return &v1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: v1.PodSpec{TerminationGracePeriodSeconds: new(int64), Containers: []v1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10", Resources: v1.ResourceRequirements{Limits: rl}}}},
		}
	}
	// The webhook is called once the API server has read the new
	// configuration: retry the create until the pod comes back renamed.
	var created *v1.Pod
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := client.CoreV1().Pods(ns).Create(ctx, nvidia("cuda", nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil && p.Spec.Containers[0].Resources.Limits[api.ResourceGPU] == resource.MustParse("2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the compatibility webhook is not called: last dry run %v %v", err, p)
		}
		time.Sleep(200 * time.Millisecond)
	}
	created, err = client.CoreV1().Pods(ns).Create(ctx, nvidia("cuda", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lim := created.Spec.Containers[0].Resources.Limits
	if _, ok := lim[api.ResourceNVIDIAGPU]; ok || lim[api.ResourceGPU] != resource.MustParse("2") {
		t.Fatalf("created pod's limits = %v, want tessera.dev/gpu: 2 and no nvidia.com/gpu", lim)
	}
	_, rec := waitRunning(t, c, ns, "cuda", time.Minute)
	ctr := rec.Containers[0]
	gpus := ctr.Allocated[string(api.ResourceGPU)]
	visible := strings.Split(ctr.Env[api.EnvNVIDIAVisibleDevices], ",")
	if len(gpus) != 2 || len(visible) != 2 {
		t.Fatalf("container got %v, sees %v: want 2 GPUs", gpus, visible)
	}
	for _, g := range gpus {
		if !strings.Contains(ctr.Env[api.EnvNVIDIAVisibleDevices], g) {
			t.Errorf("GPU %s allocated but not visible (%s)", g, ctr.Env[api.EnvNVIDIAVisibleDevices])
		}
	}
	t.Logf("pod asking nvidia.com/gpu: 2 runs on %s with GPUs %v visible", rec.Node, visible)

	_, err = client.CoreV1().Pods(ns).Create(ctx, nvidia("both", v1.ResourceList{api.ResourceGPU: resource.MustParse("1")}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "asks for both nvidia.com/gpu and tessera.dev/gpu") {
		t.Fatalf("a pod asking both names: %v, want refused", err)
	}
	deleteAll(t, c, ns)
}
