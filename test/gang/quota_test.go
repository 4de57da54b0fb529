package gang_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

const (
	quotaNSA = "team-a"
	quotaNSB = "team-b"
)

// installShippedCRDs creates the CRDs of deploy/crds (as shipped) and
// waits until elasticquotas are served.
func installShippedCRDs(t *testing.T, e *extenderenv.Env) {
	t.Helper()
	d := e.Dynamic(t)
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, f := range []string{"elasticquotas.yaml", "podgroups.yaml"} {
		raw, err := os.ReadFile(filepath.Join(extenderenv.RepoRoot(t), "deploy", "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(raw, &obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if _, err := d.Resource(crdGVR).Create(t.Context(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create CRD of %s: %v", f, err)
		}
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := d.Resource(api.ElasticQuotaGVR).Namespace(quotaNSA).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("elasticquotas not served: %v", err)
	}
}

func createElasticQuota(t *testing.T, e *extenderenv.Env, ns string, min, max int) {
	t.Helper()
	eq := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.ElasticQuotaGVR.GroupVersion().String(),
		"kind":       "ElasticQuota",
		"metadata":   map[string]any{"name": "gpus", "namespace": ns},
		"spec": map[string]any{
			"min": map[string]any{string(api.ResourceGPU): fmt.Sprint(min)},
			"max": map[string]any{string(api.ResourceGPU): fmt.Sprint(max)},
		},
	}}
	if _, err := e.Dynamic(t).Resource(api.ElasticQuotaGVR).Namespace(ns).Create(t.Context(), eq, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create ElasticQuota in %s: %v", ns, err)
	}
}

// quotaGauges scrapes the extender's tessera_extender_quota_* gauges of
// tessera.dev/gpu, by "name/namespace".
func quotaGauges(ctx context.Context, e *extenderenv.Env) (map[string]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+e.Ext.Addr()+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, rest, ok := strings.Cut(line, "{")
		if !ok || !strings.HasPrefix(name, "tessera_extender_quota_") || strings.HasSuffix(name, "_total") {
			continue
		}
		labels, value, _ := strings.Cut(rest, "} ")
		if !strings.Contains(labels, `resource="`+string(api.ResourceGPU)+`"`) {
			continue
		}
		_, nsPart, _ := strings.Cut(labels, `namespace="`)
		nsName, _, _ := strings.Cut(nsPart, `"`)
		out[strings.TrimPrefix(name, "tessera_extender_quota_")+"/"+nsName] = value
	}
	return out, sc.Err()
}

// finishTerminating stands in for the kubelets: a pod being deleted (an
// eviction of a bound pod waits for its kubelet) is removed at once.
func finishTerminating(t *testing.T, e *extenderenv.Env) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		zero := int64(0)
		for ctx.Err() == nil {
			for _, ns := range []string{quotaNSA, quotaNSB} {
				list, err := e.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				if err != nil {
					continue
				}
				for _, p := range list.Items {
					if p.DeletionTimestamp != nil {
						uid := p.UID
						_ = e.Client.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid}})
					}
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
}

func quotaMember(t *testing.T, e *extenderenv.Env, ns, gang string, i int) {
	t.Helper()
	e.CreatePod(t, extenderenv.PodSpec{Name: fmt.Sprintf("%s-%d", gang, i), Namespace: ns, GPUs: 8, Gang: gang, GangMinMember: 2})
}

// TestQuotaReclaimEvictsBorrowedGangWhole is the scenario on the
// real kube-scheduler: namespaces team-a and team-b each have an
// ElasticQuota of min 16, max 32 tessera.dev/gpu on 32 GPUs (4 nodes x 8).
// team-a runs gang a1 (its min) and borrows team-b's idle 16 with gang a2.
// team-b submits gang b within its min: a2 is evicted whole (Reclaimed
// events on both members), b binds, a1 is untouched. a2, recreated at once
// as its controller would, waits with the quota reason; for several
// seconds afterwards nothing more is evicted or bound: no flapping.
//
// The CRDs come from deploy/crds and are installed after the extender
// started, so the extender also shows that it picks up a CRD that appears
// later.
// startQuotaScene starts the extender with quota and the gang planner,
// nodes of 8 GPUs, and ElasticQuotas of min 16, max 32 tessera.dev/gpu in
// team-a and team-b, and waits until the extender shows them.
func startQuotaScene(t *testing.T, nodes int) (*extenderenv.Env, *extenderenv.PodWatch) {
	t.Helper()
	e := extenderenv.Start(t, extenderenv.Options{
		ExtenderArgs: []string{"--gang-planner=true", "--gang-resync=500ms", "--quota=true", "--quota-crd-retry=500ms"},
	})
	w := e.WatchPods(t)
	finishTerminating(t, e)
	for i := range nodes {
		e.CreateNode(t, extenderenv.NodeSpec{Name: fmt.Sprintf("n%d", i), GPUs: 8, Model: extenderenv.H100})
	}
	e.EnsureNamespace(t, quotaNSA)
	e.EnsureNamespace(t, quotaNSB)
	installShippedCRDs(t, e)
	createElasticQuota(t, e, quotaNSA, 16, 32)
	createElasticQuota(t, e, quotaNSB, 16, 32)

	// The extender has the quotas once its gauges show them.
	var gauges map[string]string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		g, err := quotaGauges(ctx, e)
		gauges = g
		return err == nil && g["min/"+quotaNSA] == "16" && g["min/"+quotaNSB] == "16", nil
	})
	if err != nil {
		t.Fatalf("the extender shows no quotas: %v; gauges %v\n%s", err, gauges, e.Ext.LogTail())
	}
	return e, w
}

func TestQuotaReclaimEvictsBorrowedGangWhole(t *testing.T) {
	e, w := startQuotaScene(t, 4)
	for i := range 2 {
		quotaMember(t, e, quotaNSA, "a1", i)
	}
	for i := range 2 {
		e.WaitBound(t, quotaNSA, fmt.Sprintf("a1-%d", i), 60*time.Second)
	}
	// Creation timestamps have whole seconds: "newest first" needs a2 in
	// a later second than a1 (within one second, names break the tie).
	time.Sleep(1100 * time.Millisecond)
	for i := range 2 {
		quotaMember(t, e, quotaNSA, "a2", i)
	}
	a2 := map[string]v1.Pod{}
	for i := range 2 {
		p := e.WaitBound(t, quotaNSA, fmt.Sprintf("a2-%d", i), 60*time.Second)
		a2[p.Name] = *p
	}
	var gauges map[string]string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		g, err := quotaGauges(ctx, e)
		gauges = g
		return err == nil && g["used/"+quotaNSA] == "32" && g["borrowed/"+quotaNSA] == "16" && g["lent/"+quotaNSB] == "16", nil
	})
	if err != nil {
		t.Fatalf("team-a borrowing: gauges %v: %v", gauges, err)
	}
	t.Logf("team-a runs a1 and a2 on 32 GPUs, borrowing 16: gauges %v", gauges)

	reclaimAt := time.Now()
	for i := range 2 {
		quotaMember(t, e, quotaNSB, "b", i)
	}
	for i := range 2 {
		e.WaitBound(t, quotaNSB, fmt.Sprintf("b-%d", i), 60*time.Second)
	}
	t.Logf("team-b's gang bound %s after it was created", time.Since(reclaimAt).Round(time.Millisecond))
	for name, p := range a2 {
		if _, err := e.Client.CoreV1().Pods(quotaNSA).Get(t.Context(), name, metav1.GetOptions{}); err == nil {
			t.Errorf("a2 member %s still exists after team-b's gang bound", name)
		}
		// The Event outlives the pod; it is sent asynchronously.
		var seen int
		err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			list, err := e.Client.CoreV1().Events(quotaNSA).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(p.UID)})
			if err != nil {
				return false, nil
			}
			seen = len(list.Items)
			for _, ev := range list.Items {
				if ev.Reason == api.EventReclaimed && strings.Contains(ev.Message, "namespace "+quotaNSB) && strings.Contains(ev.Message, "gang a2") {
					t.Logf("%s: [%s] %s", name, ev.Reason, ev.Message)
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("a2 member %s: no Reclaimed event naming team-b and gang a2 in %d events: %v", name, seen, err)
		}
	}
	e.WaitEvent(t, quotaNSB, "b-0", api.EventQuotaReclaiming, "evicting gang a2 of namespace team-a (2 pods)", 10*time.Second)

	// a2's controller recreates it at once.
	for i := range 2 {
		quotaMember(t, e, quotaNSA, "a2", i)
	}
	e.WaitEvent(t, quotaNSA, "a2-0", api.EventQuotaExceeded, "that can be lent", 30*time.Second)

	// Nothing flaps: for several seconds no pod is evicted or bound.
	before := w.Binds()
	time.Sleep(6 * time.Second)
	after := w.Binds()
	if len(after) != len(before) {
		t.Errorf("binds during the quiet period: %v", after[len(before):])
	}
	var gone []string
	for _, b := range after {
		if !b.Gone.IsZero() && b.Gone.After(reclaimAt) && !(b.Namespace == quotaNSA && strings.HasPrefix(b.Name, "a2-") && a2[b.Name].UID == b.UID) {
			gone = append(gone, b.Namespace+"/"+b.Name)
		}
	}
	if len(gone) > 0 {
		t.Errorf("pods other than the first a2 removed: %v", gone)
	}
	want := map[string]bool{"team-a/a1-0": true, "team-a/a1-1": true, "team-b/b-0": true, "team-b/b-1": true}
	for _, ns := range []string{quotaNSA, quotaNSB} {
		list, err := e.Client.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			key := ns + "/" + p.Name
			switch {
			case want[key] && p.Spec.NodeName == "":
				t.Errorf("%s is not bound", key)
			case !want[key] && (p.Spec.NodeName != "" || !api.HasGangGate(&p)):
				t.Errorf("%s: node %q gated %v; want it waiting whole", key, p.Spec.NodeName, api.HasGangGate(&p))
			}
		}
	}
	g, err := quotaGauges(t.Context(), e)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"used/" + quotaNSA: "16", "used/" + quotaNSB: "16", "borrowed/" + quotaNSA: "0", "lent/" + quotaNSB: "0"} {
		if g[k] != v {
			t.Errorf("gauge %s = %q, want %s (all: %v)", k, g[k], v, g)
		}
	}
}

// TestQuotaPlainPods: the same quotas with plain pods, through filter, on
// 40 GPUs (5 nodes). team-a runs gang a1 (its min) and borrows with pods
// ax and ay (ay newest): at its max. A third pod az stays Pending with the
// extender's quota reason though 8 GPUs are free. team-b's b0 takes those;
// its b1, within its min, fits no node: the extender evicts ay alone (not
// a1, whose eviction would put team-a under its min) and b1 binds. Nothing
// flaps afterwards, and az stays Pending.
func TestQuotaPlainPods(t *testing.T) {
	e, w := startQuotaScene(t, 5)
	for i := range 2 {
		quotaMember(t, e, quotaNSA, "a1", i)
	}
	for i := range 2 {
		e.WaitBound(t, quotaNSA, fmt.Sprintf("a1-%d", i), 60*time.Second)
	}
	for _, name := range []string{"ax", "ay"} {
		time.Sleep(1100 * time.Millisecond) // a later creation second each
		e.CreatePod(t, extenderenv.PodSpec{Name: name, Namespace: quotaNSA, GPUs: 8})
		e.WaitBound(t, quotaNSA, name, 60*time.Second)
	}
	e.CreatePod(t, extenderenv.PodSpec{Name: "az", Namespace: quotaNSA, GPUs: 8})
	e.WaitPendingWith(t, quotaNSA, "az", "namespace team-a uses 32, its ElasticQuota max is 32", 30*time.Second)
	e.WaitEvent(t, quotaNSA, "az", api.EventQuotaExceeded, "its ElasticQuota max is 32", 10*time.Second)

	e.CreatePod(t, extenderenv.PodSpec{Name: "b0", Namespace: quotaNSB, GPUs: 8})
	e.WaitBound(t, quotaNSB, "b0", 60*time.Second)
	reclaimAt := time.Now()
	e.CreatePod(t, extenderenv.PodSpec{Name: "b1", Namespace: quotaNSB, GPUs: 8})
	e.WaitBound(t, quotaNSB, "b1", 60*time.Second)
	t.Logf("team-b's second pod bound %s after it was created", time.Since(reclaimAt).Round(time.Millisecond))
	e.WaitEvent(t, quotaNSB, "b1", api.EventQuotaReclaiming, "evicting ay of namespace team-a (1 pods)", 10*time.Second)

	before := w.Binds()
	time.Sleep(6 * time.Second)
	after := w.Binds()
	if len(after) != len(before) {
		t.Errorf("binds during the quiet period: %v", after[len(before):])
	}
	var gone []string
	for _, b := range after {
		if !b.Gone.IsZero() {
			gone = append(gone, b.Namespace+"/"+b.Name)
		}
	}
	if len(gone) != 1 || gone[0] != quotaNSA+"/ay" {
		t.Errorf("pods removed: %v, want only team-a/ay", gone)
	}
	for _, name := range []string{"a1-0", "a1-1", "ax"} {
		if p := e.GetPod(t, quotaNSA, name); p.Spec.NodeName == "" {
			t.Errorf("%s not bound", name)
		}
	}
	if p := e.GetPod(t, quotaNSA, "az"); p.Spec.NodeName != "" {
		t.Errorf("az bound to %s above team-a's max", p.Spec.NodeName)
	}
}

// TestQuotaReclaimRespectsPDB: as TestQuotaPlainPods, but a
// PodDisruptionBudget protects ay, the newest borrowing pod: the eviction
// API refuses it (429), the extender reports that (ReclaimBlocked) and
// evicts ax instead; ay keeps running.
func TestQuotaReclaimRespectsPDB(t *testing.T) {
	e, w := startQuotaScene(t, 5)
	for i := range 2 {
		quotaMember(t, e, quotaNSA, "a1", i)
	}
	for i := range 2 {
		e.WaitBound(t, quotaNSA, fmt.Sprintf("a1-%d", i), 60*time.Second)
	}
	for _, name := range []string{"ax", "ay"} {
		time.Sleep(1100 * time.Millisecond) // a later creation second each
		e.CreatePod(t, extenderenv.PodSpec{Name: name, Namespace: quotaNSA, GPUs: 8, Labels: map[string]string{"app": name}})
		p := e.WaitBound(t, quotaNSA, name, 60*time.Second)
		// Running, as its kubelet would say: the eviction API lets a
		// Pending pod go whatever its budget.
		p.Status.Phase = v1.PodRunning
		p.Status.Conditions = append(p.Status.Conditions, v1.PodCondition{Type: v1.PodReady, Status: v1.ConditionTrue})
		if _, err := e.Client.CoreV1().Pods(quotaNSA).UpdateStatus(t.Context(), p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	one := intstr.FromInt32(1)
	pdb := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: "ay", Namespace: quotaNSA},
		Spec:       policyv1.PodDisruptionBudgetSpec{MinAvailable: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "ay"}}},
	}
	if _, err := e.Client.PolicyV1().PodDisruptionBudgets(quotaNSA).Create(t.Context(), pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.CreatePod(t, extenderenv.PodSpec{Name: "b0", Namespace: quotaNSB, GPUs: 8})
	e.WaitBound(t, quotaNSB, "b0", 60*time.Second)
	e.CreatePod(t, extenderenv.PodSpec{Name: "b1", Namespace: quotaNSB, GPUs: 8})
	e.WaitBound(t, quotaNSB, "b1", 60*time.Second)
	e.WaitEvent(t, quotaNSA, "ay", api.EventReclaimBlocked, "ay of namespace team-a cannot be evicted", 10*time.Second)
	e.WaitEvent(t, quotaNSB, "b1", api.EventQuotaReclaiming, "evicting ax of namespace team-a (1 pods)", 10*time.Second)
	time.Sleep(3 * time.Second)
	var gone []string
	for _, b := range w.Binds() {
		if !b.Gone.IsZero() {
			gone = append(gone, b.Namespace+"/"+b.Name)
		}
	}
	if len(gone) != 1 || gone[0] != quotaNSA+"/ax" {
		t.Errorf("pods removed: %v, want only team-a/ax", gone)
	}
	if p := e.GetPod(t, quotaNSA, "ay"); p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
		t.Errorf("ay: node %q, deleting %v; want it running", p.Spec.NodeName, p.DeletionTimestamp)
	}
}
