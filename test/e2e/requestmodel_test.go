package e2e

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// A core-only pod (tessera.dev/gpu-core, no tessera.dev/gpu-memory) runs,
// through the extender and bypassing it: its slice's memory is cores% of
// its node's slice base (package gpureq: the smallest shared capacity of the
// node's GPUs, rounded up), the amount the extender documents, and the NRI
// plugin gives the container that amount as its MPS memory limit. Before
// the request model was one, the extender placed such a pod and the NRI
// plugin refused it.
func TestCoreOnlyPodRuns(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-core-only")
	create(t, c.Client(), ns, podSpec{name: "scheduled", cores: 30})
	direct := podSpec{name: "direct", cores: 20}.pod(ns)
	direct.Spec.NodeName = c.Nodes()[0].Name // bypasses the extender: placed by the NRI plugin
	if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), direct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pod   string
		cores int64
	}{{"scheduled", 30}, {"direct", 20}} {
		p, rec := waitRunning(t, c, ns, tc.pod, 90*time.Second)
		p, ca := waitAssignment(t, c, p, "main", 0)
		if ca == nil {
			continue
		}
		if ca.Shared == nil {
			t.Errorf("pod %s: container main has no shared slice: %+v", tc.pod, ca)
			continue
		}
		inv := inventory(t, c, p.Spec.NodeName)
		caps := make([]int64, 0, len(inv.GPUs))
		for _, g := range inv.GPUs {
			caps = append(caps, int64(g.MemoryUnits)*int64(inv.MemoryUnitMiB))
		}
		want := gpureq.Resolve(gpureq.Container{Cores: tc.cores}, int64(inv.MemoryUnitMiB), gpureq.CoreOnlyBaseMiB(caps...))
		if want.MemMiB == 0 {
			t.Fatalf("pod %s: node %s shares no GPU memory: %+v", tc.pod, p.Spec.NodeName, inv)
		}
		if got := (gpureq.Amount{MemMiB: ca.Shared.MemoryMiB, Cores: ca.Shared.Cores}); got != want {
			t.Errorf("pod %s on %s: slice %+v, want %+v (%d%% of the node's slice base)", tc.pod, p.Spec.NodeName, got, want, tc.cores)
		}
		// The limits the container got are its assignment's.
		checkIsolated(t, c, p, rec, "main")
		if got := rec.Container("main").Env[api.EnvGPUMemoryLimitMiB]; got == "" {
			t.Errorf("pod %s: no %s", tc.pod, api.EnvGPUMemoryLimitMiB)
		}
	}
}
