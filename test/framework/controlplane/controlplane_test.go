package controlplane_test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

const fooResource = v1.ResourceName("example.com/foo")

func fooPod(name, schedulerName string, count int64) *v1.Pod {
	q := *resource.NewQuantity(count, resource.DecimalSI)
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PodSpec{
			SchedulerName: schedulerName,
			Containers: []v1.Container{{
				Name:  "c",
				Image: "registry.k8s.io/pause:3.10",
				Resources: v1.ResourceRequirements{
					Requests: v1.ResourceList{fooResource: q},
					Limits:   v1.ResourceList{fooResource: q},
				},
			}},
		},
	}
}

// TestSchedulerBindsExtendedResourcePods runs etcd, kube-apiserver and
// kube-scheduler (with a configuration file that adds a second profile), makes
// a Node with 4 example.com/foo and checks that the real scheduler binds a pod
// asking for 1 (through either profile) and leaves one asking for 5 Pending
// as Insufficient.
func TestSchedulerBindsExtendedResourcePods(t *testing.T) {
	schedCfg := filepath.Join(t.TempDir(), "scheduler.yaml")
	if err := os.WriteFile(schedCfg, []byte(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
profiles:
- schedulerName: default-scheduler
- schedulerName: tessera-test-scheduler
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cp := controlplane.StartForTest(t, controlplane.Options{
		Scheduler: &controlplane.SchedulerOptions{ConfigFile: schedCfg},
	})
	ctx := t.Context()
	client := cp.Client()

	node, err := cp.CreateReadyNode(ctx, controlplane.NodeOptions{
		Name:        "node-a",
		Labels:      map[string]string{"tessera.io/test": "yes"},
		Annotations: map[string]string{"tessera.io/note": "made by the harness"},
		Capacity:    v1.ResourceList{fooResource: resource.MustParse("4")},
	})
	if err != nil {
		t.Fatal(err)
	}
	node, err = client.CoreV1().Nodes().Get(ctx, node.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Status.Allocatable[fooResource]; got.Value() != 4 {
		t.Errorf("node allocatable %s = %s, want 4", fooResource, got.String())
	}
	if node.Labels["tessera.io/test"] != "yes" || node.Annotations["tessera.io/note"] != "made by the harness" {
		t.Errorf("node labels/annotations not kept: %v %v", node.Labels, node.Annotations)
	}
	if len(node.Spec.Taints) != 0 {
		t.Errorf("node taints = %v, want none (not-ready taint removed)", node.Spec.Taints)
	}
	ready := false
	for _, c := range node.Status.Conditions {
		if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
			ready = true
		}
	}
	if !ready {
		t.Errorf("node has no Ready=True condition: %v", node.Status.Conditions)
	}

	bound := func(p *v1.Pod) (bool, error) { return p.Spec.NodeName != "", nil }
	for _, pod := range []*v1.Pod{fooPod("fits", "", 1), fooPod("fits-second-profile", "tessera-test-scheduler", 1)} {
		if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", pod.Name, err)
		}
		got, err := cp.WaitForPod(ctx, "default", pod.Name, "bound", 60*time.Second, bound)
		if err != nil {
			t.Fatal(err)
		}
		if got.Spec.NodeName != "node-a" {
			t.Errorf("pod %s bound to %q, want node-a", pod.Name, got.Spec.NodeName)
		}
	}

	if _, err := client.CoreV1().Pods("default").Create(ctx, fooPod("too-big", "", 5), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	unschedulable := func(p *v1.Pod) (bool, error) {
		for _, c := range p.Status.Conditions {
			if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse && c.Reason == v1.PodReasonUnschedulable {
				return true, nil
			}
		}
		return false, nil
	}
	got, err := cp.WaitForPod(ctx, "default", "too-big", "marked Unschedulable", 60*time.Second, unschedulable)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range got.Status.Conditions {
		if c.Type == v1.PodScheduled && !strings.Contains(c.Message, "Insufficient example.com/foo") {
			t.Errorf("PodScheduled condition message %q does not mention Insufficient example.com/foo", c.Message)
		}
	}
	if got.Spec.NodeName != "" || got.Status.Phase != v1.PodPending {
		t.Errorf("pod too-big: nodeName=%q phase=%s, want unbound and Pending", got.Spec.NodeName, got.Status.Phase)
	}
	waitForFailedSchedulingEvent(ctx, t, cp, "too-big")

	// Stop really stops: the API server is gone and the directory removed.
	dir := cp.Dir()
	if err := cp.Stop(); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("control plane dir %s still there after Stop (stat: %v)", dir, err)
	}
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	if resp, err := hc.Get(cp.APIServerURL + "/readyz"); err == nil {
		resp.Body.Close()
		t.Errorf("API server %s still answers after Stop: %s", cp.APIServerURL, resp.Status)
	}
}

func waitForFailedSchedulingEvent(ctx context.Context, t *testing.T, cp *controlplane.ControlPlane, pod string) {
	t.Helper()
	selector := fields.Set{"involvedObject.name": pod, "reason": "FailedScheduling"}.String()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, err := cp.Client().CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil {
			t.Fatalf("list events: %v", err)
		}
		for _, e := range evs.Items {
			if strings.Contains(e.Message, "Insufficient example.com/foo") {
				t.Logf("FailedScheduling event: %s", e.Message)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no FailedScheduling event mentioning Insufficient example.com/foo for pod %s within 30s (events: %v)", pod, evs.Items)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
