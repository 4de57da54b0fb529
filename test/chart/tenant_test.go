package chart

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

// The tenants' ClusterRoles (templates/tenant/rbac.yaml) and the built-in
// roles each must be aggregated into.
const (
	tenantView  = "tessera-tenant-view"
	tenantEdit  = "tessera-tenant-edit"
	queueReader = "tessera-queue-reader"
)

var tenantAggregation = map[string][]string{
	tenantView: {"view", "edit", "admin"},
	tenantEdit: {"edit", "admin"},
}

// readVerbs are the only verbs a tenant gets on ElasticQuotas and Queues.
var readVerbs = []string{"get", "list", "watch"}

// TestTenantRolesRendering: the chart ships tessera-tenant-view and
// tessera-tenant-edit with the aggregation labels of view/edit/admin and
// tessera-queue-reader with none, binds none of them, grants reads only
// on ElasticQuotas and Queues, writes only on PodGroups (both APIs, not
// their status), nothing else; rbac.tenantAggregation and
// rbac.queueReader turn them off; and the PodGroup and ElasticQuota CRDs
// the chart installs are of the groups granted.
func TestTenantRolesRendering(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)
	chart := filepath.Join(repo, "charts", "tessera")
	for _, c := range []struct {
		name         string
		args         []string
		want, absent []string
	}{
		{"defaults", nil, []string{tenantView, tenantEdit, queueReader}, nil},
		{"deploy-values", []string{"-f", "charts/deploy-values.yaml"}, []string{tenantView, tenantEdit, queueReader}, nil},
		{"aggregation-off", []string{"--set", "rbac.tenantAggregation=false"}, []string{queueReader}, []string{tenantView, tenantEdit}},
		{"all-off", []string{"--set", "rbac.tenantAggregation=false,rbac.queueReader=false"}, nil, []string{tenantView, tenantEdit, queueReader}},
	} {
		t.Run(c.name, func(t *testing.T) {
			objs := render(t, helm, repo, chart, c.args...)
			for _, name := range c.want {
				role := find(objs, "ClusterRole", "", name)
				if role == nil {
					t.Errorf("no ClusterRole %s", name)
					continue
				}
				checkTenantRole(t, role)
			}
			for _, name := range c.absent {
				if find(objs, "ClusterRole", "", name) != nil {
					t.Errorf("ClusterRole %s rendered, want it absent", name)
				}
			}
			// Nothing binds them: the built-in roles are bound by the
			// cluster's owners, tessera-queue-reader by the operator.
			for _, o := range objs {
				if k := o.GetKind(); k != "RoleBinding" && k != "ClusterRoleBinding" {
					continue
				}
				ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
				if slices.Contains([]string{tenantView, tenantEdit, queueReader, "view", "edit", "admin"}, ref) {
					t.Errorf("%s binds ClusterRole %s: the chart binds no tenant role", key(o), ref)
				}
			}
			// The CRDs the chart installs are those of the groups granted.
			for _, crd := range []struct{ name, group string }{
				{"podgroups.scheduling.x-k8s.io", "scheduling.x-k8s.io"},
				{"elasticquotas.scheduling.x-k8s.io", "scheduling.x-k8s.io"},
				{"queues.tessera.dev", "tessera.dev"},
			} {
				o := find(objs, "CustomResourceDefinition", "", crd.name)
				if o == nil {
					t.Errorf("no CustomResourceDefinition %s", crd.name)
					continue
				}
				if g, _, _ := unstructured.NestedString(o.Object, "spec", "group"); g != crd.group {
					t.Errorf("CustomResourceDefinition %s: group %q, the tenant roles grant %q", crd.name, g, crd.group)
				}
			}
		})
	}
}

// checkTenantRole checks one tenant ClusterRole's labels and rules.
func checkTenantRole(t *testing.T, role *unstructured.Unstructured) {
	t.Helper()
	name := role.GetName()
	labels := role.GetLabels()
	for _, r := range []string{"view", "edit", "admin"} {
		l := "rbac.authorization.k8s.io/aggregate-to-" + r
		want := slices.Contains(tenantAggregation[name], r)
		if got := labels[l] == "true"; got != want {
			t.Errorf("ClusterRole %s: label %s=%q, want it %v", name, l, labels[l], want)
		}
	}
	if _, ok := role.Object["aggregationRule"]; ok {
		t.Errorf("ClusterRole %s has an aggregationRule", name)
	}
	var cr rbacv1.ClusterRole
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(role.Object, &cr); err != nil {
		t.Fatalf("ClusterRole %s: %v", name, err)
	}
	if len(cr.Rules) == 0 {
		t.Errorf("ClusterRole %s has no rules", name)
	}
	podGroupsWritten := map[string]bool{}
	for _, rule := range cr.Rules {
		if len(rule.NonResourceURLs) > 0 || len(rule.ResourceNames) > 0 {
			t.Errorf("ClusterRole %s: rule %v names URLs or objects", name, rule)
		}
		for _, v := range rule.Verbs {
			if !slices.Contains([]string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}, v) {
				t.Errorf("ClusterRole %s: verb %q (escalate, bind, impersonate or a wildcard?)", name, v)
			}
		}
		write := slices.ContainsFunc(rule.Verbs, func(v string) bool { return !slices.Contains(readVerbs, v) })
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				gr := r + "." + g
				switch gr {
				case "podgroups.scheduling.x-k8s.io", "podgroups.scheduling.volcano.sh":
					if !slices.Contains(rule.Verbs, "get") || !slices.Contains(rule.Verbs, "list") || !slices.Contains(rule.Verbs, "watch") {
						t.Errorf("ClusterRole %s: %s without get, list and watch: %v", name, gr, rule.Verbs)
					}
					if write {
						podGroupsWritten[g] = true
						if name != tenantEdit {
							t.Errorf("ClusterRole %s writes %s (%v): only %s may", name, gr, rule.Verbs, tenantEdit)
						}
					}
				case "elasticquotas.scheduling.x-k8s.io":
					if name != tenantView || !slices.Equal(rule.Verbs, readVerbs) {
						t.Errorf("ClusterRole %s: %s %v, want %v in %s alone", name, gr, rule.Verbs, readVerbs, tenantView)
					}
				case "queues.tessera.dev":
					if name != queueReader || !slices.Equal(rule.Verbs, readVerbs) {
						t.Errorf("ClusterRole %s: %s %v, want %v in %s alone", name, gr, rule.Verbs, readVerbs, queueReader)
					}
				default:
					// podgroups/status, elasticquotas/status,
					// queues/status, "*", or anything of another API.
					t.Errorf("ClusterRole %s grants %v on %s", name, rule.Verbs, gr)
				}
			}
		}
	}
	if name == tenantEdit {
		for _, g := range []string{"scheduling.x-k8s.io", "scheduling.volcano.sh"} {
			if !podGroupsWritten[g] {
				t.Errorf("ClusterRole %s does not write podgroups.%s", name, g)
			}
		}
		for _, rule := range cr.Rules {
			for _, v := range []string{"create", "update", "patch", "delete"} {
				if !slices.Contains(rule.Verbs, v) {
					t.Errorf("ClusterRole %s: podgroups without %s: %v", name, v, rule.Verbs)
				}
			}
		}
	}
}

// TestTenantAccess installs the chart's tenant roles on a real API server
// whose kube-controller-manager aggregates ClusterRoles, binds users to the
// built-in admin, edit and view in their namespace (RoleBindings, as a
// cluster gives its tenants), and checks what they may do: edit and admin
// write PodGroups of both APIs there, view reads them; all three read
// ElasticQuotas there and write none; no Queue until the operator binds
// tessera-queue-reader, and then read only; nothing in another namespace
// or Tessera's.
func TestTenantAccess(t *testing.T) {
	repo := repoRoot(t)
	helm := helmBinary(t, repo)
	const ns, other = "team-a", "team-b"
	users := map[string]*controlplane.User{
		"admin": {Name: "ada", Groups: []string{"tenants"}},
		"edit":  {Name: "alice", Groups: []string{"tenants"}},
		"view":  {Name: "victor", Groups: []string{"tenants"}},
	}
	cp := controlplane.StartForTest(t, controlplane.Options{Users: []*controlplane.User{users["admin"], users["edit"], users["view"]}})
	ctx := t.Context()
	if err := cp.StartControllerManager(ctx, controlplane.ControllerManagerOptions{
		Controllers: []string{"serviceaccount-controller", "clusterrole-aggregation-controller"},
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.StopControllerManager(); err != nil {
			t.Error(err)
		}
	})
	for _, n := range []string{ns, other, releaseNS} {
		if err := cp.EnsureNamespace(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	dyn, err := dynamic.NewForConfig(cp.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, helm, repo, filepath.Join(repo, "charts", "tessera"))
	crds := crdsOf(objs)
	volcano, err := install.ReadDocuments(repo, "test/framework/crds/volcano-podgroups.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, crd := range append(crds, volcano...) {
		if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{FieldManager: fieldManager}); err != nil {
			t.Fatalf("create CustomResourceDefinition %s: %v", crd.GetName(), err)
		}
		if err := install.WaitEstablished(ctx, dyn, crd.GetName()); err != nil {
			t.Fatal(err)
		}
	}
	mapper, err := newMapper(cp)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{tenantView, tenantEdit, queueReader} {
		o := find(objs, "ClusterRole", "", name)
		if o == nil {
			t.Fatalf("no ClusterRole %s rendered", name)
		}
		if _, err := createFor(ctx, dyn, mapper, o); err != nil {
			t.Fatalf("create ClusterRole %s: %v", name, err)
		}
	}
	rbac := cp.Client().RbacV1()
	for role, u := range users {
		if _, err := rbac.RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: u.Name + "-" + role},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: u.Name}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	pg := func(g string) authorizationv1.ResourceAttributes {
		v := "v1alpha1"
		if g == "scheduling.volcano.sh" {
			v = "v1beta1"
		}
		return authorizationv1.ResourceAttributes{Group: g, Version: v, Resource: "podgroups"}
	}
	eq := authorizationv1.ResourceAttributes{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
	queues := authorizationv1.ResourceAttributes{Group: "tessera.dev", Version: "v1alpha1", Resource: "queues"}
	with := func(ra authorizationv1.ResourceAttributes, namespace, verb, sub string) authorizationv1.ResourceAttributes {
		ra.Namespace, ra.Verb, ra.Subresource = namespace, verb, sub
		return ra
	}
	writes := []string{"create", "update", "patch", "delete", "deletecollection"}

	// The controller aggregates, then the authorizer's cache catches up:
	// wait for what each binding must grant before checking what it must
	// not.
	for role, u := range users {
		ra := with(eq, ns, "list", "")
		if role != "view" {
			ra = with(pg("scheduling.volcano.sh"), ns, "create", "")
		}
		if err := waitAccess(ctx, cp, u, ra, true); err != nil {
			t.Fatalf("%s (%s in %s): %v", u.Name, role, ns, err)
		}
	}

	type check struct {
		ra    authorizationv1.ResourceAttributes
		allow bool
	}
	for role, u := range users {
		var checks []check
		for _, g := range []string{"scheduling.x-k8s.io", "scheduling.volcano.sh"} {
			for _, v := range readVerbs {
				checks = append(checks, check{with(pg(g), ns, v, ""), true})
			}
			for _, v := range writes {
				checks = append(checks, check{with(pg(g), ns, v, ""), role != "view"})
			}
			checks = append(checks,
				check{with(pg(g), ns, "update", "status"), false},
				check{with(pg(g), ns, "patch", "status"), false},
				check{with(pg(g), other, "get", ""), false},
				check{with(pg(g), other, "create", ""), false},
				check{with(pg(g), releaseNS, "list", ""), false},
				check{with(pg(g), "", "list", ""), false},
			)
		}
		for _, v := range readVerbs {
			checks = append(checks, check{with(eq, ns, v, ""), true}, check{with(eq, other, v, ""), false})
		}
		for _, v := range writes {
			checks = append(checks, check{with(eq, ns, v, ""), false})
		}
		checks = append(checks,
			check{with(eq, ns, "update", "status"), false},
			check{with(eq, ns, "patch", "status"), false},
			check{with(eq, "", "list", ""), false},
			check{with(queues, "", "get", ""), false},
			check{with(queues, "", "list", ""), false},
			check{with(queues, "", "watch", ""), false},
			check{with(queues, "", "create", ""), false},
			check{with(queues, "", "update", "status"), false},
		)
		for _, res := range []string{"secrets", "configmaps"} {
			checks = append(checks, check{authorizationv1.ResourceAttributes{Namespace: releaseNS, Verb: "get", Version: "v1", Resource: res}, false})
		}
		for _, c := range checks {
			if got, err := allowed(ctx, cp, u, c.ra); err != nil {
				t.Fatal(err)
			} else if got != c.allow {
				t.Errorf("%s (%s in %s): %s: allowed %v, want %v", u.Name, role, ns, describeRA(c.ra), got, c.allow)
			}
		}
	}

	// For real, as alice (edit): she makes PodGroups of both APIs, reads
	// her namespace's ElasticQuota and cannot change it or make one.
	alice, err := dynamic.NewForConfig(cp.RESTConfigFor(users["edit"]))
	if err != nil {
		t.Fatal(err)
	}
	quota := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "ElasticQuota",
		"metadata": map[string]any{"name": "quota", "namespace": ns},
		"spec": map[string]any{
			"min": map[string]any{"tessera.dev/gpu": "2"},
			"max": map[string]any{"tessera.dev/gpu": "4"},
		},
	}}
	eqGVR := schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
	if _, err := dyn.Resource(eqGVR).Namespace(ns).Create(ctx, quota, metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin: create ElasticQuota: %v", err)
	}
	for _, o := range []*unstructured.Unstructured{
		{Object: map[string]any{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
			"metadata": map[string]any{"name": "train"}, "spec": map[string]any{"minMember": int64(4)}}},
		{Object: map[string]any{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
			"metadata": map[string]any{"name": "train"}, "spec": map[string]any{"minMember": int64(4)}}},
	} {
		gvk := o.GroupVersionKind()
		gvr := schema.GroupVersionResource{Group: gvk.Group, Version: gvk.Version, Resource: "podgroups"}
		if _, err := alice.Resource(gvr).Namespace(ns).Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Errorf("alice: create %s PodGroup in %s: %v", gvk.Group, ns, err)
		}
		if err := alice.Resource(gvr).Namespace(ns).Delete(ctx, "train", metav1.DeleteOptions{}); err != nil {
			t.Errorf("alice: delete %s PodGroup in %s: %v", gvk.Group, ns, err)
		}
		if _, err := alice.Resource(gvr).Namespace(other).Create(ctx, o, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("alice: create %s PodGroup in %s: %v, want Forbidden", gvk.Group, other, err)
		}
	}
	if list, err := alice.Resource(eqGVR).Namespace(ns).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 1 {
		t.Errorf("alice: list ElasticQuotas in %s: %v", ns, err)
	}
	own := quota.DeepCopy()
	own.SetName("mine")
	if _, err := alice.Resource(eqGVR).Namespace(ns).Create(ctx, own, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice: create ElasticQuota: %v, want Forbidden", err)
	}
	if err := alice.Resource(eqGVR).Namespace(ns).Delete(ctx, "quota", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice: delete ElasticQuota: %v, want Forbidden", err)
	}
	queueGVR := schema.GroupVersionResource{Group: "tessera.dev", Version: "v1alpha1", Resource: "queues"}
	if _, err := alice.Resource(queueGVR).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice: list Queues without tessera-queue-reader bound: %v, want Forbidden", err)
	}

	// The operator binds tessera-queue-reader to the tenants' group: they
	// read Queues, and write neither them nor their status.
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tenants-queue-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: queueReader},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "Group", Name: "tenants"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for role, u := range users {
		if err := waitAccess(ctx, cp, u, with(queues, "", "list", ""), true); err != nil {
			t.Fatalf("%s (%s): %v", u.Name, role, err)
		}
		for _, c := range []check{
			{with(queues, "", "get", ""), true},
			{with(queues, "", "watch", ""), true},
			{with(queues, "", "create", ""), false},
			{with(queues, "", "update", ""), false},
			{with(queues, "", "patch", ""), false},
			{with(queues, "", "delete", ""), false},
			{with(queues, "", "update", "status"), false},
			{with(queues, "", "patch", "status"), false},
			{with(eq, other, "list", ""), false},
			{with(eq, ns, "create", ""), false},
		} {
			if got, err := allowed(ctx, cp, u, c.ra); err != nil {
				t.Fatal(err)
			} else if got != c.allow {
				t.Errorf("%s (%s, tessera-queue-reader bound): %s: allowed %v, want %v", u.Name, role, describeRA(c.ra), got, c.allow)
			}
		}
	}
	if _, err := alice.Resource(queueGVR).List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("alice: list Queues with tessera-queue-reader bound: %v", err)
	}
}

// allowed asks the API server (SubjectAccessReview) whether u may do ra.
func allowed(ctx context.Context, cp *controlplane.ControlPlane, u *controlplane.User, ra authorizationv1.ResourceAttributes) (bool, error) {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User: u.Name, Groups: append([]string{"system:authenticated"}, u.Groups...), ResourceAttributes: &ra}}
	r, err := cp.Client().AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("SubjectAccessReview %s for %s: %w", describeRA(ra), u.Name, err)
	}
	return r.Status.Allowed, nil
}

// waitAccess waits, up to 60 s, until allowed(u, ra) is want.
func waitAccess(ctx context.Context, cp *controlplane.ControlPlane, u *controlplane.User, ra authorizationv1.ResourceAttributes, want bool) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := allowed(ctx, cp, u, ra)
		last = err
		return err == nil && got == want, nil
	})
	if err != nil {
		return fmt.Errorf("%s: never allowed=%v (last error %v): %w", describeRA(ra), want, last, err)
	}
	return nil
}

func describeRA(ra authorizationv1.ResourceAttributes) string {
	r := ra.Resource
	if ra.Subresource != "" {
		r += "/" + ra.Subresource
	}
	if ra.Group != "" {
		r += "." + ra.Group
	}
	where := "cluster-wide"
	if ra.Namespace != "" {
		where = "in " + ra.Namespace
	}
	return fmt.Sprintf("%s %s %s", ra.Verb, r, where)
}
