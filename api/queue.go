package api

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The Queue CRD (deploy/crds/queues.yaml): a cluster-scoped, hierarchical
// workload queue. A queue serves namespaces (a leaf) or other queues (a
// parent, through their spec.parent), and for each resource of
// QuotaResources holds a guarantee, an optional limit and a weight for what
// is lent beyond guarantees. The extender writes its status.
const (
	QueueKind     = "Queue"
	QueueListKind = "QueueList"
	// QueueCRDName is the CustomResourceDefinition's name.
	QueueCRDName = "queues." + Domain

	// DefaultQueueWeight is a resource's weight when spec.resources[r]
	// names none, or does not name r.
	DefaultQueueWeight = 1
	// MaxQueueWeight is the largest weight (0 is the smallest: a queue of
	// weight 0 gets nothing beyond its guarantee).
	MaxQueueWeight = 1000
	// MaxQueueNamespaces bounds spec.namespaces (the CRD's maxItems).
	MaxQueueNamespaces = 1024
)

// QueueGVR is the Queue CRD's resource (group Domain, version v1alpha1).
var QueueGVR = schema.GroupVersionResource{Group: Domain, Version: "v1alpha1", Resource: "queues"}

// Queue is the spec of a Queue object, in the integer units quota counts
// (whole GPUs, gpu-memory units, gpu-core units).
type Queue struct {
	Name string
	// Parent is another Queue's name; "" is a top-level queue.
	Parent string
	// Namespaces are the namespaces whose GPU workloads the queue serves,
	// sorted, without duplicates.
	Namespaces []string
	// Resources holds the resources the spec names; Resource gives the
	// defaults for the others.
	Resources map[corev1.ResourceName]QueueResource
}

// QueueResource is what a queue holds of one resource.
type QueueResource struct {
	// Guaranteed is never lent away from the queue's workloads (default 0).
	Guaranteed int64
	// Limit caps the queue's use, borrowing included, when Limited; it is
	// 0 when not Limited (no limit).
	Limit   int64
	Limited bool
	// Weight is the queue's share, against its siblings', of what is lent
	// beyond guarantees: 0 to MaxQueueWeight (default DefaultQueueWeight).
	Weight int64
}

// Resource returns what q holds of name: its spec entry, or for a resource
// the spec does not name no guarantee, no limit and the default weight.
func (q *Queue) Resource(name corev1.ResourceName) QueueResource {
	if r, ok := q.Resources[name]; ok {
		return r
	}
	return QueueResource{Weight: DefaultQueueWeight}
}

// queueFields are the fields of a Queue's spec and of one of its resources
// (anything else is an error: the API server prunes unknown fields, so one
// here means the CRD was changed to something this version does not know).
var (
	queueSpecFields     = []string{"parent", "namespaces", "resources"}
	queueResourceFields = []string{"guaranteed", "limit", "weight"}
)

// QueueFromUnstructured decodes a Queue read with a dynamic client. It
// checks what the CRD's validation checks (fail closed: the API server may
// be older than the CRD's rules, or the CRD edited): the name and parent
// are DNS-1123 subdomains and differ, namespaces are DNS-1123 labels named
// once, resources are QuotaGoverned, quantities are whole,
// non-negative units, guaranteed <= limit, weight in 0..MaxQueueWeight.
// Every error names the queue and the field. What it cannot check alone
// (the parent exists, no cycle, a namespace served by one queue) is the
// queue tree's (allocator/queue Build, which fails closed per queue).
func QueueFromUnstructured(u *unstructured.Unstructured) (*Queue, error) {
	name := u.GetName()
	fail := func(path string, format string, args ...any) (*Queue, error) {
		return nil, fmt.Errorf("Queue %s: %s: %s", name, path, fmt.Sprintf(format, args...))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fail("metadata.name", "%q is not a DNS-1123 subdomain: %s", name, strings.Join(errs, "; "))
	}
	q := &Queue{Name: name, Resources: map[corev1.ResourceName]QueueResource{}}
	rawSpec, found := u.Object["spec"]
	if !found || rawSpec == nil {
		return q, nil
	}
	spec, ok := rawSpec.(map[string]any)
	if !ok {
		return fail("spec", "%s is not an object", describe(rawSpec))
	}
	if f := unknownField(spec, queueSpecFields); f != "" {
		return fail("spec."+f, "unknown field (this version knows %s)", strings.Join(queueSpecFields, ", "))
	}
	if v, found := spec["parent"]; found && v != nil {
		s, ok := v.(string)
		if !ok {
			return fail("spec.parent", "%s is not a string", describe(v))
		}
		if s != "" {
			if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
				return fail("spec.parent", "%q is not a Queue name (a DNS-1123 subdomain): %s", s, strings.Join(errs, "; "))
			}
			if s == name {
				return fail("spec.parent", "a queue cannot be its own parent")
			}
		}
		q.Parent = s
	}
	if v, found := spec["namespaces"]; found && v != nil {
		list, ok := v.([]any)
		if !ok {
			return fail("spec.namespaces", "%s is not a list", describe(v))
		}
		if len(list) > MaxQueueNamespaces {
			return fail("spec.namespaces", "%d namespaces, at most %d", len(list), MaxQueueNamespaces)
		}
		seen := map[string]bool{}
		for i, item := range list {
			path := fmt.Sprintf("spec.namespaces[%d]", i)
			ns, ok := item.(string)
			if !ok {
				return fail(path, "%s is not a string", describe(item))
			}
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return fail(path, "%q is not a namespace name (a DNS-1123 label): %s", ns, strings.Join(errs, "; "))
			}
			if seen[ns] {
				return fail(path, "namespace %q is named twice", ns)
			}
			seen[ns] = true
			q.Namespaces = append(q.Namespaces, ns)
		}
		slices.Sort(q.Namespaces)
	}
	if v, found := spec["resources"]; found && v != nil {
		m, ok := v.(map[string]any)
		if !ok {
			return fail("spec.resources", "%s is not an object", describe(v))
		}
		for _, key := range sortedKeys(m) {
			path := fmt.Sprintf("spec.resources[%q]", key)
			rname := corev1.ResourceName(key)
			if !QuotaGoverned(rname) {
				return fail(path, "unknown resource (queues govern %s)", quotaResourceList())
			}
			entry, ok := m[key].(map[string]any)
			if !ok {
				if m[key] == nil {
					entry = map[string]any{}
				} else {
					return fail(path, "%s is not an object", describe(m[key]))
				}
			}
			if f := unknownField(entry, queueResourceFields); f != "" {
				return fail(path+"."+f, "unknown field (this version knows %s)", strings.Join(queueResourceFields, ", "))
			}
			r := QueueResource{Weight: DefaultQueueWeight}
			if v, found := entry["guaranteed"]; found && v != nil {
				n, err := wholeUnits(v)
				if err != nil {
					return fail(path+".guaranteed", "%v", err)
				}
				r.Guaranteed = n
			}
			if v, found := entry["limit"]; found && v != nil {
				n, err := wholeUnits(v)
				if err != nil {
					return fail(path+".limit", "%v", err)
				}
				r.Limit, r.Limited = n, true
			}
			if v, found := entry["weight"]; found && v != nil {
				w, ok := v.(int64)
				if !ok {
					return fail(path+".weight", "%s is not an integer", describe(v))
				}
				if w < 0 || w > MaxQueueWeight {
					return fail(path+".weight", "%d is not between 0 and %d", w, MaxQueueWeight)
				}
				r.Weight = w
			}
			if r.Limited && r.Guaranteed > r.Limit {
				return fail(path, "guaranteed (%d) must not exceed limit (%d)", r.Guaranteed, r.Limit)
			}
			q.Resources[rname] = r
		}
	}
	return q, nil
}

// Unstructured returns q as a Queue object (its spec; no status): what
// QueueFromUnstructured reads back as q.
func (q *Queue) Unstructured() *unstructured.Unstructured {
	spec := map[string]any{}
	if q.Parent != "" {
		spec["parent"] = q.Parent
	}
	if q.Namespaces != nil {
		list := make([]any, len(q.Namespaces))
		for i, ns := range q.Namespaces {
			list[i] = ns
		}
		spec["namespaces"] = list
	}
	if len(q.Resources) > 0 {
		res := map[string]any{}
		for name, r := range q.Resources {
			entry := map[string]any{"guaranteed": strconv.FormatInt(r.Guaranteed, 10), "weight": r.Weight}
			if r.Limited {
				entry["limit"] = strconv.FormatInt(r.Limit, 10)
			}
			res[string(name)] = entry
		}
		spec["resources"] = res
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": QueueGVR.GroupVersion().String(),
		"kind":       QueueKind,
		"metadata":   map[string]any{"name": q.Name},
		"spec":       spec,
	}}
}

// QueueStatus is what the extender writes in a Queue's status, per
// resource of QuotaResources, in quota's integer units.
type QueueStatus struct {
	// Used is what the queue's workloads (its own and its descendants')
	// hold now.
	Used map[corev1.ResourceName]int64
	// Guaranteed is the guarantee in force (after a parent's own limits).
	Guaranteed map[corev1.ResourceName]int64
	// FairShare is what the queue is entitled to now: its guarantee plus
	// its weighted share of what is lent.
	FairShare map[corev1.ResourceName]int64
	// Usage is the decayed usage history in resource-seconds, as of
	// UsageUpdated.
	Usage map[corev1.ResourceName]float64
	// UsageUpdated is in UTC.
	UsageUpdated time.Time
}

// The fields of a Queue's status that QueueStatus holds.
const (
	queueStatusUsed         = "used"
	queueStatusGuaranteed   = "guaranteed"
	queueStatusFairShare    = "fairShare"
	queueStatusUsage        = "usage"
	queueStatusUsageUpdated = "usageUpdated"
)

// QueueStatusFromUnstructured decodes a Queue's status (the zero
// QueueStatus, with empty maps, when it has none). Malformed fields are
// errors naming the queue and the field; the caller then starts the
// queue's history afresh. Fields it does not hold (conditions) are
// ignored.
func QueueStatusFromUnstructured(u *unstructured.Unstructured) (QueueStatus, error) {
	s := QueueStatus{
		Used:       map[corev1.ResourceName]int64{},
		Guaranteed: map[corev1.ResourceName]int64{},
		FairShare:  map[corev1.ResourceName]int64{},
		Usage:      map[corev1.ResourceName]float64{},
	}
	fail := func(path string, format string, args ...any) (QueueStatus, error) {
		return QueueStatus{}, fmt.Errorf("Queue %s: %s: %s", u.GetName(), path, fmt.Sprintf(format, args...))
	}
	raw, found := u.Object["status"]
	if !found || raw == nil {
		return s, nil
	}
	status, ok := raw.(map[string]any)
	if !ok {
		return fail("status", "%s is not an object", describe(raw))
	}
	for _, field := range []string{queueStatusUsed, queueStatusGuaranteed, queueStatusFairShare, queueStatusUsage} {
		v, found := status[field]
		if !found || v == nil {
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return fail("status."+field, "%s is not an object", describe(v))
		}
		for _, key := range sortedKeys(m) {
			path := fmt.Sprintf("status.%s[%q]", field, key)
			name := corev1.ResourceName(key)
			if !QuotaGoverned(name) {
				return fail(path, "unknown resource (queues govern %s)", quotaResourceList())
			}
			if field == queueStatusUsage {
				str, ok := m[key].(string)
				if !ok {
					return fail(path, "%s is not a string", describe(m[key]))
				}
				f, err := strconv.ParseFloat(str, 64)
				if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
					return fail(path, "%.64q is not a finite, non-negative number of resource-seconds", str)
				}
				s.Usage[name] = f
				continue
			}
			n, err := wholeUnits(m[key])
			if err != nil {
				return fail(path, "%v", err)
			}
			switch field {
			case queueStatusUsed:
				s.Used[name] = n
			case queueStatusGuaranteed:
				s.Guaranteed[name] = n
			case queueStatusFairShare:
				s.FairShare[name] = n
			}
		}
	}
	if v, found := status[queueStatusUsageUpdated]; found && v != nil {
		str, ok := v.(string)
		if !ok {
			return fail("status."+queueStatusUsageUpdated, "%s is not a string", describe(v))
		}
		t, err := time.Parse(time.RFC3339, str)
		if err == nil {
			// In UTC, as Object writes it: a time whose UTC year has
			// other than four digits would not read back.
			t = t.UTC()
			_, err = time.Parse(time.RFC3339, t.Format(time.RFC3339))
		}
		if err != nil {
			return fail("status."+queueStatusUsageUpdated, "%.64q is not an RFC 3339 time", str)
		}
		s.UsageUpdated = t
	}
	return s, nil
}

// Object returns the status to write (the status subresource, replaced
// whole: a merge patch would keep resources it no longer names).
// Quantities are decimal strings, usage strconv.FormatFloat's shortest
// 'g' form, UsageUpdated RFC 3339 in UTC to the second (omitted when
// zero). It holds no conditions: a caller that keeps them copies them in.
func (s QueueStatus) Object() map[string]any {
	ints := func(m map[corev1.ResourceName]int64) map[string]any {
		out := make(map[string]any, len(m))
		for name, n := range m {
			out[string(name)] = strconv.FormatInt(n, 10)
		}
		return out
	}
	usage := make(map[string]any, len(s.Usage))
	for name, f := range s.Usage {
		usage[string(name)] = strconv.FormatFloat(f, 'g', -1, 64)
	}
	out := map[string]any{
		queueStatusUsed:       ints(s.Used),
		queueStatusGuaranteed: ints(s.Guaranteed),
		queueStatusFairShare:  ints(s.FairShare),
		queueStatusUsage:      usage,
	}
	if !s.UsageUpdated.IsZero() {
		out[queueStatusUsageUpdated] = s.UsageUpdated.UTC().Format(time.RFC3339)
	}
	return out
}

// wholeUnits reads a quantity of a Queue (a string or an integer, as the
// CRD's int-or-string fields hold) as a non-negative whole number of units:
// "500m" or "1.5" is an error, as the CRD's isInteger rule says (which is
// resource.Quantity.AsInt64: "1.0" is refused too).
func wholeUnits(v any) (int64, error) {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case int64:
		s = strconv.FormatInt(v, 10)
	default:
		return 0, fmt.Errorf("%s is not a quantity", describe(v))
	}
	qty, err := ParseQuantity(s)
	if err != nil {
		return 0, err
	}
	if qty.Sign() < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	n, ok := qty.AsInt64()
	if !ok {
		return 0, fmt.Errorf("%q is not a whole number of units such as 4, 80 or 1e3", s)
	}
	return n, nil
}

// unknownField returns the first key of m (in order) not in known, or "".
func unknownField(m map[string]any, known []string) string {
	for _, k := range sortedKeys(m) {
		if !slices.Contains(known, k) {
			return k
		}
	}
	return ""
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// describe shows a value of the wrong type in an error, bounded.
func describe(v any) string {
	s := fmt.Sprintf("%v", v)
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%T %s", v, s)
}

func quotaResourceList() string {
	names := make([]string, 0, len(QuotaResources())+1)
	for _, r := range QuotaResources() {
		names = append(names, string(r))
	}
	return strings.Join(append(names, ResourceMIGPrefix+"<profile>"), ", ")
}

// SchedulingGateQueue holds a GPU pod of a namespace a Queue serves until
// Tessera admits it in queue order (priority tier, fair share, age). The
// extender's admission webhook adds it; a gang member gets
// SchedulingGateGang instead, which the same planner lifts.
const SchedulingGateQueue = Domain + "/queue"

// HasQueueGate reports whether the pod is held by SchedulingGateQueue.
func HasQueueGate(pod *corev1.Pod) bool {
	for _, gate := range pod.Spec.SchedulingGates {
		if gate.Name == SchedulingGateQueue {
			return true
		}
	}
	return false
}

// IsTesseraGate reports whether a scheduling gate is one Tessera lifts.
func IsTesseraGate(name string) bool {
	return name == SchedulingGateGang || name == SchedulingGateQueue
}

// EventQueueWaiting: on a queued workload's pods, why its Queue does not
// admit it yet (a limit, what other queues' guarantees need, ...).
const EventQueueWaiting = "QueueWaiting"

// EventQueueGateLifted: on a pod held by SchedulingGateQueue whose
// namespace no Queue serves (its Queue was deleted, or never named it),
// that the gang planner lifted the gate and the pod is scheduled as a
// plain pod (a Normal Event).
const EventQueueGateLifted = "QueueGateLifted"

// EventQueueAdmitted: on a queued pod outside any gang, that its Queue
// admitted it and where it is planned.
const EventQueueAdmitted = "QueueAdmitted"
