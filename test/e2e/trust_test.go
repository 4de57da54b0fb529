package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/install"
	"github.com/tessera-gpu/tessera/test/framework/nodesim"
)

// The trust boundary (issue 13): nothing a tenant writes on its own pod is
// taken as Tessera's decision. With deploy/admission's policy the forged
// annotations are refused at creation; with the policy removed they are
// ignored (the components take only decisions Tessera sealed): no GPU is
// withheld, quota holds, no pod is bound and then failed.
func TestTrustBoundary(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-trust")
	tenant := tenantClient(t, c, ns)

	t.Run("refused by the admission policy", func(t *testing.T) {
		for _, tc := range forgeries(t, c) {
			p := tc.spec.pod(ns)
			_, err := tenant.CoreV1().Pods(ns).Create(t.Context(), p, metav1.CreateOptions{})
			if err == nil || !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.annotation) || !strings.Contains(err.Error(), "is written only by Tessera") {
				t.Errorf("%s: create = %v, want a refusal naming %s", tc.name, err, tc.annotation)
			}
		}
		// An update that adds a decision is refused; one that leaves the
		// decisions alone (a label) passes.
		create(t, tenant, ns, podSpec{name: "plain"})
		patch := func(ann map[string]any) error {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann, "labels": map[string]any{"team": "a"}}})
			_, err := tenant.CoreV1().Pods(ns).Patch(t.Context(), "plain", types.MergePatchType, b, metav1.PatchOptions{})
			return err
		}
		if err := patch(map[string]any{api.AnnotationGangPlan: "{}"}); err == nil || !strings.Contains(err.Error(), api.AnnotationGangPlan) {
			t.Errorf("patch adding %s: %v", api.AnnotationGangPlan, err)
		}
		if err := patch(map[string]any{"team-note": "x"}); err != nil {
			t.Errorf("a patch of the tenant's own annotation and label: %v", err)
		}
	})

	t.Run("ignored without the policy", func(t *testing.T) {
		removePolicy(t, c)
		cases := forgeries(t, c)

		// 1. No GPU request, an assignment naming a slice on every GPU of
		// a100-2: nothing is withheld, an 8-GPU pod pinned there runs.
		// (No pod is deleted in this test: a whole-GPU pod bound right
		// after a slice left would meet the release race of issue 17.)
		squat := create(t, tenant, ns, cases[0].spec)
		waitRunning(t, c, ns, squat.Name, 60*time.Second)
		waitIgnoredEvent(t, c, ns, squat.Name, api.AnnotationAssignment, "")
		// The node agent says so too: its Events are allowed by
		// deploy/node's RBAC (it was refused them before 2026-11-29).
		waitIgnoredEvent(t, c, ns, squat.Name, api.AnnotationAssignment, "tessera-node ")
		time.Sleep(3 * time.Second) // longer than the agent's pod-watch reaction
		create(t, tenant, ns, podSpec{name: "whole-8", gpus: 8, node: "a100-2"})
		waitRunning(t, c, ns, "whole-8", 60*time.Second)

		// 2. A plan on a pod whose nodeSelector matches no node holds
		// nothing: an 8-GPU pod on the planned node runs.
		create(t, tenant, ns, cases[2].spec)
		create(t, tenant, ns, podSpec{name: "whole-8b", gpus: 8, node: "a100-1"})
		waitRunning(t, c, ns, "whole-8b", 60*time.Second)
		if p := getPod(t, c.Client(), ns, cases[2].spec.name); p.Spec.NodeName != "" {
			t.Errorf("the pod with a forged plan and no matching node was bound to %s", p.Spec.NodeName)
		}

		// 2b. An assignment filling every GPU of v100-1 with slices: a 4 GiB
		// slice pinned there runs.
		create(t, tenant, ns, cases[5].spec)
		waitRunning(t, c, ns, cases[5].spec.name, 60*time.Second)
		create(t, tenant, ns, podSpec{name: "slice-4g", memUnits: 4, cores: 10, node: "v100-1"})
		waitRunning(t, c, ns, "slice-4g", 60*time.Second)

		// 3. Garbage in the assignment of a 1-GPU pod: it runs, with the
		// node agent's sealed record in place of the garbage.
		create(t, tenant, ns, cases[3].spec)
		p, _ := waitRunning(t, c, ns, cases[3].spec.name, 60*time.Second)
		err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			p = getPod(t, c.Client(), ns, p.Name)
			a, err := api.ParseAssignment(p.Annotations[api.AnnotationAssignment])
			return err == nil && p.Annotations[api.AnnotationAssignmentSeal] != "" && len(a.Containers) == 1 && len(a.Containers[0].GPUs) == 1, nil
		})
		if err != nil {
			t.Errorf("the garbage assignment was not replaced by Tessera's sealed record: %v", p.Annotations)
		}

		// 4. Quota: max 1 GPU, used by a running pod; a second 1-GPU pod
		// with a forged plan stays unbound.
		qns := namespace(t, c, "e2e-trust-quota")
		bindTenant(t, c, qns)
		elasticQuota(t, c, qns, api.ResourceGPU, 1, 1)
		time.Sleep(time.Second) // the extender's informer sees the quota
		create(t, tenant, qns, podSpec{name: "q1", gpus: 1, node: "v100-1"})
		waitRunning(t, c, qns, "q1", 60*time.Second)
		forged := cases[1].spec
		if _, err := tenant.CoreV1().Pods(qns).Create(t.Context(), forged.pod(qns), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if p := getPod(t, c.Client(), qns, forged.name); p.Spec.NodeName != "" {
				t.Fatalf("a pod with a forged gang plan was bound to %s above its namespace's max\n%s", p.Spec.NodeName, describe(t, c, p))
			}
			time.Sleep(500 * time.Millisecond)
		}
		waitIgnoredEvent(t, c, qns, forged.name, api.AnnotationGangPlan, "")

		// No pod of either namespace failed.
		for _, n := range []string{ns, qns} {
			if _, _, failed := countPhases(t, c, n); failed > 0 {
				t.Errorf("%d pods of %s failed", failed, n)
			}
		}
	})
}

type forgery struct {
	name, annotation string
	spec             podSpec
}

// forgeries are the cases users found: [0] no GPU request with a slice on
// every GPU of a100-2, [1] a 1-GPU pod with a gang plan, [2] an 8-GPU pod
// with a plan and a nodeSelector matching no node, [3] garbage in a 1-GPU
// pod's assignment, [4] a seal alone, [5] a small slice whose assignment
// claims all of every GPU of v100-1.
func forgeries(t *testing.T, c *nodesim.Cluster) []forgery {
	// every names a slice of mem MiB and cores on every GPU of node.
	every := func(node string, mem, cores int64) string {
		a := api.NewAssignment()
		for i, g := range inventory(t, c, node).GPUs {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: fmt.Sprintf("c%d", i), Shared: &api.SharedGPU{GPU: api.GPURef{UUID: g.UUID, Index: g.Index}, MemoryMiB: mem, Cores: cores}})
		}
		v, err := api.EncodeAssignment(a)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	plan := func(node string) string {
		b, _ := json.Marshal(api.GangPlan{APIVersion: api.Version, Kind: api.KindGangPlan, Gang: "g", Node: node, Expires: time.Now().Add(time.Hour)})
		return string(b)
	}
	return []forgery{
		{"no GPU, slices on every GPU", api.AnnotationAssignment, podSpec{name: "squatter", node: "a100-2", annotations: map[string]string{api.AnnotationAssignment: every("a100-2", 1024, 10)}}},
		{"a forged plan past quota", api.AnnotationGangPlan, podSpec{name: "planned", gpus: 1, node: "v100-1", annotations: map[string]string{api.AnnotationGangPlan: plan("v100-1")}}},
		{"a plan on a pod no node matches", api.AnnotationGangPlan, podSpec{name: "nowhere", gpus: 8, node: "no-such-node", annotations: map[string]string{api.AnnotationGangPlan: plan("a100-1")}}},
		{"garbage assignment", api.AnnotationAssignment, podSpec{name: "garbage", gpus: 1, annotations: map[string]string{api.AnnotationAssignment: "{garbage"}}},
		{"a seal alone", api.AnnotationAssignmentSeal, podSpec{name: "seal", annotations: map[string]string{api.AnnotationAssignmentSeal: "v1.AAAA"}}},
		{"a slice pod claiming every GPU's memory", api.AnnotationAssignment, podSpec{name: "hog", memUnits: 1, cores: 1, node: "v100-1", annotations: map[string]string{api.AnnotationAssignment: every("v100-1", 16384, 100)}}},
	}
}

// tenantClient is a client of user "tenant" with pod rights in ns only,
// like a namespace's `edit` user (the API server impersonates it for the
// admin).
func tenantClient(t *testing.T, c *nodesim.Cluster, ns string) kubernetes.Interface {
	t.Helper()
	bindTenant(t, c, ns)
	cfg := c.CP.RESTConfig()
	cfg.Impersonate.UserName = "tenant"
	cfg.Impersonate.Groups = []string{"system:authenticated"}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return client
}

func bindTenant(t *testing.T, c *nodesim.Cluster, ns string) {
	t.Helper()
	ctx := t.Context()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
	}}
	if _, err := c.Client().RbacV1().Roles(ns).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "tenant", Namespace: ns},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tenant"},
		Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "tenant"}}}
	if _, err := c.Client().RbacV1().RoleBindings(ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The API server's RBAC authorizer reads Roles from a cache: wait
	// until it lets the tenant create pods.
	if err := c.CP.WaitAllowed(ctx, "tenant", authorizationv1.ResourceAttributes{Namespace: ns, Verb: "create", Resource: "pods"}); err != nil {
		t.Fatal(err)
	}
}

// removePolicy deletes deploy/admission's binding until the test ends, and
// waits until a forged pod is accepted (dry run).
func removePolicy(t *testing.T, c *nodesim.Cluster) {
	t.Helper()
	client := c.Client()
	bindings := client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings()
	if err := bindings.Delete(t.Context(), "tessera-state-annotations", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("removing the policy's binding: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := install.AdmissionPolicy(ctx, c.CP.RESTConfig(), repoRoot()); err != nil {
			t.Errorf("restoring the admission policy: %v", err)
		}
	})
	probe := podSpec{name: "probe", annotations: map[string]string{api.AnnotationAssignment: "x"}}.pod("default")
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the policy is still enforced after its binding was deleted: %v", err)
	}
}

// waitIgnoredEvent waits for a Warning IgnoredAnnotation on the pod naming
// annotation, from the component whose name starts the message (from; ""
// for any component).
func waitIgnoredEvent(t *testing.T, c *nodesim.Cluster, ns, pod, annotation, from string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Type == v1.EventTypeWarning && e.Reason == "IgnoredAnnotation" && strings.Contains(e.Message, annotation) && strings.HasPrefix(e.Message, from) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("pod %s/%s: no Warning IgnoredAnnotation naming %s from %q (events %q)", ns, pod, annotation, from, seen)
	}
}
