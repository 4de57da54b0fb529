package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// EnsureNamespace creates namespace name and its "default" ServiceAccount
// when they do not exist yet. Without kube-controller-manager nobody else
// creates that ServiceAccount, and the ServiceAccount admission plugin
// rejects pods that would use a missing one.
func (cp *ControlPlane) EnsureNamespace(ctx context.Context, name string) error {
	c := cp.client.CoreV1()
	_, err := c.Namespaces().Create(ctx, &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace %s: %w", name, err)
	}
	sa := &v1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: name}}
	_, err = c.ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/default: %w", name, err)
	}
	return nil
}

// NodeOptions describe a Node made by CreateReadyNode.
type NodeOptions struct {
	Name        string
	Labels      map[string]string
	Annotations map[string]string
	// Capacity of the node. cpu (8), memory (32Gi) and pods (110) are added
	// when missing, so that ordinary pods fit.
	Capacity v1.ResourceList
	// Allocatable defaults to Capacity (after the defaults above).
	Allocatable v1.ResourceList
	// Taints are put on the node. (The node.kubernetes.io/not-ready taint
	// that the API server adds to every new Node is removed.)
	Taints []v1.Taint
}

// CreateReadyNode creates a Node the real kube-scheduler will bind pods to,
// as a kubelet and the node lifecycle controller together would leave it:
//
//   - the Node object with labels, annotations and taints;
//   - status (capacity, allocatable, a Ready=True condition and the other
//     conditions False, a loopback InternalIP) written through the status
//     subresource, as a kubelet does;
//   - the node.kubernetes.io/not-ready:NoSchedule taint removed. The
//     TaintNodesByCondition admission plugin puts that taint on every new
//     Node, and normally the node lifecycle controller in
//     kube-controller-manager takes it off once the node is Ready.
//
// No heartbeat is needed: without kube-controller-manager nothing watches
// node leases or condition timestamps, and kube-scheduler itself does not
// look at the Ready condition (only at taints and unschedulable).
func (cp *ControlPlane) CreateReadyNode(ctx context.Context, o NodeOptions) (*v1.Node, error) {
	if o.Name == "" {
		return nil, fmt.Errorf("CreateReadyNode: empty node name")
	}
	capacity := o.Capacity.DeepCopy()
	if capacity == nil {
		capacity = v1.ResourceList{}
	}
	for name, q := range map[v1.ResourceName]string{v1.ResourceCPU: "8", v1.ResourceMemory: "32Gi", v1.ResourcePods: "110"} {
		if _, ok := capacity[name]; !ok {
			capacity[name] = resource.MustParse(q)
		}
	}
	allocatable := o.Allocatable.DeepCopy()
	if allocatable == nil {
		allocatable = capacity.DeepCopy()
	}
	for name, q := range capacity {
		if _, ok := allocatable[name]; !ok && (name == v1.ResourceCPU || name == v1.ResourceMemory || name == v1.ResourcePods) {
			allocatable[name] = q
		}
	}

	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        o.Name,
			Labels:      maps.Clone(o.Labels),
			Annotations: maps.Clone(o.Annotations),
		},
		Spec: v1.NodeSpec{Taints: slices.Clone(o.Taints)},
	}
	if node.Labels == nil {
		node.Labels = map[string]string{}
	}
	if _, ok := node.Labels[v1.LabelHostname]; !ok {
		node.Labels[v1.LabelHostname] = o.Name
	}
	nodes := cp.client.CoreV1().Nodes()
	if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create node %s: %w", o.Name, err)
	}
	if err := cp.SetNodeStatus(ctx, o.Name, capacity, allocatable); err != nil {
		return nil, err
	}
	// Take off the not-ready taint, as the node lifecycle controller would.
	var out *v1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := nodes.Get(ctx, o.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Spec.Taints = slices.DeleteFunc(n.Spec.Taints, func(t v1.Taint) bool {
			return t.Key == v1.TaintNodeNotReady || t.Key == v1.TaintNodeUnreachable
		})
		out, err = nodes.Update(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("remove not-ready taint from node %s: %w", o.Name, err)
	}
	return out, nil
}

// SetNodeStatus writes capacity, allocatable and fresh Ready=True (and
// pressure=False) conditions through the node's status subresource, as a
// kubelet's status update does (a strategic merge patch: resources not named
// keep their old values). Use it to change what a node advertises,
// e.g. extended resources reported by a device plugin.
func (cp *ControlPlane) SetNodeStatus(ctx context.Context, name string, capacity, allocatable v1.ResourceList) error {
	now := metav1.NewTime(time.Now())
	cond := func(t v1.NodeConditionType, s v1.ConditionStatus, reason string) v1.NodeCondition {
		return v1.NodeCondition{Type: t, Status: s, Reason: reason, LastHeartbeatTime: now, LastTransitionTime: now}
	}
	status := map[string]any{
		"status": v1.NodeStatus{
			Capacity:    capacity,
			Allocatable: allocatable,
			Conditions: []v1.NodeCondition{
				cond(v1.NodeReady, v1.ConditionTrue, "KubeletReady"),
				cond(v1.NodeMemoryPressure, v1.ConditionFalse, "KubeletHasSufficientMemory"),
				cond(v1.NodeDiskPressure, v1.ConditionFalse, "KubeletHasNoDiskPressure"),
				cond(v1.NodePIDPressure, v1.ConditionFalse, "KubeletHasSufficientPID"),
			},
			Addresses: []v1.NodeAddress{
				{Type: v1.NodeInternalIP, Address: "127.0.0.1"},
				{Type: v1.NodeHostName, Address: name},
			},
		},
	}
	patch, err := json.Marshal(status)
	if err != nil {
		return fmt.Errorf("marshal node status: %w", err)
	}
	_, err = cp.client.CoreV1().Nodes().Patch(ctx, name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch status of node %s: %w", name, err)
	}
	return nil
}

// WaitForPod polls pod namespace/name every 100ms until cond returns true or
// an error, or timeout passes; the timeout error names what was awaited and
// shows the pod's last status.
func (cp *ControlPlane) WaitForPod(ctx context.Context, namespace, name, what string, timeout time.Duration, cond func(*v1.Pod) (bool, error)) (*v1.Pod, error) {
	var last *v1.Pod
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := cp.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			lastErr = err
			return false, nil
		}
		last = p
		return cond(p)
	})
	if err != nil {
		detail := "never read"
		if last != nil {
			b, _ := json.Marshal(last.Status)
			detail = fmt.Sprintf("nodeName=%q status=%s", last.Spec.NodeName, b)
		}
		return last, fmt.Errorf("waiting %s for pod %s/%s to be %s: %w (last get error: %v; pod: %s)", timeout, namespace, name, what, err, lastErr, detail)
	}
	return last, nil
}

// AggregateClusterRole fills the rules of ClusterRole name from its
// aggregationRule, as kube-controller-manager's clusterrole-aggregation
// controller does (the test control plane runs no controller manager, so
// the API server's bootstrap roles edit, view and admin have no rules
// until this runs). Selected roles that aggregate themselves are filled
// first. It returns the rules name ends up with.
func (cp *ControlPlane) AggregateClusterRole(ctx context.Context, name string) ([]rbacv1.PolicyRule, error) {
	return cp.aggregateClusterRole(ctx, name, map[string]bool{})
}

func (cp *ControlPlane) aggregateClusterRole(ctx context.Context, name string, seen map[string]bool) ([]rbacv1.PolicyRule, error) {
	roles := cp.client.RbacV1().ClusterRoles()
	role, err := roles.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get ClusterRole %s: %w", name, err)
	}
	if role.AggregationRule == nil || seen[name] {
		return role.Rules, nil
	}
	seen[name] = true
	var rules []rbacv1.PolicyRule
	for _, sel := range role.AggregationRule.ClusterRoleSelectors {
		s, err := metav1.LabelSelectorAsSelector(&sel)
		if err != nil {
			return nil, fmt.Errorf("ClusterRole %s: %w", name, err)
		}
		list, err := roles.List(ctx, metav1.ListOptions{LabelSelector: s.String()})
		if err != nil {
			return nil, fmt.Errorf("list ClusterRoles for %s: %w", name, err)
		}
		for _, r := range list.Items {
			if r.Name == name {
				continue
			}
			sub, err := cp.aggregateClusterRole(ctx, r.Name, seen)
			if err != nil {
				return nil, err
			}
			for _, rule := range sub {
				if !slices.ContainsFunc(rules, func(have rbacv1.PolicyRule) bool { return equality.Semantic.DeepEqual(have, rule) }) {
					rules = append(rules, rule)
				}
			}
		}
	}
	role.Rules = rules
	if _, err := roles.Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("update ClusterRole %s: %w", name, err)
	}
	return rules, nil
}

// WaitAllowed waits, for up to 30 s, until the API server's authorizer lets
// user do what ra names. It reads RBAC through informers, so a binding just
// created may not be in effect yet: a request made at once can be refused
// with a plain Forbidden.
func (cp *ControlPlane) WaitAllowed(ctx context.Context, user string, ra authorizationv1.ResourceAttributes) error {
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: user, ResourceAttributes: &ra}}
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cp.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = r.Status.Reason
		return r.Status.Allowed, nil
	})
	if err != nil {
		return fmt.Errorf("%s may not %s %s/%s in %q: %w (%s)", user, ra.Verb, ra.Resource, ra.Subresource, ra.Namespace, err, last)
	}
	return nil
}
