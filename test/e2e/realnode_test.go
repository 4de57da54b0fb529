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

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
	"github.com/tessera-gpu/tessera/test/framework/realnode"
)

// realNodeName is the real node's name in these tests.
const realNodeName = "real-1"

// startRealNode starts a cluster of its own (one simulated node, sim-1)
// and a real node beside it: kubelet, containerd, runc, CNI, tessera-node.
func startRealNode(ctx context.Context, t *testing.T, ns string, o realnode.Options) (*nodesim.Cluster, *realnode.Node) {
	t.Helper()
	_, agent, _, err := binaries()
	if err != nil {
		t.Fatal(err)
	}
	bins, err := realnode.BinsFromEnv(agent)
	if err != nil {
		t.Fatal(err)
	}
	c := ownCluster(ctx, t, ns, []nodesim.NodeSpec{{Name: "sim-1", Profile: "pcie-2numa"}})
	o.Name = realNodeName
	o.Dir = filepath.Join(c.Dir, "real", realNodeName)
	o.Bins = bins
	o.Kubeconfig, o.AgentKubeconfig = c.Kubeconfig(), c.AgentKubeconfig()
	o.Logf = t.Logf
	start := time.Now()
	n, err := realnode.Start(ctx, c.Client(), o)
	if n != nil || err == nil {
		t.Cleanup(func() {
			if t.Failed() {
				keepFailedLogs(t, n.LogFiles(), 1200)
			}
			n.Stop()
		})
	}
	if err != nil {
		t.Fatalf("real node: %v", err)
	}
	t.Logf("real node %s Ready in %s", realNodeName, time.Since(start).Round(time.Millisecond))
	return c, n
}

// realPod is s as a pod of the real node: the test image, never pulled,
// running script with sh, no service account token (the kubelet mounts it
// in its own mount namespace), not restarted.
func realPod(ns string, s podSpec, script string) *v1.Pod {
	s.node = realNodeName
	p := s.pod(ns)
	p.Spec.TerminationGracePeriodSeconds = nil
	p.Spec.RestartPolicy = v1.RestartPolicyNever
	p.Spec.AutomountServiceAccountToken = ptr.To(false)
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.Image, c.ImagePullPolicy = realnode.TestImage, v1.PullNever
		c.Command = []string{"/bin/sh", "-c", script}
	}
	return p
}

// inspectScript prints what a container sees: its NVIDIA device nodes,
// what opening each GPU's node gives (ENXIO: the device cgroup lets it
// through to a driver that is not there; EPERM: the cgroup denies it),
// for GPUs it was not given too (it makes their nodes itself), its MPS
// environment and its cpuset. Then it sleeps until told to stop.
const inspectScript = `echo "devices: $(ls /dev/nvidia* 2>&1 | tr '\n' ' ')"
i=0
while [ $i -lt %d ]; do
  n=/dev/nvidia$i
  [ -e $n ] || { mknod /tmp/nvidia$i c 195 $i; n=/tmp/nvidia$i; }
  echo "open $n: $(head -c1 $n 2>&1 >/dev/null | sed 's/.*: //')"
  i=$((i+1))
done
echo "env: $(env | grep -E '^(CUDA_|NVIDIA_|TESSERA_)' | sort | tr '\n' ' ')"
echo "cpuset: $(grep Cpus_allowed_list /proc/self/status | cut -f2) mems: $(grep Mems_allowed_list /proc/self/status | cut -f2)"
echo done
trap 'exit 0' TERM
sleep %d & wait
`

// withOutputCopy makes pod's container also write its output to
// dir/<pod name> on the node, a file that appears (renamed from .partial)
// only once the script has run to its end.
func withOutputCopy(p *v1.Pod, dir string) *v1.Pod {
	p.Spec.Volumes = append(p.Spec.Volumes, v1.Volume{Name: "out", VolumeSource: v1.VolumeSource{
		HostPath: &v1.HostPathVolumeSource{Path: dir, Type: ptr.To(v1.HostPathDirectoryOrCreate)},
	}})
	for i := range p.Spec.Containers {
		c := &p.Spec.Containers[i]
		c.VolumeMounts = append(c.VolumeMounts, v1.VolumeMount{Name: "out", MountPath: "/out"})
		f := "/out/" + p.Name
		c.Command = []string{"/bin/sh", "-c", fmt.Sprintf("( %s ) 2>&1 | tee %s.partial; mv %s.partial %s", c.Command[2], f, f, f)}
	}
	return p
}

// completedBeforeRestart reports whether a failed pod is the stock
// kubelet's kubernetes/kubernetes#117955 rather than a failure: its
// container ran its script to the end (withOutputCopy's file is there,
// with the "done" line), yet a restarted kubelet, which had not reported
// the completion, admitted the pod again, found its devices gone with the
// container and rejected it (UnexpectedAdmissionError). It returns the
// output, which the caller checks as it would the log.
func completedBeforeRestart(p *v1.Pod, dir string) (string, bool) {
	if p.Status.Phase != v1.PodFailed || p.Status.Reason != "UnexpectedAdmissionError" {
		return "", false
	}
	b, err := os.ReadFile(filepath.Join(dir, p.Name))
	if err != nil || !strings.Contains(string(b), "\ndone\n") {
		return "", false
	}
	return string(b), true
}

// containerLog returns a container's log (kubectl logs).
func containerLog(ctx context.Context, client kubernetes.Interface, ns, pod string) (string, error) {
	b, err := client.CoreV1().Pods(ns).GetLogs(pod, &v1.PodLogOptions{Container: "main"}).DoRaw(ctx)
	return string(b), err
}

// waitLog waits until a pod's log has the line "done" and returns the log.
func waitLog(t *testing.T, client kubernetes.Interface, ns, pod string, timeout time.Duration) string {
	t.Helper()
	var log string
	var last error
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		if p.Status.Phase == v1.PodFailed {
			return false, fmt.Errorf("pod %s failed: %s: %s", pod, p.Status.Reason, p.Status.Message)
		}
		if log, last = containerLog(ctx, client, ns, pod); last != nil {
			return false, nil
		}
		return strings.Contains(log, "\ndone\n"), nil
	})
	if err != nil {
		p, _ := client.CoreV1().Pods(ns).Get(t.Context(), pod, metav1.GetOptions{})
		t.Fatalf("pod %s: no complete log: %v (last: %v)\n%s\npod: %+v", pod, err, last, log, p)
	}
	return log
}

// waitContainersCreated waits (up to a minute) until every named pod's
// containers exist: each is running or has terminated, or the pod ended.
func waitContainersCreated(t *testing.T, client kubernetes.Interface, ns string, names []string) {
	t.Helper()
	var waiting []string
	err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		waiting = waiting[:0]
		for _, name := range names {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
				continue
			}
			created := len(p.Status.ContainerStatuses) == len(p.Spec.Containers)
			for _, c := range p.Status.ContainerStatuses {
				created = created && (c.State.Running != nil || c.State.Terminated != nil)
			}
			if !created {
				waiting = append(waiting, name)
			}
		}
		return len(waiting) == 0, nil
	})
	if err != nil {
		t.Fatalf("pods without their containers after a minute: %v", waiting)
	}
}

// logLine returns the value of the line "key: value".
func logLine(log, key string) string {
	for _, l := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(l, key+": "); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// TestRealNodeIsolation runs containers on a real kubelet + containerd +
// runc node and checks what each saw: exactly its GPUs' device nodes,
// other GPUs' nodes denied by the device cgroup, the MPS limits of a slice,
// the NUMA node's CPUs.
func TestRealNodeIsolation(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("a real node needs root")
	}
	ctx := t.Context()
	const ns = "e2e-realnode"
	// The node starts without a CDI spec for its GPUs (no NVIDIA Container
	// Toolkit spec yet): its agent offers none of them, so a GPU pod waits
	// unscheduled instead of failing on the node; the spec appears, and it
	// runs.
	c, n := startRealNode(ctx, t, ns, realnode.Options{NoCDISpec: true})
	client := c.Client()
	node, err := client.CoreV1().Nodes().Get(ctx, realNodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inv, _, err := api.GetGPUInventory(node.Annotations)
	if err != nil || inv == nil || len(inv.GPUs) != realnode.GPUs {
		t.Fatalf("inventory without a CDI spec: %v, %v", inv, err)
	}
	for _, g := range inv.GPUs {
		if g.Healthy || !strings.Contains(g.Reason, "CDI spec") {
			t.Errorf("GPU %d without a CDI spec: healthy=%v reason %q, want unhealthy for want of a CDI spec", g.Index, g.Healthy, g.Reason)
		}
	}
	t.Logf("without a CDI spec, GPU 0: %s", inv.GPUs[0].Reason)
	script := fmt.Sprintf(inspectScript, realnode.GPUs, 3600)
	if _, err := client.CoreV1().Pods(ns).Create(ctx, realPod(ns, podSpec{name: "early", gpus: 1}, script), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A GPU pod on a node without a CDI spec stays unscheduled, with a
	// reason.
	waitUnschedulable(t, client, ns, "early", 30*time.Second)
	if err := n.WriteCDISpec(); err != nil {
		t.Fatal(err)
	}
	wrote := time.Now()
	wantSaw(t, client, ns, "early", waitLog(t, client, ns, "early", 2*time.Minute))
	t.Logf("the spec written, the waiting GPU pod ran after %s", time.Since(wrote).Round(time.Millisecond))
	if err := client.CoreV1().Pods(ns).Delete(ctx, "early", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, ns, "early")

	for _, s := range []podSpec{
		{name: "whole", gpus: 1},
		{name: "slice", memUnits: 4, cores: 30},
		{name: "cpu-only"},
	} {
		if _, err := client.CoreV1().Pods(ns).Create(ctx, realPod(ns, s, script), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"whole", "slice", "cpu-only"} {
		log := waitLog(t, client, ns, name, 2*time.Minute)
		t.Logf("container %s saw:\n%s", name, log)
		var gpus []api.GPURef
		want := map[string]string{}
		if name != "cpu-only" {
			ca := waitRealAssignment(t, client, ns, name)
			gpus = ca.GPUs
			if ca.Shared != nil {
				gpus = ca.Shared.GPUs()
				want[api.EnvMPSPinnedDeviceMemLimit] = "0=4096M"
				want[api.EnvMPSActiveThreadPercentage] = "30"
				want[api.EnvMPSPipeDirectory] = api.MPSPipeMountPath
			}
		}
		// Every container's CPUs: those of its GPUs' NUMA node (CPU 0 on
		// this node's machine), or the kubelet's shared pool.
		cpus := "0-1"
		if len(gpus) > 0 {
			cpus = "0"
		}
		checkSaw(t, name, log, gpus, want, cpus)
	}
}

// checkSaw checks what inspectScript printed in a container that holds
// gpus: their device nodes and no other, each of them opened through the
// device cgroup and every other GPU's node denied by it, env, the cpuset.
func checkSaw(t *testing.T, pod, log string, gpus []api.GPURef, env map[string]string, cpus string) {
	t.Helper()
	mine := map[string]bool{}
	var wantNodes []string
	for _, g := range gpus {
		n := fmt.Sprintf("/dev/nvidia%d", g.Index)
		mine[n] = true
		wantNodes = append(wantNodes, n)
	}
	var nodes []string
	for _, d := range strings.Fields(logLine(log, "devices")) {
		if strings.TrimLeft(strings.TrimPrefix(d, "/dev/nvidia"), "0123456789") == "" && strings.HasPrefix(d, "/dev/nvidia") {
			nodes = append(nodes, d)
		}
	}
	if strings.Join(nodes, " ") != strings.Join(wantNodes, " ") {
		t.Errorf("pod %s: GPU device nodes %v, want exactly %v", pod, nodes, wantNodes)
	}
	for i := range realnode.GPUs {
		dev, tmp := fmt.Sprintf("/dev/nvidia%d", i), fmt.Sprintf("/tmp/nvidia%d", i)
		switch got := logLine(log, "open "+dev) + logLine(log, "open "+tmp); {
		case mine[dev] && got != "No such device or address":
			t.Errorf("pod %s: opening its GPU %s gave %q, want ENXIO (allowed by the device cgroup, no driver)", pod, dev, got)
		case !mine[dev] && got != "Operation not permitted":
			t.Errorf("pod %s: opening GPU %d, not its own, gave %q, want EPERM from the device cgroup", pod, i, got)
		}
	}
	gotEnv := map[string]string{}
	for _, kv := range strings.Fields(logLine(log, "env")) {
		k, v, _ := strings.Cut(kv, "=")
		gotEnv[k] = v
	}
	for k, v := range env {
		if gotEnv[k] != v {
			t.Errorf("pod %s: %s=%q, want %q", pod, k, gotEnv[k], v)
		}
	}
	if len(env) == 0 {
		for k := range gotEnv {
			if strings.HasPrefix(k, "CUDA_MPS_") {
				t.Errorf("pod %s holds no slice but has %s", pod, k)
			}
		}
	}
	if got, _, _ := strings.Cut(logLine(log, "cpuset"), " "); got != cpus {
		t.Errorf("pod %s: cpuset %q, want %q", pod, got, cpus)
	}
}

// shortScript is inspectScript ending after secs seconds.
func shortScript(secs int) string { return fmt.Sprintf(inspectScript, realnode.GPUs, secs) }

// asksGPUs reports a pod whose container main asks for a Tessera resource,
// as the request model reads it (gpureq: Containers lists those that do).
func asksGPUs(t *testing.T, p *v1.Pod) bool {
	t.Helper()
	d, err := gpureq.ParsePod(p)
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return slices.ContainsFunc(d.Containers, func(c gpureq.Container) bool { return c.Name == "main" })
}

// waitRealAssignment waits up to 30 s for the assignment of the pod's
// container main. A slice's comes with its Binding; whole GPUs are recorded
// by the node agent's next read of the kubelet, which may come after the
// container ran (the same race, on the simulated nodes, failed
// TestStatusPage in CI).
func waitRealAssignment(t *testing.T, client kubernetes.Interface, ns, name string) *api.ContainerAssignment {
	t.Helper()
	var ca *api.ContainerAssignment
	var raw string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		raw = p.Annotations[api.AnnotationAssignment]
		a, err := api.ParseAssignment(raw)
		if err != nil {
			return false, nil
		}
		ca = a.Container("main")
		return ca != nil, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s: no assignment of container main: %v: %q", ns, name, err, raw)
	}
	return ca
}

// wantSaw checks a finished or running pod's log against its assignment.
func wantSaw(t *testing.T, client kubernetes.Interface, ns, name, log string) {
	t.Helper()
	p, err := client.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var gpus []api.GPURef
	env := map[string]string{}
	if asksGPUs(t, p) {
		ca := waitRealAssignment(t, client, ns, name)
		gpus = ca.GPUs
		if ca.Shared != nil {
			gpus = ca.Shared.GPUs()
			env[api.EnvMPSPinnedDeviceMemLimit] = fmt.Sprintf("0=%dM", ca.Shared.MemoryMiB)
			env[api.EnvMPSActiveThreadPercentage] = fmt.Sprint(ca.Shared.Cores)
		}
	}
	cpus := "0-1"
	if len(gpus) > 0 {
		cpus = "0"
	}
	checkSaw(t, name, log, gpus, env, cpus)
}

// TestRealNodeLifecycle: on the real node, a whole-GPU pod deleted with
// the default 30 s grace while a slice waits for its GPU (the slice starts
// only after the whole-GPU pod's container has stopped), then a stream of
// pods while containerd and the agent restart. No pod fails. Kubelet
// restarts are not covered yet (see the restarts below).
func TestRealNodeLifecycle(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("a real node needs root")
	}
	ctx := t.Context()
	const ns = "e2e-realnode-life"
	c, n := startRealNode(ctx, t, ns, realnode.Options{})
	client := c.Client()

	// A whole-GPU pod on both GPUs that takes 3 s to stop after SIGTERM.
	holder := realPod(ns, podSpec{name: "holder", gpus: realnode.GPUs},
		strings.Replace(shortScript(3600), "trap 'exit 0' TERM", "trap 'sleep 3; exit 0' TERM", 1))
	if _, err := client.CoreV1().Pods(ns).Create(ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wantSaw(t, client, ns, "holder", waitLog(t, client, ns, "holder", 2*time.Minute))
	if _, err := client.CoreV1().Pods(ns).Create(ctx, realPod(ns, podSpec{name: "waiter", memUnits: 4, cores: 20}, shortScript(3600)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	if p, err := client.CoreV1().Pods(ns).Get(ctx, "waiter", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("the slice was bound (%v) while a whole-GPU pod holds every GPU", err)
	}
	deleted := time.Now()
	if err := client.CoreV1().Pods(ns).Delete(ctx, "holder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wantSaw(t, client, ns, "waiter", waitLog(t, client, ns, "waiter", 2*time.Minute))
	// The log can come before the kubelet's status update that says the
	// container runs.
	var started time.Time
	var w *v1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(ns).Get(ctx, "waiter", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		w = p
		if cs := p.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Running != nil {
			started = cs[0].State.Running.StartedAt.Time
			return true, nil
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the waiting slice logged but its container is not reported running: %v\npod: %+v", err, w)
	}
	t.Logf("holder deleted (30 s grace, it stops 3 s after SIGTERM); the waiting slice's container started %s later", started.Sub(deleted).Round(time.Millisecond))
	if started.Before(deleted.Add(3*time.Second - time.Second)) { // StartedAt has second granularity
		t.Errorf("the slice started %s after the deletion, before the whole-GPU pod could have stopped", started.Sub(deleted))
	}
	if err := client.CoreV1().Pods(ns).Delete(ctx, "waiter", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}

	// A stream of short pods while the node's parts restart. Each also
	// copies its output to the node (withOutputCopy): see
	// completedBeforeRestart.
	outDir := filepath.Join(n.Dir(), "pod-output")
	var names []string
	// Before the kubelet or containerd stops, the pods created so far
	// have their containers started: a container containerd is creating
	// when it stops is killed by the kubelet, and with restartPolicy Never
	// its pod fails (seen once, "RunContainerError: error reading from
	// server: EOF"); so does one the kubelet is starting when it stops
	// (seen once: containerd's StartContainer "failed to start containerd
	// task: context canceled", exit code 128, the pod Failed with no
	// reason). Stock kubelet and containerd, whoever schedules the pod:
	// not a race of Tessera's. The agent restart keeps pods in every state.
	afterStarts := func(stop func(time.Duration), start func(context.Context) error) func() error {
		return func() error {
			waitContainersCreated(t, client, ns, names)
			stop(10 * time.Second)
			return start(ctx)
		}
	}
	restarts := map[int]struct {
		what string
		do   func() error
	}{
		3:  {"the kubelet", afterStarts(n.StopKubelet, n.StartKubelet)},
		7:  {"containerd", afterStarts(n.StopContainerd, n.StartContainerd)},
		11: {"tessera-node (SIGTERM, as its DaemonSet restarts it)", func() error { n.StopAgent(10 * time.Second); return n.StartAgent(ctx) }},
		15: {"the kubelet", afterStarts(n.StopKubelet, n.StartKubelet)},
	}
	shapes := []podSpec{{gpus: 1}, {memUnits: 4, cores: 30}, {}, {memUnits: 8, cores: 50}, {gpus: 2}, {memUnits: 2, cores: 10}}
	for i := range 18 {
		if r, ok := restarts[i]; ok {
			t.Logf("restarting %s", r.what)
			if err := r.do(); err != nil {
				t.Fatalf("restart %s: %v", r.what, err)
			}
		}
		s := shapes[i%len(shapes)]
		s.name = fmt.Sprintf("s%02d", i)
		if _, err := client.CoreV1().Pods(ns).Create(ctx, withOutputCopy(realPod(ns, s, shortScript(4)), outDir), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		names = append(names, s.name)
		time.Sleep(time.Second)
	}
	var failed []string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		failed = failed[:0]
		done := 0
		for _, name := range names {
			p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			switch p.Status.Phase {
			case v1.PodFailed:
				if _, ok := completedBeforeRestart(p, outDir); !ok {
					failed = append(failed, fmt.Sprintf("%s: %s: %s", name, p.Status.Reason, p.Status.Message))
				}
				done++
			case v1.PodSucceeded:
				done++
			}
		}
		return done == len(names), nil
	})
	if len(failed) > 0 {
		t.Errorf("%d pods failed:\n%s", len(failed), strings.Join(failed, "\n"))
	}
	if err != nil {
		t.Fatalf("pods did not all finish: %v", err)
	}
	for _, name := range names {
		if p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err == nil {
			if out, ok := completedBeforeRestart(p, outDir); ok {
				t.Logf("pod %s ran to completion, then the restarted kubelet marked it Failed (%s: %s): kubernetes/kubernetes#117955, the stock kubelet's; its output is checked from the node's copy", name, p.Status.Reason, p.Status.Message)
				wantSaw(t, client, ns, name, out)
				continue
			}
		}
		log, err := containerLog(ctx, client, ns, name)
		if err != nil {
			t.Errorf("pod %s: log: %v", name, err)
			continue
		}
		wantSaw(t, client, ns, name, log)
		// The node's copy, which completedBeforeRestart trusts, is the log.
		if b, err := os.ReadFile(filepath.Join(outDir, name)); err != nil || string(b) != log {
			t.Errorf("pod %s: the node's copy of its output (err %v) is not its log:\n%s\nlog:\n%s", name, err, b, log)
		}
	}
	if !t.Failed() {
		t.Logf("%d pods ran to completion through restarts of the kubelet, containerd and the agent", len(names))
	}
}

// TestCompletedBeforeRestart: only a pod the restarted kubelet rejected
// (UnexpectedAdmissionError) whose script ran to its end counts as the
// kubelet's kubernetes/kubernetes#117955.
func TestCompletedBeforeRestart(t *testing.T) {
	dir := t.TempDir()
	for name, out := range map[string]string{"full": "devices: x\ndone\n", "cut": "devices: x\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string, phase v1.PodPhase, reason string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.PodStatus{Phase: phase, Reason: reason}}
	}
	for _, tc := range []struct {
		pod  *v1.Pod
		want bool
	}{
		{pod("full", v1.PodFailed, "UnexpectedAdmissionError"), true},
		{pod("cut", v1.PodFailed, "UnexpectedAdmissionError"), false},
		{pod("none", v1.PodFailed, "UnexpectedAdmissionError"), false},
		{pod("full", v1.PodFailed, "OutOfgpu"), false},
		{pod("full", v1.PodSucceeded, ""), false},
	} {
		if _, got := completedBeforeRestart(tc.pod, dir); got != tc.want {
			t.Errorf("%s %s %s: %v, want %v", tc.pod.Name, tc.pod.Status.Phase, tc.pod.Status.Reason, got, tc.want)
		}
	}
}
