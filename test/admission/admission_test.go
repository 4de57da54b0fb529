// Package admission tests deploy/admission's ValidatingAdmissionPolicy and
// deploy/crds' validation against a real kube-apiserver, with deploy/'s
// RBAC, CRDs and policy installed as they are in the repository
// (framework/install): every way a tenant could set, change or remove one
// of Tessera's pod annotations is refused with a message that names it,
// and what tenants and Tessera's own identities legitimately do passes.
package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

const (
	tenantNS   = "team-a"
	tenantName = "alice"
	// refused is what the policy says about Tessera's annotations.
	refused = " written only by Tessera (tessera-extender, tessera-node); "
)

// env is a control plane with deploy/'s RBAC, CRDs and admission policy,
// and clients for the admin, a tenant and Tessera's two identities.
type env struct {
	cp             *controlplane.ControlPlane
	admin, tenant  kubernetes.Interface
	extender, node kubernetes.Interface
	adminDyn       dynamic.Interface
	tessera        map[string]string // Tessera's four annotations on a pod
}

func start(t *testing.T) *env {
	t.Helper()
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	tenant := &controlplane.User{Name: tenantName}
	ext, node := install.ExtenderUser(), install.NodeUser()
	cp := controlplane.StartForTest(t, controlplane.Options{Users: []*controlplane.User{tenant, ext, node}})
	ctx := t.Context()
	admin := cp.RESTConfig()
	if err := install.RBAC(ctx, admin, repo); err != nil {
		t.Fatal(err)
	}
	if _, err := install.CRDs(ctx, admin, repo); err != nil {
		t.Fatal(err)
	}
	if err := install.AdmissionPolicy(ctx, admin, repo); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{tenantNS, "kube-system"} {
		if err := cp.EnsureNamespace(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	// The tenant: the stock edit ClusterRole in its namespace, as a
	// namespace owner usually gets, plus pods/binding (a tenant running
	// its own scheduler) and pods/status, which edit does not grant, so
	// that those paths reach admission instead of stopping at RBAC.
	// No controller manager aggregates edit's rules here: do it as it would.
	if rules, err := cp.AggregateClusterRole(ctx, "edit"); err != nil || len(rules) == 0 {
		t.Fatalf("aggregate ClusterRole edit: %d rules, %v", len(rules), err)
	}
	rbac := cp.Client().RbacV1()
	user := []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: tenantName}}
	if _, err := rbac.RoleBindings(tenantNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   user,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.Roles(tenantNS).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "own-scheduler"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"update", "patch"}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(tenantNS).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "alice-own-scheduler"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "own-scheduler"},
		Subjects:   user,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The API server's RBAC authorizer reads bindings from a cache: wait
	// until it grants what was just bound, or the tenant's first requests
	// fail with a plain Forbidden instead of reaching admission.
	for _, ra := range []authorizationv1.ResourceAttributes{
		{Namespace: tenantNS, Verb: "create", Resource: "pods"},
		{Namespace: tenantNS, Verb: "create", Resource: "pods", Subresource: "binding"},
		{Namespace: tenantNS, Verb: "patch", Resource: "pods", Subresource: "status"},
	} {
		if err := cp.WaitAllowed(ctx, tenantName, ra); err != nil {
			t.Fatal(err)
		}
	}
	e := &env{cp: cp, admin: cp.Client()}
	for _, c := range []struct {
		u   *controlplane.User
		cs  *kubernetes.Interface
		dyn *dynamic.Interface
	}{
		{tenant, &e.tenant, nil},
		{ext, &e.extender, nil},
		{node, &e.node, nil},
		{nil, nil, &e.adminDyn},
	} {
		cfg := admin
		if c.u != nil {
			cfg = cp.RESTConfigFor(c.u)
		}
		if c.cs != nil {
			if *c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
		if c.dyn != nil {
			if *c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	// install.AdmissionPolicy waited for tessera-state-annotations; the
	// admission plugin may load tessera-gpu-placement later: wait until it
	// refuses the tenant a GPU pod bound at creation.
	bound := testPod("placement-probe", nil)
	bound.Spec.NodeName = "gpu-node"
	bound.Spec.Containers[0].Resources.Limits = v1.ResourceList{api.ResourceGPU: resource.MustParse("1")}
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = e.tenant.CoreV1().Pods(tenantNS).Create(ctx, bound, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "not by spec.nodeName"), nil
	}); err != nil {
		t.Fatalf("tessera-gpu-placement is not enforced: %v (last dry-run create: %v)", err, last)
	}
	// What Tessera writes: a sealed assignment and gang plan. The values
	// only need to look like Tessera's; the API server does not parse them.
	e.tessera = map[string]string{
		api.AnnotationAssignment:     `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[]}`,
		api.AnnotationAssignmentSeal: "v1.c2VhbC1vZi10aGUtYXNzaWdubWVudA",
		api.AnnotationGangPlan:       `{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n1"}`,
		api.AnnotationGangPlanSeal:   "v1.c2VhbC1vZi10aGUtcGxhbg",
	}
	return e
}

func testPod(name string, annotations map[string]string) *v1.Pod {
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: tenantNS, Labels: map[string]string{"app": "train"}, Annotations: maps.Clone(annotations)},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "main", Image: "registry.k8s.io/pause:3.10"}}},
	}
}

// plainPod creates a pod without Tessera's annotations (as the tenant).
func (e *env) plainPod(t *testing.T, name string) *v1.Pod {
	t.Helper()
	p, err := e.tenant.CoreV1().Pods(tenantNS).Create(t.Context(), testPod(name, map[string]string{"team": "a"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("tenant creates a plain pod: %v", err)
	}
	return p
}

// tesseraPod creates a pod as the tenant, then has the extender write
// Tessera's four annotations on it, as it does when it plans and binds.
func (e *env) tesseraPod(t *testing.T, name string) *v1.Pod {
	t.Helper()
	e.plainPod(t, name)
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": e.tessera}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := e.extender.CoreV1().Pods(tenantNS).Patch(t.Context(), name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		t.Fatalf("tessera-extender writes its annotations: %v", err)
	}
	return p
}

func (e *env) get(t *testing.T, name string) *v1.Pod {
	t.Helper()
	p, err := e.admin.CoreV1().Pods(tenantNS).Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// stateOf is the pod's Tessera annotations.
func stateOf(p *v1.Pod) map[string]string {
	out := map[string]string{}
	for k, v := range p.Annotations {
		if api.IsStateAnnotation(k) {
			out[k] = v
		}
	}
	return out
}

func mergePatch(annotations map[string]any) []byte {
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
	return b
}

// jsonPointer escapes an annotation key for a JSON patch path.
func jsonPointer(key string) string {
	return "/metadata/annotations/" + strings.NewReplacer("~", "~0", "/", "~1").Replace(key)
}

func jsonPatch(ops ...map[string]any) []byte {
	b, _ := json.Marshal(ops)
	return b
}

// one is the policy's message for a single annotation.
func one(key, fix string) string { return "annotation " + key + " is" + refused + fix }

// several is the policy's message for several annotations, in the order
// of api.StateAnnotations.
func several(fix string, keys ...string) string {
	return "annotations " + strings.Join(keys, ", ") + " are" + refused + fix
}

// TestTenantCannotWriteTesseraAnnotations: every way a tenant (edit in its
// namespace) can write a pod's annotations, for each of Tessera's four,
// is refused with a message naming the annotation, and the pod keeps what
// Tessera wrote. The admin is no exception. What tenants legitimately do,
// and what Tessera's identities do, passes.
func TestTenantCannotWriteTesseraAnnotations(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	pods := e.tenant.CoreV1().Pods(tenantNS)
	plain := e.plainPod(t, "plain")
	carrier := e.tesseraPod(t, "carrier")
	unbound := e.plainPod(t, "unbound")
	doomed := e.tesseraPod(t, "doomed")
	if got := stateOf(carrier); !maps.Equal(got, e.tessera) {
		t.Fatalf("carrier's annotations after tessera-extender's patch: %v, want %v", got, e.tessera)
	}

	type badCase struct {
		name string
		do   func(ctx context.Context) error
		want string // the end of the refusal
		pod  string // pod whose Tessera annotations must be unchanged afterwards
	}
	var cases []badCase
	for _, key := range api.StateAnnotations() {
		forged := "forged-" + key
		cases = append(cases,
			badCase{"create pod with " + key, func(ctx context.Context) error {
				_, err := pods.Create(ctx, testPod("forged", map[string]string{key: forged}), metav1.CreateOptions{})
				return err
			}, one(key, "remove it from the pod"), ""},
			badCase{"update (PUT) sets " + key, func(ctx context.Context) error {
				p := e.get(t, plain.Name)
				p.Annotations[key] = forged
				_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
				return err
			}, one(key, "leave it unchanged"), plain.Name},
			badCase{"update (PUT) changes " + key, func(ctx context.Context) error {
				p := e.get(t, carrier.Name)
				p.Annotations[key] = forged
				_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"update (PUT) removes " + key, func(ctx context.Context) error {
				p := e.get(t, carrier.Name)
				delete(p.Annotations, key)
				_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"merge patch sets " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, plain.Name, types.MergePatchType, mergePatch(map[string]any{key: forged}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), plain.Name},
			badCase{"merge patch removes " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, carrier.Name, types.MergePatchType, mergePatch(map[string]any{key: nil}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"strategic merge patch changes " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, carrier.Name, types.StrategicMergePatchType, mergePatch(map[string]any{key: forged}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"JSON patch adds " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, plain.Name, types.JSONPatchType, jsonPatch(map[string]any{"op": "add", "path": jsonPointer(key), "value": forged}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), plain.Name},
			badCase{"JSON patch replaces " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, carrier.Name, types.JSONPatchType, jsonPatch(map[string]any{"op": "replace", "path": jsonPointer(key), "value": forged}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"JSON patch removes " + key, func(ctx context.Context) error {
				_, err := pods.Patch(ctx, carrier.Name, types.JSONPatchType, jsonPatch(map[string]any{"op": "remove", "path": jsonPointer(key)}), metav1.PatchOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
			badCase{"server-side apply sets " + key, func(ctx context.Context) error {
				body, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Pod",
					"metadata": map[string]any{"name": plain.Name, "namespace": tenantNS, "annotations": map[string]string{key: forged}}})
				_, err := pods.Patch(ctx, plain.Name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "alice", Force: ptrTo(true)})
				return err
			}, one(key, "leave it unchanged"), plain.Name},
			badCase{"binding carries " + key, func(ctx context.Context) error {
				return pods.Bind(ctx, &v1.Binding{
					ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{key: forged}},
					Target:     v1.ObjectReference{Kind: "Node", Name: "n1"},
				}, metav1.CreateOptions{})
			}, one(key, "remove it from the binding"), unbound.Name},
			badCase{"status update changes " + key, func(ctx context.Context) error {
				p := e.get(t, carrier.Name)
				p.Annotations[key] = forged
				_, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
				return err
			}, one(key, "leave it unchanged"), carrier.Name},
		)
	}
	all := api.StateAnnotations()
	cases = append(cases,
		badCase{"create pod with a decision and its seal", func(ctx context.Context) error {
			_, err := pods.Create(ctx, testPod("forged", map[string]string{api.AnnotationAssignment: "x", api.AnnotationAssignmentSeal: "v1.x"}), metav1.CreateOptions{})
			return err
		}, several("remove them from the pod", api.AnnotationAssignment, api.AnnotationAssignmentSeal), ""},
		badCase{"create pod copying all of another pod's annotations", func(ctx context.Context) error {
			_, err := pods.Create(ctx, testPod("forged", e.get(t, carrier.Name).Annotations), metav1.CreateOptions{})
			return err
		}, several("remove them from the pod", all...), ""},
		badCase{"update (PUT) drops every annotation", func(ctx context.Context) error {
			p := e.get(t, carrier.Name)
			p.Annotations = nil
			_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
			return err
		}, several("leave them unchanged", all...), carrier.Name},
		badCase{"merge patch sets the plan and its seal", func(ctx context.Context) error {
			_, err := pods.Patch(ctx, plain.Name, types.MergePatchType,
				mergePatch(map[string]any{api.AnnotationGangPlan: "x", api.AnnotationGangPlanSeal: "v1.x"}), metav1.PatchOptions{})
			return err
		}, several("leave them unchanged", api.AnnotationGangPlan, api.AnnotationGangPlanSeal), plain.Name},
		badCase{"JSON patch replaces the whole annotations map", func(ctx context.Context) error {
			_, err := pods.Patch(ctx, carrier.Name, types.JSONPatchType,
				jsonPatch(map[string]any{"op": "replace", "path": "/metadata/annotations", "value": map[string]string{"team": "a"}}), metav1.PatchOptions{})
			return err
		}, several("leave them unchanged", all...), carrier.Name},
		badCase{"admin (system:masters) creates a pod with an assignment", func(ctx context.Context) error {
			_, err := e.admin.CoreV1().Pods(tenantNS).Create(ctx, testPod("forged", map[string]string{api.AnnotationAssignment: "x"}), metav1.CreateOptions{})
			return err
		}, one(api.AnnotationAssignment, "remove it from the pod"), ""},
		badCase{"admin changes an assignment", func(ctx context.Context) error {
			_, err := e.admin.CoreV1().Pods(tenantNS).Patch(ctx, carrier.Name, types.MergePatchType, mergePatch(map[string]any{api.AnnotationAssignment: "x"}), metav1.PatchOptions{})
			return err
		}, one(api.AnnotationAssignment, "leave it unchanged"), carrier.Name},
		badCase{"admin binds with a gang plan", func(ctx context.Context) error {
			return e.admin.CoreV1().Pods(tenantNS).Bind(ctx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{api.AnnotationGangPlan: "x"}},
				Target:     v1.ObjectReference{Kind: "Node", Name: "n1"},
			}, metav1.CreateOptions{})
		}, one(api.AnnotationGangPlan, "remove it from the binding"), unbound.Name},
		badCase{"create pod in kube-system with an assignment (admin)", func(ctx context.Context) error {
			p := testPod("forged", map[string]string{api.AnnotationAssignment: "x"})
			p.Namespace = "kube-system"
			_, err := e.admin.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{})
			return err
		}, one(api.AnnotationAssignment, "remove it from the pod"), ""},
		// The extender's requeue nudge (not a decision: neither sealed
		// nor sanitized) is guarded too.
		badCase{"create pod with " + api.AnnotationQuotaRequeue, func(ctx context.Context) error {
			_, err := pods.Create(ctx, testPod("forged", map[string]string{api.AnnotationQuotaRequeue: "team-a/q@1"}), metav1.CreateOptions{})
			return err
		}, one(api.AnnotationQuotaRequeue, "remove it from the pod"), ""},
		badCase{"merge patch sets " + api.AnnotationQuotaRequeue, func(ctx context.Context) error {
			_, err := pods.Patch(ctx, plain.Name, types.MergePatchType, api.QuotaRequeuePatch("team-a/q@1"), metav1.PatchOptions{})
			return err
		}, one(api.AnnotationQuotaRequeue, "leave it unchanged"), plain.Name},
		badCase{"binding carries " + api.AnnotationQuotaRequeue, func(ctx context.Context) error {
			return pods.Bind(ctx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{api.AnnotationQuotaRequeue: "team-a/q@1"}},
				Target:     v1.ObjectReference{Kind: "Node", Name: "n1"},
			}, metav1.CreateOptions{})
		}, one(api.AnnotationQuotaRequeue, "remove it from the binding"), unbound.Name},
	)
	if len(cases) < 30 {
		t.Fatalf("only %d refusal cases", len(cases))
	}
	want := map[string]map[string]string{plain.Name: {}, carrier.Name: e.tessera, unbound.Name: {}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.do(ctx)
			if err == nil {
				t.Fatalf("allowed; want refused with %q", c.want)
			}
			if !apierrors.IsForbidden(err) || !strings.HasSuffix(err.Error(), "denied request: "+c.want) {
				t.Fatalf("error %q (reason %s), want Forbidden ending in %q", err, apierrors.ReasonForError(err), "denied request: "+c.want)
			}
			if c.pod != "" {
				if got := stateOf(e.get(t, c.pod)); !maps.Equal(got, want[c.pod]) {
					t.Errorf("pod %s's Tessera annotations are now %v, want %v", c.pod, got, want[c.pod])
				}
			}
		})
	}
	if p := e.get(t, unbound.Name); p.Spec.NodeName != "" {
		t.Errorf("a refused binding bound %s to %s", unbound.Name, p.Spec.NodeName)
	}
	if _, err := pods.Get(ctx, "forged", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a refused create left pod forged behind (get: %v)", err)
	}

	// What is allowed.
	type goodCase struct {
		name string
		do   func(ctx context.Context) error
	}
	good := []goodCase{
		{"tenant labels a pod carrying Tessera's annotations (merge patch)", func(ctx context.Context) error {
			_, err := pods.Patch(ctx, carrier.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"stage":"2"}}}`), metav1.PatchOptions{})
			return err
		}},
		{"tenant updates (PUT) such a pod's labels and its own annotation", func(ctx context.Context) error {
			p := e.get(t, carrier.Name)
			p.Labels["stage"] = "3"
			p.Annotations["team"] = "a"
			_, err := pods.Update(ctx, p, metav1.UpdateOptions{})
			return err
		}},
		{"tenant JSON-patches a label", func(ctx context.Context) error {
			_, err := pods.Patch(ctx, carrier.Name, types.JSONPatchType, jsonPatch(map[string]any{"op": "add", "path": "/metadata/labels/stage", "value": "4"}), metav1.PatchOptions{})
			return err
		}},
		{"tenant server-side applies a label", func(ctx context.Context) error {
			_, err := pods.Patch(ctx, carrier.Name, types.ApplyPatchType,
				[]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"carrier","namespace":"team-a","labels":{"owner":"alice"}}}`),
				metav1.PatchOptions{FieldManager: "alice"})
			return err
		}},
		{"tenant status update leaves the annotations", func(ctx context.Context) error {
			p := e.get(t, carrier.Name)
			p.Status.Message = "still here"
			_, err := pods.UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}},
		{"tenant creates a gang member (Tessera's request annotations are the tenant's)", func(ctx context.Context) error {
			_, err := pods.Create(ctx, testPod("member", map[string]string{api.AnnotationGang: "g", api.AnnotationGangMinMember: "2", api.AnnotationNVLink: api.NVLinkRequired}), metav1.CreateOptions{})
			return err
		}},
		{"tessera-node rewrites the assignment and its seal", func(ctx context.Context) error {
			_, err := e.node.CoreV1().Pods(tenantNS).Patch(ctx, carrier.Name, types.MergePatchType,
				mergePatch(map[string]any{api.AnnotationAssignment: e.tessera[api.AnnotationAssignment] + " ", api.AnnotationAssignmentSeal: "v1.bm9kZQ"}), metav1.PatchOptions{})
			return err
		}},
		{"tessera-extender removes the gang plan and its seal", func(ctx context.Context) error {
			_, err := e.extender.CoreV1().Pods(tenantNS).Patch(ctx, carrier.Name, types.MergePatchType,
				mergePatch(map[string]any{api.AnnotationGangPlan: nil, api.AnnotationGangPlanSeal: nil}), metav1.PatchOptions{})
			return err
		}},
		{"tessera-extender binds with an assignment in the Binding", func(ctx context.Context) error {
			return e.extender.CoreV1().Pods(tenantNS).Bind(ctx, &v1.Binding{
				ObjectMeta: metav1.ObjectMeta{Name: unbound.Name, Annotations: map[string]string{api.AnnotationAssignment: "x", api.AnnotationAssignmentSeal: "v1.x"}},
				Target:     v1.ObjectReference{Kind: "Node", Name: "n1"},
			}, metav1.CreateOptions{})
		}},
		{"tessera-extender requeues a pending pod after an ElasticQuota change", func(ctx context.Context) error {
			_, err := e.extender.CoreV1().Pods(tenantNS).Patch(ctx, plain.Name, types.MergePatchType, api.QuotaRequeuePatch("team-a/q@2"), metav1.PatchOptions{})
			return err
		}},
		{"tenant deletes a pod carrying Tessera's annotations", func(ctx context.Context) error {
			return pods.Delete(ctx, doomed.Name, metav1.DeleteOptions{})
		}},
	}
	for _, c := range good {
		t.Run(c.name, func(t *testing.T) {
			if err := c.do(ctx); err != nil {
				t.Fatalf("refused: %v", err)
			}
		})
	}
	p := e.get(t, carrier.Name)
	if p.Labels["stage"] != "4" || p.Labels["owner"] != "alice" || p.Annotations["team"] != "a" || p.Status.Message != "still here" {
		t.Errorf("the tenant's allowed writes did not land: labels %v annotations %v status message %q", p.Labels, p.Annotations, p.Status.Message)
	}
	wantState := map[string]string{api.AnnotationAssignment: e.tessera[api.AnnotationAssignment] + " ", api.AnnotationAssignmentSeal: "v1.bm9kZQ"}
	if got := stateOf(p); !maps.Equal(got, wantState) {
		t.Errorf("carrier's Tessera annotations after Tessera's own writes: %v, want %v", got, wantState)
	}
	if v, _ := api.QuotaRequeue(e.get(t, plain.Name).Annotations); v != "team-a/q@2" {
		t.Errorf("plain's %s after tessera-extender's write: %q, want team-a/q@2", api.AnnotationQuotaRequeue, v)
	}
	if b := e.get(t, unbound.Name); b.Spec.NodeName != "n1" || b.Annotations[api.AnnotationAssignment] != "x" {
		t.Errorf("tessera-extender's binding: node %q, assignment %q", b.Spec.NodeName, b.Annotations[api.AnnotationAssignment])
	}
	e.noEvaluationErrors(t)
}

// noEvaluationErrors fails t when the API server logged an error
// evaluating one of the policy's expressions: a refusal may then have
// carried the static message instead of the one naming the annotation.
func (e *env) noEvaluationErrors(t *testing.T) {
	t.Helper()
	log, ok := e.cp.LogFiles()["kube-apiserver"]
	if !ok {
		t.Fatal("no kube-apiserver log")
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "error while evaluating") || strings.Contains(line, "expression") && strings.Contains(line, "resulted in error") {
			t.Errorf("kube-apiserver: %s", line)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }

func quota(name string, minimum, maximum map[string]any) *unstructured.Unstructured {
	spec := map[string]any{}
	if minimum != nil {
		spec["min"] = minimum
	}
	if maximum != nil {
		spec["max"] = maximum
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": name, "namespace": tenantNS}, "spec": spec,
	}}
}

func podGroup(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
		"metadata": map[string]any{"name": name, "namespace": tenantNS}, "spec": spec,
	}}
}

// TestCRDValidation: deploy/crds refuse ElasticQuotas and PodGroups that
// Tessera cannot act on, saying what is wrong; valid ones, in every
// quantity spelling, pass.
func TestCRDValidation(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	const gpu, mem = "tessera.dev/gpu", "tessera.dev/gpu-memory"
	eqs := e.adminDyn.Resource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}).Namespace(tenantNS)
	pgs := e.adminDyn.Resource(schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}).Namespace(tenantNS)
	bad := []struct {
		name string
		obj  *unstructured.Unstructured
		want []string
	}{
		{"quota min above max (strings)", quota("q", map[string]any{gpu: "8"}, map[string]any{gpu: "4"}),
			[]string{"spec.min[tessera.dev/gpu] (8) must not exceed spec.max[tessera.dev/gpu] (4)"}},
		{"quota min above max (integers)", quota("q", map[string]any{gpu: int64(8)}, map[string]any{gpu: int64(4)}),
			[]string{"spec.min[tessera.dev/gpu] (8) must not exceed spec.max[tessera.dev/gpu] (4)"}},
		{"quota min above max (integer and string)", quota("q", map[string]any{gpu: int64(5)}, map[string]any{gpu: "4"}),
			[]string{"spec.min[tessera.dev/gpu] (5) must not exceed spec.max[tessera.dev/gpu] (4)"}},
		{"quota min above max in other units", quota("q", map[string]any{"memory": "2Gi"}, map[string]any{"memory": "1500Mi"}),
			[]string{"spec.min[memory] (2Gi) must not exceed spec.max[memory] (1500Mi)"}},
		{"quota min above max, milli units", quota("q", map[string]any{"cpu": "1500m"}, map[string]any{"cpu": "1"}),
			[]string{"spec.min[cpu] (1500m) must not exceed spec.max[cpu] (1)"}},
		// A map has no order: either resource may be named.
		{"quota min above max for two resources", quota("q", map[string]any{gpu: "8", mem: "100"}, map[string]any{gpu: "4", mem: "80", "cpu": "1"}),
			[]string{"spec.min[tessera.dev/gpu] (8) must not exceed spec.max[tessera.dev/gpu] (4)|spec.min[tessera.dev/gpu-memory] (100) must not exceed spec.max[tessera.dev/gpu-memory] (80)"}},
		{"quota negative min (string)", quota("q", map[string]any{gpu: "-1"}, nil),
			[]string{"spec.min[tessera.dev/gpu]: Invalid value: \"\": must not be negative, got -1"}},
		{"quota negative max (integer)", quota("q", nil, map[string]any{gpu: int64(-2)}),
			[]string{"spec.max[tessera.dev/gpu]: Invalid value: \"\": must not be negative, got -2"}},
		{"quota negative with units", quota("q", nil, map[string]any{"memory": "-1Gi"}),
			[]string{"spec.max[memory]: Invalid value: \"\": must not be negative, got -1Gi"}},
		{"quota malformed min", quota("q", map[string]any{gpu: "four"}, map[string]any{gpu: "8"}),
			[]string{"spec.min[tessera.dev/gpu]: Invalid value: \"\": must be a quantity such as 4, 500m or 80Gi, not four"}},
		{"quota malformed max", quota("q", nil, map[string]any{gpu: "1.5.3"}),
			[]string{"spec.max[tessera.dev/gpu]: Invalid value: \"\": must be a quantity such as 4, 500m or 80Gi, not 1.5.3"}},
		{"quota unit typo", quota("q", nil, map[string]any{"memory": "16GB"}),
			[]string{"spec.max[memory]: Invalid value: \"\": must be a quantity such as 4, 500m or 80Gi, not 16GB"}},
		{"podgroup minMember 0", podGroup("pg", map[string]any{"minMember": int64(0)}),
			[]string{"spec.minMember: Invalid value: 0: spec.minMember in body should be greater than or equal to 1"}},
		{"podgroup negative minMember", podGroup("pg", map[string]any{"minMember": int64(-3)}),
			[]string{"spec.minMember: Invalid value: -3: spec.minMember in body should be greater than or equal to 1"}},
		{"podgroup scheduleTimeoutSeconds 0", podGroup("pg", map[string]any{"minMember": int64(2), "scheduleTimeoutSeconds": int64(0)}),
			[]string{"spec.scheduleTimeoutSeconds: Invalid value: 0: spec.scheduleTimeoutSeconds in body should be greater than or equal to 1"}},
		{"podgroup negative minResources", podGroup("pg", map[string]any{"minMember": int64(2), "minResources": map[string]any{gpu: "-4"}}),
			[]string{"spec.minResources[tessera.dev/gpu]: Invalid value: \"\": must not be negative, got -4"}},
		{"podgroup malformed minResources", podGroup("pg", map[string]any{"minMember": int64(2), "minResources": map[string]any{"memory": "lots"}}),
			[]string{"spec.minResources[memory]: Invalid value: \"\": must be a quantity such as 4, 500m or 80Gi, not lots"}},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			ri := eqs
			if c.obj.GetKind() == "PodGroup" {
				ri = pgs
			}
			_, err := ri.Create(ctx, c.obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("created; want refused with %q", c.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("error %v is not Invalid", err)
			}
			for _, w := range c.want {
				// w holds alternatives separated by |.
				if !slices.ContainsFunc(strings.Split(w, "|"), func(alt string) bool { return strings.Contains(err.Error(), alt) }) {
					t.Errorf("error %q\ndoes not say %q", err, w)
				}
			}
		})
	}
	// An update is checked as a create is.
	if _, err := eqs.Create(ctx, quota("ok", map[string]any{gpu: "4"}, map[string]any{gpu: int64(8)}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid quota refused: %v", err)
	}
	_, err := eqs.Patch(ctx, "ok", types.MergePatchType, []byte(`{"spec":{"min":{"tessera.dev/gpu":"16"}}}`), metav1.PatchOptions{})
	if want := "spec.min[tessera.dev/gpu] (16) must not exceed spec.max[tessera.dev/gpu] (8)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("update to min > max: error %v, want %q", err, want)
	}

	good := []*unstructured.Unstructured{
		quota("equal", map[string]any{gpu: "8"}, map[string]any{gpu: int64(8)}),
		quota("units", map[string]any{"memory": "1Gi", "cpu": "500m", mem: int64(0)}, map[string]any{"memory": "1024Mi", "cpu": "2", mem: "+40"}),
		quota("min-only", map[string]any{gpu: "1e3"}, nil),
		quota("max-only", nil, map[string]any{gpu: "0"}),
		quota("disjoint", map[string]any{gpu: "100"}, map[string]any{mem: "1"}),
		podGroup("pg-ok", map[string]any{"minMember": int64(1), "scheduleTimeoutSeconds": int64(30), "minResources": map[string]any{gpu: int64(8), "memory": "64Gi"}}),
	}
	for _, o := range good {
		ri := eqs
		if o.GetKind() == "PodGroup" {
			ri = pgs
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Errorf("valid %s %s refused: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// TestPolicyNamesExactlyTheStateAnnotations: the policy protects exactly
// api.GuardedAnnotations (the state annotations and the extender's quota
// requeue nudge), every tessera.dev/ key it mentions is one of them,
// and the identities it exempts are those of deploy/'s ServiceAccounts.
func TestPolicyNamesExactlyTheStateAnnotations(t *testing.T) {
	// The single-quoted string literals of a CEL expression.
	quoted := regexp.MustCompile(`'([^']*)'`)
	repo, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := install.KustomizationResources(repo, "deploy/admission")
	if err != nil {
		t.Fatal(err)
	}
	var policy *unstructured.Unstructured
	for _, f := range files {
		objs, err := install.ReadDocuments(repo, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "ValidatingAdmissionPolicy" && o.GetName() == "tessera-state-annotations" {
				if policy != nil {
					t.Fatalf("two ValidatingAdmissionPolicies tessera-state-annotations in deploy/admission")
				}
				policy = o
			}
		}
	}
	if policy == nil {
		t.Fatal("no ValidatingAdmissionPolicy tessera-state-annotations in deploy/admission")
	}
	expressions := func(field string) map[string]string {
		list, _, err := unstructured.NestedSlice(policy.Object, "spec", field)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for i, item := range list {
			m, _ := item.(map[string]any)
			name, _ := m["name"].(string)
			if name == "" {
				name = fmt.Sprint(i)
			}
			for _, k := range []string{"expression", "messageExpression"} {
				if s, ok := m[k].(string); ok {
					out[name+"."+k] = s
				}
			}
		}
		return out
	}
	variables := expressions("variables")
	listed := quoted.FindAllStringSubmatch(variables["stateAnnotations.expression"], -1)
	var got []string
	for _, m := range listed {
		got = append(got, m[1])
	}
	want := api.GuardedAnnotations()
	if !slices.Equal(got, want) {
		t.Errorf("variable stateAnnotations lists %q, want exactly api.GuardedAnnotations() %q (in that order: messages name them in it)", got, want)
	}
	// No other expression names a tessera.dev/ key of its own.
	for name, expr := range mergeMaps(variables, expressions("validations"), expressions("matchConditions")) {
		for _, m := range quoted.FindAllStringSubmatch(expr, -1) {
			if strings.HasPrefix(m[1], api.Domain+"/") && !api.IsGuardedAnnotation(m[1]) {
				t.Errorf("%s names %q, which is not one of api.GuardedAnnotations()", name, m[1])
			}
		}
	}
	// The exempt users are deploy's two ServiceAccounts.
	var accounts []string
	for _, f := range []string{"deploy/extender/rbac.yaml", "deploy/node/serviceaccount.yaml"} {
		objs, err := install.ReadDocuments(repo, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if o.GetKind() == "ServiceAccount" {
				accounts = append(accounts, "system:serviceaccount:"+o.GetNamespace()+":"+o.GetName())
			}
		}
	}
	sort.Strings(accounts)
	var exempt []string
	for _, m := range quoted.FindAllStringSubmatch(expressions("matchConditions")["not-tessera.expression"], -1) {
		exempt = append(exempt, m[1])
	}
	sort.Strings(exempt)
	if wantExempt := []string{install.ExtenderUserName, install.NodeUserName}; !slices.Equal(accounts, wantExempt) || !slices.Equal(exempt, wantExempt) {
		t.Errorf("exempt users %q, deploy's ServiceAccounts %q, identities the tests run Tessera as %q: want all three equal", exempt, accounts, wantExempt)
	}
}

func mergeMaps(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for i, m := range ms {
		for k, v := range m {
			out[fmt.Sprint(i)+"."+k] = v
		}
	}
	return out
}

// TestGPUPodsAreNotBoundBySpecNodeName: deploy/admission's
// tessera-gpu-placement refuses a tenant's pod that asks for Tessera GPUs
// and sets spec.nodeName (it would skip the extender: quota, gangs, per-GPU
// fit); pods without Tessera GPUs, and a cluster admin's, pass.
func TestGPUPodsAreNotBoundBySpecNodeName(t *testing.T) {
	e := start(t)
	const message = "a pod that asks for Tessera GPUs is placed by the scheduler and tessera-extender, not by spec.nodeName"
	pod := func(name, node string, init bool, requests bool, res v1.ResourceName) *v1.Pod {
		p := testPod(name, nil)
		p.Spec.NodeName = node
		if res != "" {
			rl := v1.ResourceList{res: resource.MustParse("1")}
			c := &p.Spec.Containers[0]
			if init {
				p.Spec.InitContainers = []v1.Container{{Name: "init", Image: "registry.k8s.io/pause:3.10"}}
				c = &p.Spec.InitContainers[0]
			}
			if requests {
				c.Resources.Requests = rl
			}
			c.Resources.Limits = rl
		}
		return p
	}
	for _, tc := range []struct {
		name   string
		client kubernetes.Interface
		pod    *v1.Pod
		refuse bool
	}{
		{"tenant, whole GPU by nodeName", e.tenant, pod("w", "gpu-node", false, false, api.ResourceGPU), true},
		{"tenant, GPU memory by nodeName", e.tenant, pod("m", "gpu-node", false, true, api.ResourceGPUMemory), true},
		{"tenant, GPU cores in an init container by nodeName", e.tenant, pod("c", "gpu-node", true, false, api.ResourceGPUCore), true},
		{"tenant, a MIG instance by nodeName", e.tenant, pod("mig", "gpu-node", false, false, api.MIGResource("1g.5gb")), true},
		{"tenant, a MIG instance requested in an init container by nodeName", e.tenant, pod("mig-init", "gpu-node", true, true, api.MIGResource("3g.40gb")), true},
		{"tenant, no GPU by nodeName", e.tenant, pod("cpu", "gpu-node", false, false, ""), false},
		{"tenant, GPU without nodeName", e.tenant, pod("sched", "", false, false, api.ResourceGPU), false},
		{"cluster admin, GPU by nodeName", e.admin, pod("admin", "gpu-node", false, false, api.ResourceGPU), false},
	} {
		_, err := tc.client.CoreV1().Pods(tenantNS).Create(t.Context(), tc.pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		switch {
		case tc.refuse && (err == nil || !strings.Contains(err.Error(), message)):
			t.Errorf("%s: create = %v, want refused with %q", tc.name, err, message)
		case !tc.refuse && err != nil:
			t.Errorf("%s: create refused: %v", tc.name, err)
		}
	}
}

// queueRequest makes a request on Queues (a name, a subresource) with a
// typed clientset's credentials: start keeps no dynamic client for the
// extender or the tenant.
func queueRequest(ctx context.Context, cs kubernetes.Interface, method, name, sub string, body *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	req := cs.CoreV1().RESTClient().Verb(method).AbsPath("/apis", api.QueueGVR.Group, api.QueueGVR.Version, api.QueueGVR.Resource, name, sub)
	if body != nil {
		b, err := body.MarshalJSON()
		if err != nil {
			return nil, err
		}
		req = req.SetHeader("Content-Type", "application/json").Body(b)
	}
	raw, err := req.DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := &unstructured.Unstructured{}
	return out, out.UnmarshalJSON(raw)
}

func queueObj(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": api.QueueGVR.GroupVersion().String(), "kind": api.QueueKind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

// TestQueueValidation: deploy/crds/queues.yaml refuses Queues that
// api.QueueFromUnstructured refuses, saying what is wrong; a two-level
// hierarchy passes and parses; the extender (deploy/extender/rbac.yaml)
// reads Queues and writes the status api.QueueStatus.Object makes, which
// the CRD's schema keeps as written and the printer columns show.
func TestQueueValidation(t *testing.T) {
	e := start(t)
	ctx := t.Context()
	const gpu, mem = "tessera.dev/gpu", "tessera.dev/gpu-memory"
	queues := e.adminDyn.Resource(api.QueueGVR)
	res := func(kv ...any) map[string]any {
		m := map[string]any{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	bad := []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{
		{"guaranteed above limit", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("guaranteed", "8", "limit", "4")}}),
			`spec.resources[tessera.dev/gpu]: Invalid value: "object": guaranteed (8) must not exceed limit (4)`},
		{"guaranteed above limit (integers, exponents)", queueObj("q", map[string]any{"resources": map[string]any{mem: res("guaranteed", "2e3", "limit", int64(1999))}}),
			`spec.resources[tessera.dev/gpu-memory]: Invalid value: "object": guaranteed (2e3) must not exceed limit (1999)`},
		{"own parent", queueObj("q", map[string]any{"parent": "q"}),
			`spec.parent: Invalid value: "object": a Queue cannot be its own parent`},
		{"parent not a name", queueObj("q", map[string]any{"parent": "Research_Dept"}),
			`spec.parent: Invalid value: "string": must be a Queue name (a DNS-1123 subdomain: lower case letters, digits, - and .), not Research_Dept`},
		{"unknown resource", queueObj("q", map[string]any{"resources": map[string]any{"cpu": res("guaranteed", "4")}}),
			`spec.resources: Invalid value: "object": unknown resource cpu: queues govern tessera.dev/gpu, tessera.dev/gpu-memory, tessera.dev/gpu-core, nvidia.com/gpu and tessera.dev/mig-<profile>`},
		{"malformed MIG profile", queueObj("q", map[string]any{"resources": map[string]any{"tessera.dev/mig-9g.5gb": res("guaranteed", "1")}}),
			`spec.resources: Invalid value: "object": unknown resource tessera.dev/mig-9g.5gb: queues govern`},
		{"weight above 1000", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("weight", int64(1001))}}),
			`spec.resources[tessera.dev/gpu].weight: Invalid value: "integer": must be between 0 and 1000`},
		{"negative weight", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("weight", int64(-1))}}),
			`spec.resources[tessera.dev/gpu].weight: Invalid value: "integer": must be between 0 and 1000`},
		{"fractional guarantee", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("guaranteed", "500m")}}),
			`spec.resources[tessera.dev/gpu].guaranteed: Invalid value: "": must be a whole number of units such as 4, 80 or 1e3, not 500m`},
		{"negative limit", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("limit", int64(-2))}}),
			`spec.resources[tessera.dev/gpu].limit: Invalid value: "": must not be negative, got -2`},
		{"malformed limit", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("limit", "eight")}}),
			`spec.resources[tessera.dev/gpu].limit: Invalid value: "": must be a quantity such as 4, 80 or 1e3, not eight`},
		// apimachinery takes seconds to parse this one: the pattern refuses
		// it before isQuantity would.
		{"exponent of many digits", queueObj("q", map[string]any{"resources": map[string]any{gpu: res("limit", "1e-1011001000000020")}}),
			`spec.resources[tessera.dev/gpu].limit: Invalid value: "": must be a quantity such as 4, 80 or 1e3, not 1e-1011001000000020`},
		{"namespace twice", queueObj("q", map[string]any{"namespaces": []any{"team-a", "team-b", "team-a"}}),
			`spec.namespaces[2]: Duplicate value: "team-a"`},
		{"namespace not a name", queueObj("q", map[string]any{"namespaces": []any{"Team.A"}}),
			`spec.namespaces[0]: Invalid value: "string": must be a namespace name (a DNS-1123 label), not Team.A`},
	}
	for _, c := range bad {
		t.Run(c.name, func(t *testing.T) {
			began := time.Now()
			_, err := queues.Create(ctx, c.obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("created; want refused with %q", c.want)
			}
			if !apierrors.IsInvalid(err) {
				t.Errorf("error %v is not Invalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q\ndoes not say %q", err, c.want)
			}
			if d := time.Since(began); c.name == "exponent of many digits" && d > 5*time.Second {
				t.Errorf("refused after %v", d)
			}
			// Tessera's parser refuses it too (fail closed), naming the queue.
			if _, perr := api.QueueFromUnstructured(c.obj); perr == nil || !strings.Contains(perr.Error(), "Queue q: ") {
				t.Errorf("api.QueueFromUnstructured error = %v, want one naming Queue q", perr)
			}
		})
	}
	// An update is checked as a create is.
	if _, err := queues.Create(ctx, queueObj("upd", map[string]any{"resources": map[string]any{gpu: res("guaranteed", "4", "limit", int64(8))}}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("valid queue refused: %v", err)
	}
	_, err := queues.Patch(ctx, "upd", types.MergePatchType, []byte(`{"spec":{"resources":{"tessera.dev/gpu":{"guaranteed":"16"}}}}`), metav1.PatchOptions{})
	if want := "guaranteed (16) must not exceed limit (8)"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("update to guaranteed > limit: error %v, want %q", err, want)
	}

	// A department and a team below it, in every quantity spelling.
	good := []*unstructured.Unstructured{
		queueObj("research", map[string]any{"resources": map[string]any{
			gpu: res("guaranteed", int64(8), "limit", "16", "weight", int64(2)),
			mem: res("guaranteed", "1e3"),
		}}),
		queueObj("team-a", map[string]any{"parent": "research", "namespaces": []any{"team-a", "team-a-dev"}, "resources": map[string]any{
			gpu:                      res("guaranteed", "4", "limit", "4", "weight", int64(0)),
			"tessera.dev/gpu-core":   res("limit", "+400"),
			"nvidia.com/gpu":         res("weight", int64(1000)),
			"tessera.dev/mig-1g.5gb": res("guaranteed", "2", "limit", int64(7)),
		}}),
	}
	want := map[string]*api.Queue{
		"research": {Name: "research", Resources: map[v1.ResourceName]api.QueueResource{
			gpu: {Guaranteed: 8, Limit: 16, Limited: true, Weight: 2},
			mem: {Guaranteed: 1000, Weight: 1},
		}},
		"team-a": {Name: "team-a", Parent: "research", Namespaces: []string{"team-a", "team-a-dev"}, Resources: map[v1.ResourceName]api.QueueResource{
			gpu:                      {Guaranteed: 4, Limit: 4, Limited: true, Weight: 0},
			"tessera.dev/gpu-core":   {Limit: 400, Limited: true, Weight: 1},
			"nvidia.com/gpu":         {Weight: 1000},
			"tessera.dev/mig-1g.5gb": {Guaranteed: 2, Limit: 7, Limited: true, Weight: 1},
		}},
	}
	var parsed []*api.Queue
	for _, o := range good {
		if _, err := queues.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("valid Queue %s refused: %v", o.GetName(), err)
		}
		// Read back as the extender reads it.
		got, err := queueRequest(ctx, e.extender, "GET", o.GetName(), "", nil)
		if err != nil {
			t.Fatalf("extender get Queue %s: %v", o.GetName(), err)
		}
		q, err := api.QueueFromUnstructured(got)
		if err != nil {
			t.Fatalf("stored Queue %s does not parse: %v", o.GetName(), err)
		}
		if !reflect.DeepEqual(q, want[o.GetName()]) {
			t.Errorf("Queue %s parsed as %+v, want %+v", o.GetName(), q, want[o.GetName()])
		}
		parsed = append(parsed, q)
	}
	// The pair is a valid tree by the rule the extender applies.
	var specs []queue.Spec
	for _, q := range parsed {
		specs = append(specs, queue.Spec{Name: q.Name, Parent: q.Parent, Namespaces: q.Namespaces})
	}
	tree := queue.Build(specs)
	for _, q := range parsed {
		if why := tree.Invalid(q.Name); why != "" {
			t.Errorf("Queue %s is not a valid queue of the tree: %s", q.Name, why)
		}
	}
	if _, err := queueRequest(ctx, e.extender, "GET", "", "", nil); err != nil {
		t.Errorf("extender list Queues: %v", err)
	}

	// The extender writes the status; the tenant (edit in its namespace)
	// and the extender's spec writes are refused by RBAC.
	status := api.QueueStatus{
		Used:         map[v1.ResourceName]int64{gpu: 3},
		Guaranteed:   map[v1.ResourceName]int64{gpu: 4},
		FairShare:    map[v1.ResourceName]int64{gpu: 5, mem: 80},
		Usage:        map[v1.ResourceName]float64{gpu: 12345.6, mem: 1e-7},
		UsageUpdated: time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC),
	}
	cur, err := queueRequest(ctx, e.extender, "GET", "team-a", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	cur.Object["status"] = status.Object()
	if _, err := queueRequest(ctx, e.extender, "PUT", "team-a", "status", cur); err != nil {
		t.Fatalf("extender update Queue status: %v", err)
	}
	back, err := queues.Get(ctx, "team-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gotStatus, err := api.QueueStatusFromUnstructured(back)
	if err != nil {
		t.Fatalf("stored status does not parse: %v", err)
	}
	if !reflect.DeepEqual(gotStatus, status) {
		t.Errorf("status read back %+v, want %+v", gotStatus, status)
	}
	if _, err := queueRequest(ctx, e.extender, "PUT", "team-a", "", back); !apierrors.IsForbidden(err) {
		t.Errorf("extender update of a Queue's spec: error %v, want Forbidden", err)
	}
	if _, err := queueRequest(ctx, e.tenant, "POST", "", "", queueObj("mine", nil)); !apierrors.IsForbidden(err) {
		t.Errorf("tenant create Queue: error %v, want Forbidden", err)
	}

	// The printer columns: Parent, Used GPUs, Fair share.
	var table metav1.Table
	raw, err := e.admin.CoreV1().RESTClient().Get().AbsPath("/apis", api.QueueGVR.Group, api.QueueGVR.Version, api.QueueGVR.Resource, "team-a").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &table); err != nil {
		t.Fatal(err)
	}
	cells := map[string]any{}
	for i, c := range table.ColumnDefinitions {
		if len(table.Rows) == 1 && i < len(table.Rows[0].Cells) {
			cells[c.Name] = table.Rows[0].Cells[i]
		}
	}
	for col, want := range map[string]any{"Parent": "research", "Used GPUs": "3", "Fair share": "5"} {
		if cells[col] != want {
			t.Errorf("column %s = %v, want %v (table %s)", col, cells[col], want, raw)
		}
	}
	e.noEvaluationErrors(t)
}
