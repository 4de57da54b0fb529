// Package install puts Tessera's deploy/ objects into a test control plane
// as a real install would: every document read from the repository, never
// a hand-kept copy, and created unchanged, except where a test cluster has
// no Service to point at (the gang webhook's clientConfig and the
// scheduler's extender URL, see GangWebhook and SchedulerConfig).
//
//	install.RBAC(ctx, cfg, repo)            // deploy/node namespace + ServiceAccount, the rbac.yaml files
//	install.CRDs(ctx, cfg, repo)            // deploy/crds, established
//	install.AdmissionPolicy(ctx, cfg, repo) // deploy/admission, enforced
//	install.GangWebhook(ctx, cfg, repo, "https://127.0.0.1:PORT", tls.CAPEM)
//
// Tessera's components run as the identities of their ServiceAccounts
// (ExtenderUser, NodeUser): static tokens of the test API server whose
// user names are those a ServiceAccount token would carry, so RBAC
// bindings to the ServiceAccounts and the admission policy's exemptions
// apply to them unchanged.
package install

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/test/framework/controlplane"
)

// The user names of Tessera's ServiceAccounts (deploy/extender,
// deploy/node), as the API server sees a pod running under them.
const (
	ExtenderUserName = "system:serviceaccount:kube-system:tessera-extender"
	NodeUserName     = "system:serviceaccount:tessera-system:tessera-node"
)

// ExtenderUser is tessera-extender's identity: the ServiceAccount
// kube-system/tessera-extender, with the groups every ServiceAccount of
// kube-system has. Pass it in controlplane.Options.Users.
func ExtenderUser() *controlplane.User {
	return &controlplane.User{Name: ExtenderUserName, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:kube-system"}}
}

// NodeUser is tessera-node's identity: the DaemonSet's ServiceAccount
// tessera-system/tessera-node.
func NodeUser() *controlplane.User {
	return &controlplane.User{Name: NodeUserName, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:tessera-system"}}
}

// RBACFiles are the files RBAC applies, in order, relative to the
// repository: the node agent's namespace and ServiceAccount first, then
// every document of both rbac.yaml (the extender's ServiceAccount, the
// ClusterRoles, Roles and their bindings), then the tenants' ClusterRoles
// (deploy/tenant: aggregated into view, edit and admin, and the unbound
// tessera-queue-reader), as an install applies them.
func RBACFiles() []string {
	return []string{
		"deploy/node/namespace.yaml",
		"deploy/node/serviceaccount.yaml",
		"deploy/extender/rbac.yaml",
		"deploy/node/rbac.yaml",
		"deploy/tenant/rbac.yaml",
	}
}

// ReadDocuments reads every non-empty YAML document of the file rel (a
// path relative to repoRoot).
func ReadDocuments(repoRoot, rel string) ([]*unstructured.Unstructured, error) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", rel, err)
	}
	var out []*unstructured.Unstructured
	for i, doc := range splitDocuments(raw) {
		var obj map[string]any
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			return nil, fmt.Errorf("%s document %d: %w", rel, i+1, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, fmt.Errorf("%s document %d: no apiVersion or kind", rel, i+1)
		}
		out = append(out, u)
	}
	return out, nil
}

// splitDocuments splits a YAML stream at its "---" lines.
func splitDocuments(raw []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	for _, line := range bytes.SplitAfter(raw, []byte("\n")) {
		if t := bytes.TrimRight(line, " \t\r\n"); bytes.Equal(t, []byte("---")) {
			docs = append(docs, bytes.Clone(cur.Bytes()))
			cur.Reset()
			continue
		}
		cur.Write(line)
	}
	return append(docs, cur.Bytes())
}

// KustomizationResources reads the resources of dir's kustomization.yaml
// (relative to repoRoot) and returns them relative to repoRoot.
func KustomizationResources(repoRoot, dir string) ([]string, error) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, dir, "kustomization.yaml"))
	if err != nil {
		return nil, fmt.Errorf("read %s/kustomization.yaml: %w", dir, err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(raw, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	if len(k.Resources) == 0 {
		return nil, fmt.Errorf("%s/kustomization.yaml lists no resources", dir)
	}
	var out []string
	for _, r := range k.Resources {
		out = append(out, filepath.Join(dir, r))
	}
	return out, nil
}

// Applier creates objects of any kind through a dynamic client and a
// RESTMapper built from the API server's discovery.
type Applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

// NewApplier returns an Applier acting with cfg's identity.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("discovery client: %w", err)
	}
	groups, err := restmapper.GetAPIGroupResources(dc)
	if err != nil {
		return nil, fmt.Errorf("discover API resources: %w", err)
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDiscoveryRESTMapper(groups)}, nil
}

// Dynamic is the Applier's dynamic client.
func (a *Applier) Dynamic() dynamic.Interface { return a.dyn }

// Create creates obj unchanged (an object that already exists is left as
// it is) and returns what the API server stored.
func (a *Applier) Create(ctx context.Context, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s: namespaced, but its document names no namespace", gvk.Kind, obj.GetName())
		}
		ri = a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	out, err := ri.Create(ctx, obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("create %s %s: %w", gvk.Kind, describe(obj), err)
	}
	return out, nil
}

// ApplyFiles creates every document of files (relative to repoRoot), in
// order, and returns the objects created.
func (a *Applier) ApplyFiles(ctx context.Context, repoRoot string, files ...string) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, f := range files {
		objs, err := ReadDocuments(repoRoot, f)
		if err != nil {
			return nil, err
		}
		for _, o := range objs {
			created, err := a.Create(ctx, o)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			out = append(out, created)
		}
	}
	return out, nil
}

func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() != "" {
		return o.GetNamespace() + "/" + o.GetName()
	}
	return o.GetName()
}

// RBAC applies every document of RBACFiles unchanged: the tessera-system
// namespace, both ServiceAccounts, and the ClusterRoles, Roles and their
// bindings. cfg must be allowed to grant them (the admin).
func RBAC(ctx context.Context, cfg *rest.Config, repoRoot string) error {
	a, err := NewApplier(cfg)
	if err != nil {
		return err
	}
	files := RBACFiles()
	objs, err := a.ApplyFiles(ctx, repoRoot, files...)
	if err != nil {
		return err
	}
	klog.FromContext(ctx).V(2).Info("Installed Tessera's RBAC", "objects", len(objs), "files", files)
	return nil
}

// CRDs applies every CustomResourceDefinition of deploy/crds (the files
// its kustomization lists) and waits until each is established. It
// returns their names.
func CRDs(ctx context.Context, cfg *rest.Config, repoRoot string) ([]string, error) {
	a, err := NewApplier(cfg)
	if err != nil {
		return nil, err
	}
	files, err := KustomizationResources(repoRoot, "deploy/crds")
	if err != nil {
		return nil, err
	}
	objs, err := a.ApplyFiles(ctx, repoRoot, files...)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, o := range objs {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		names = append(names, o.GetName())
		if err := WaitEstablished(ctx, a.dyn, o.GetName()); err != nil {
			return nil, err
		}
	}
	return names, nil
}

// WaitEstablished waits until the CustomResourceDefinition name is
// Established (its resources can be served), or fails after 30 s.
func WaitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		u, err := crds.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
			if m["type"] == "NamesAccepted" && m["status"] == "False" {
				last = fmt.Sprint(m["message"])
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w (%s)", name, err, last)
	}
	return nil
}

// AdmissionPolicy applies the objects of deploy/admission (the files its
// kustomization lists: the ValidatingAdmissionPolicy that guards
// Tessera's pod annotations and its binding) and waits until the API
// server enforces the policy: a dry-run create, as cfg's user, of a pod
// carrying tessera.dev/assignment is refused. cfg must not be one of
// Tessera's identities (those are exempt); the admin is right.
func AdmissionPolicy(ctx context.Context, cfg *rest.Config, repoRoot string) error {
	a, err := NewApplier(cfg)
	if err != nil {
		return err
	}
	files, err := KustomizationResources(repoRoot, "deploy/admission")
	if err != nil {
		return err
	}
	objs, err := a.ApplyFiles(ctx, repoRoot, files...)
	if err != nil {
		return err
	}
	var policies int
	for _, o := range objs {
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			policies++
		}
	}
	if policies == 0 {
		return errors.New("deploy/admission holds no ValidatingAdmissionPolicy")
	}
	// The policy reaches the admission plugin through an informer: wait
	// until it refuses a forged pod.
	pods := a.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Namespace("default")
	probe := probePod("tessera-admission-probe", map[string]any{"tessera.dev/assignment": "probe"})
	var last error
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = pods.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last != nil && strings.Contains(last.Error(), "is written only by Tessera"), nil
	})
	if err != nil {
		return fmt.Errorf("the policy of deploy/admission is not enforced: %w (last dry-run create: %v)", err, last)
	}
	klog.FromContext(ctx).V(2).Info("Installed Tessera's admission policy", "objects", len(objs))
	return nil
}

// probePod is a minimal pod for dry-run creates.
func probePod(name string, annotations map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "default", "annotations": annotations},
		"spec":     map[string]any{"containers": []any{map[string]any{"name": "main", "image": "registry.k8s.io/pause:3.10"}}},
	}}
}
