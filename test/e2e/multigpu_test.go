package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/tessera-gpu/tessera/api"
)

// A pod with tessera.dev/gpu-count "2" asking 16 GiB and 40 % runs with
// 8 GiB and 20 % on each of two distinct GPUs of its node, each isolated
// as a single slice is (its own MPS memory limit per device ordinal, only
// its two GPUs visible and allowed, the pipe directory of one MPS daemon
// that serves exactly those two GPUs). A second such pod on the node
// joins the same set (its daemon is not restarted); a slice of one GPU
// stays off the set; a count that does not split is refused at creation
// with the reason; no GPU is over-committed afterwards, and the set's
// daemon quits with its last tenant.
func TestMultiGPUSlice(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-multigpu")
	two := map[string]string{api.AnnotationGPUCount: "2"}
	create(t, c.Client(), ns, podSpec{name: "train", memUnits: 16, cores: 40, annotations: two})
	// The count that does not split: refused at creation, saying why (it
	// was refused at filter, in FailedScheduling events, until 2026-11-29).
	uneven := podSpec{name: "uneven", memUnits: 3, cores: 40, annotations: map[string]string{api.AnnotationGPUCount: "2"}}
	if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), uneven.pod(ns), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "split evenly") {
		t.Errorf("create pod uneven = %v, want a refusal with the even-split reason", err)
	}

	p, rec := waitRunning(t, c, ns, "train", 90*time.Second)
	p, ca := waitAssignment(t, c, p, "main", 0)
	if ca == nil || ca.Shared == nil {
		t.Fatalf("pod train: no shared slice in its assignment: %+v", ca)
	}
	node := p.Spec.NodeName
	inv := inventory(t, c, node)
	gpus := ca.Shared.GPUs()
	if len(gpus) != 2 || gpus[0].UUID == gpus[1].UUID {
		t.Fatalf("pod train: slice on GPUs %+v, want two distinct GPUs", gpus)
	}
	if want := 8 * int64(inv.MemoryUnitMiB); ca.Shared.MemoryMiB != want || ca.Shared.Cores != 20 {
		t.Errorf("pod train: %d MiB and %d%% on each GPU, want %d MiB (8 units) and 20%%", ca.Shared.MemoryMiB, ca.Shared.Cores, want)
	}
	// Devices, cgroup, NVIDIA_VISIBLE_DEVICES, cpuset and one memory limit
	// per device ordinal, as for a single slice.
	checkIsolated(t, c, p, rec, "main")
	cr := rec.Container("main")
	if cr == nil {
		t.Fatalf("pod train: no node record of container main")
	}
	perGPU := 8 * int64(inv.MemoryUnitMiB)
	for k, v := range map[string]string{
		api.EnvMPSPinnedDeviceMemLimit:   fmt.Sprintf("0=%dM,1=%dM", perGPU, perGPU),
		api.EnvMPSActiveThreadPercentage: "20",
		api.EnvGPUUUIDs:                  gpus[0].UUID + "," + gpus[1].UUID,
	} {
		if cr.Env[k] != v {
			t.Errorf("pod train: %s=%q, want %q", k, cr.Env[k], v)
		}
	}
	pipe := mpsPipe(t, cr.Mounts)
	if !strings.HasPrefix(filepath.Base(pipe), "set-") {
		t.Errorf("pod train: MPS pipe directory %s, want the set's (set-<hash>)", pipe)
	}
	// The set's daemon runs and sees exactly the two GPUs.
	if fi, err := os.Stat(filepath.Join(pipe, "control")); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("pod train: no MPS control pipe in %s (%v)", pipe, err)
	}
	logDir := filepath.Join(filepath.Dir(filepath.Dir(pipe)), "log", filepath.Base(pipe))
	t.Logf("train on %s GPUs %d and %d: %s=%s %s=%s, MPS pipe %s", node, gpus[0].Index, gpus[1].Index,
		api.EnvMPSPinnedDeviceMemLimit, cr.Env[api.EnvMPSPinnedDeviceMemLimit], api.EnvMPSActiveThreadPercentage, cr.Env[api.EnvMPSActiveThreadPercentage], pipe)
	started := readFileLines(t, filepath.Join(logDir, "started"))
	if len(started) != 1 || !strings.Contains(started[0], "visible="+gpus[0].UUID+","+gpus[1].UUID+" ") {
		t.Errorf("pod train: the set's daemon started %q, want once with CUDA_VISIBLE_DEVICES of both GPUs", started)
	}

	// A second gpu-count 2 pod on the node joins the set; a slice of one
	// GPU goes elsewhere.
	create(t, c.Client(), ns, podSpec{name: "train2", memUnits: 4, cores: 20, annotations: two, node: node})
	create(t, c.Client(), ns, podSpec{name: "single", memUnits: 2, cores: 10, node: node})
	p2, rec2 := waitRunning(t, c, ns, "train2", 90*time.Second)
	if p2, ca2 := waitAssignment(t, c, p2, "main", 0); ca2 != nil && ca2.Shared != nil {
		if got := ca2.Shared.GPUs(); !slices.Equal(got, gpus) {
			t.Errorf("pod train2 on GPUs %+v, want the set %+v", got, gpus)
		}
		checkIsolated(t, c, p2, rec2, "main")
		if got := mpsPipe(t, rec2.Container("main").Mounts); got != pipe {
			t.Errorf("pod train2: MPS pipe directory %s, want the set's %s", got, pipe)
		}
	}
	ps, recS := waitRunning(t, c, ns, "single", 90*time.Second)
	if ps, caS := waitAssignment(t, c, ps, "main", 0); caS != nil && caS.Shared != nil {
		if slices.ContainsFunc(gpus, func(g api.GPURef) bool { return g.UUID == caS.Shared.GPU.UUID }) {
			t.Errorf("pod single on GPU %+v, one of the set %+v", caS.Shared.GPU, gpus)
		}
		checkIsolated(t, c, ps, recS, "main")
	}
	if n := len(readFileLines(t, filepath.Join(logDir, "started"))); n != 1 {
		t.Errorf("the set's daemon started %d times, want once (not restarted for a new tenant)", n)
	}

	// A pod that bypasses the extender (spec.nodeName, as an admin may):
	// the NRI plugin places its two GPUs by the same rule and records them
	// in its sealed assignment.
	direct := podSpec{name: "direct", memUnits: 4, cores: 10, annotations: two}.pod(ns)
	for _, n := range c.Nodes() {
		if n.Name != node {
			direct.Spec.NodeName = n.Name
			break
		}
	}
	if _, err := c.Client().CoreV1().Pods(ns).Create(t.Context(), direct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pd, recD := waitRunning(t, c, ns, "direct", 90*time.Second)
	if pd, caD := waitAssignment(t, c, pd, "main", 0); caD != nil && caD.Shared != nil {
		if g := caD.Shared.GPUs(); len(g) != 2 || caD.Shared.MemoryMiB != 2*int64(inventory(t, c, pd.Spec.NodeName).MemoryUnitMiB) || caD.Shared.Cores != 5 {
			t.Errorf("pod direct: placed on the node as %+v, want 2 units and 5%% on each of two GPUs", caD.Shared)
		}
		checkIsolated(t, c, pd, recD, "main")
	}

	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	for _, g := range gpus {
		if u := occ[node][g.UUID]; u == nil || !slices.Contains(u.shared, ns+"/train/main") || !slices.Contains(u.shared, ns+"/train2/main") {
			t.Errorf("GPU %d of node %s: shared by %v, want train and train2", g.Index, node, u)
		}
	}
	checkRunningPods(t, c, pods)

	// The set's last tenants leave: its daemon quits.
	for _, name := range []string{"train", "train2"} {
		if err := c.Client().CoreV1().Pods(ns).Delete(t.Context(), name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		return len(readFileLines(t, filepath.Join(logDir, "quit"))) == 1, nil
	})
	if err != nil {
		t.Errorf("the set's daemon did not quit after its tenants were deleted: %v (log dir %s)", err, logDir)
	}
}

// mpsPipe is the host directory mounted at the MPS pipe path, from a
// node record's mounts ("source -> destination").
func mpsPipe(t *testing.T, mounts []string) string {
	t.Helper()
	for _, m := range mounts {
		if src, ok := strings.CutSuffix(m, " -> "+api.MPSPipeMountPath); ok {
			return src
		}
	}
	t.Errorf("no mount at %s: %v", api.MPSPipeMountPath, mounts)
	return ""
}

// readFileLines returns the lines of path, none when it does not exist.
func readFileLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	text := strings.TrimRight(string(b), "\n")
	if text == "" {
		return nil
	}
	return strings.Split(text, "\n")
}
