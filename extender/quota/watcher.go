// Package quota is the extender's glue of ElasticQuota
// (scheduling.x-k8s.io/v1alpha1): it decodes the quotas in force
// (Watcher), builds quota states from the informers (Ledger, with an
// Index for the filter's hot path), explains admission (Verdict) and
// applies reclaim and quota-aware preemption by eviction (Enforcer). The
// decisions are allocator/quota's pure functions (imported as core); the
// GPU ledger is reached through the narrow Nodes interface, so that this
// package does not depend on the extender's node state.
package quota

import (
	"fmt"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

// Source gives the ElasticQuotas in force, by namespace.
type Source interface {
	// Quotas returns the quotas by namespace: empty when there are none
	// or the ElasticQuota CRD is not installed.
	Quotas() map[string]core.Quota
}

// NoQuotas is the Source of an extender that enforces no ElasticQuota
// (--quota=false).
type NoQuotas struct{}

var _ Source = NoQuotas{}

// Quotas returns none.
func (NoQuotas) Quotas() map[string]core.Quota { return nil }

// Store holds ElasticQuota objects (scheduling.x-k8s.io/v1alpha1): an
// extender.CRDWatcher of api.ElasticQuotaGVR, which watches them.
type Store interface {
	Objects() []*unstructured.Unstructured
}

// Watcher decodes the ElasticQuotas of a watched store.
type Watcher struct {
	Store Store

	mu        sync.Mutex
	malformed map[string]string // key -> last error logged
}

var _ Source = (*Watcher)(nil)

// Quotas decodes the ElasticQuotas of the store. A malformed
// object is logged (once per error) and admits nothing in its namespace
// (Decode); of several in one namespace, the first by name applies.
func (w *Watcher) Quotas() map[string]core.Quota {
	out, errs := Decode(w.Store.Objects())
	if len(errs) > 0 {
		w.mu.Lock()
		if w.malformed == nil {
			w.malformed = map[string]string{}
		}
		for key, err := range errs {
			if w.malformed[key] != err.Error() {
				w.malformed[key] = err.Error()
				klog.Background().Info("Ignoring an ElasticQuota", "quota", key, "err", err)
			}
		}
		w.mu.Unlock()
	}
	return out
}

// IgnoredError is Decode's error for an ElasticQuota that is not the first
// by name in its namespace: another applies, and nothing this one says is
// enforced.
type IgnoredError struct {
	// Key is the ignored object's namespace/name; Applies names the one
	// in force in its namespace.
	Key, Namespace, Applies string
	// Malformed is set when the ignored object is malformed as well.
	Malformed error
}

func (e *IgnoredError) Error() string {
	msg := fmt.Sprintf("ElasticQuota %s: namespace %s already has one, %s, which applies", e.Key, e.Namespace, e.Applies)
	if e.Malformed != nil {
		msg += fmt.Sprintf(" (this one is malformed too: %v)", e.Malformed)
	}
	return msg
}

func (e *IgnoredError) Unwrap() error { return e.Malformed }

// Decode decodes ElasticQuota objects into quotas by namespace, over the
// resources quota governs (api.QuotaResources). Of several in one
// namespace the first by name applies; the others are *IgnoredError
// errors by namespace/name. The one that applies, when malformed, is an
// error too and governs its namespace as an Invalid quota that admits
// nothing. It sorts objs in place, by namespace and name.
func Decode(objs []*unstructured.Unstructured) (map[string]core.Quota, map[string]error) {
	sort.Slice(objs, func(i, j int) bool {
		if objs[i].GetNamespace() != objs[j].GetNamespace() {
			return objs[i].GetNamespace() < objs[j].GetNamespace()
		}
		return objs[i].GetName() < objs[j].GetName()
	})
	out := map[string]core.Quota{}
	errs := map[string]error{}
	applied := map[string]string{} // namespace -> name of the quota in force
	for _, u := range objs {
		ns := u.GetNamespace()
		key := ns + "/" + u.GetName()
		eq, err := api.ElasticQuotaFromUnstructured(u)
		if first, dup := applied[ns]; dup {
			errs[key] = &IgnoredError{Key: key, Namespace: ns, Applies: first, Malformed: err}
			continue
		}
		applied[ns] = u.GetName()
		if err != nil {
			// Fail closed: the namespace is governed by a quota that
			// admits nothing until the object is fixed.
			errs[key] = err
			out[ns] = core.Quota{Namespace: ns, Min: core.Resources{}, Max: core.Resources{}, Invalid: err.Error()}
			continue
		}
		out[ns] = core.Quota{Namespace: ns, Min: governed(eq.Min), Max: governed(eq.Max)}
	}
	return out, errs
}

// governed is what of list quota governs (api.QuotaGoverned: MIG profiles
// included), in whole units.
func governed(list corev1.ResourceList) core.Resources {
	out := core.Resources{}
	for name, v := range list {
		if api.QuotaGoverned(name) {
			out[name] = v.Value()
		}
	}
	return out
}
