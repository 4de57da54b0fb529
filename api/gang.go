package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A pod joins a gang (a group scheduled all-or-nothing) in one of three ways:
//   - the scheduler-plugins way: the label LabelPodGroup names a PodGroup
//     object (scheduling.x-k8s.io/v1alpha1) in the pod's namespace, which
//     holds minMember and scheduleTimeoutSeconds;
//   - the Volcano way: the annotation AnnotationVolcanoGroupName (or
//     AnnotationVolcanoGroupNameV2) names a Volcano PodGroup object
//     (scheduling.volcano.sh/v1beta1) in the pod's namespace, which holds
//     minMember, minTaskMember, queue and priorityClassName (no timeout:
//     the default or the pod's AnnotationGangTimeout applies);
//   - without any CRD: the annotation AnnotationGang names the group and
//     AnnotationGangMinMember gives its minimum size (and optionally
//     AnnotationGangTimeout its timeout).
//
// All lead to one model, Gang.
const (
	// LabelPodGroup is the scheduler-plugins coscheduling label.
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// AnnotationVolcanoGroupName is the annotation by which Volcano (and
	// the controllers that generate pods for it) names a pod's Volcano
	// PodGroup.
	AnnotationVolcanoGroupName = "scheduling.k8s.io/group-name"
	// AnnotationVolcanoGroupNameV2 is the newer spelling Volcano reads as
	// well; a pod carrying both must name the same PodGroup.
	AnnotationVolcanoGroupNameV2 = "scheduling.volcano.sh/group-name"
	// VolcanoDefaultQueue is the queue of a Volcano PodGroup that names
	// none (Volcano's own default).
	VolcanoDefaultQueue = "default"
	// AnnotationGang names the pod's gang (tessera's own way).
	AnnotationGang = Domain + "/gang"
	// AnnotationGangMinMember is the gang's minimum size, an integer >= 1.
	AnnotationGangMinMember = Domain + "/gang-min-member"
	// AnnotationGangMaxMember caps an elastic gang: at most this many of
	// its members (an integer >= its minimum) run at once; the others
	// stay gated until a running member ends. Unset: every member may run.
	AnnotationGangMaxMember = Domain + "/gang-max-member"
	// AnnotationGangTimeout is how long, in seconds, a planned gang waits
	// for all members to bind before its plan is released; the gang
	// planner cuts it (and a PodGroup's) to the operator's
	// --gang-timeout-max (extender/planner.GangTimeout).
	AnnotationGangTimeout = Domain + "/gang-timeout-seconds"
	// AnnotationGangTopology lists topology levels (node label keys),
	// lowest first, each optionally suffixed ":required", e.g.
	// "nvidia.com/gpu.clique,topology.kubernetes.io/rack:required". It
	// overrides the extender's configured levels for the gang.
	AnnotationGangTopology = Domain + "/gang-topology"

	// EventGangTopologyUnmatched warns the members of a gang planned
	// without some of its AnnotationGangTopology levels: no node it may
	// use carries their label (a mistyped label key, say).
	EventGangTopologyUnmatched = "GangTopologyUnmatched"

	// SchedulingGateGang holds gang members until the whole gang is
	// planned. The extender's admission webhook adds it; users may too.
	// On a pod that declares no gang (GangOf), the gang planner lifts it
	// with an EventGangGateLifted, unless a queue holds the pod.
	SchedulingGateGang = Domain + "/gang"
	// EventGangGateLifted tells a pod that declares no gang that the gang
	// planner lifted its SchedulingGateGang (a Normal Event).
	EventGangGateLifted = "GangGateLifted"

	// DefaultGangTimeout applies when neither the PodGroup nor the
	// annotation gives one.
	DefaultGangTimeout = 10 * time.Minute
	// MaxGangTimeoutSeconds is the longest timeout a time.Duration holds
	// (about 292 years); a longer one is an error, not an overflow.
	MaxGangTimeoutSeconds = int64(math.MaxInt64 / time.Second)
)

// PodGroupGVR and ElasticQuotaGVR are the scheduler-plugins CRDs Tessera
// reads; VolcanoPodGroupGVR is Volcano's PodGroup.
var (
	PodGroupGVR        = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}
	ElasticQuotaGVR    = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
	VolcanoPodGroupGVR = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}
)

// GangSource says how a pod named its gang.
type GangSource string

// Gang sources.
const (
	GangFromPodGroup    GangSource = "PodGroup"
	GangFromVolcano     GangSource = "VolcanoPodGroup"
	GangFromAnnotations GangSource = "Annotations"
)

// PodGroupGVR is the resource of the PodGroup object a gang of source s is
// read from; ok is false for a source without one (annotations).
func (s GangSource) PodGroupGVR() (gvr schema.GroupVersionResource, ok bool) {
	switch s {
	case GangFromPodGroup:
		return PodGroupGVR, true
	case GangFromVolcano:
		return VolcanoPodGroupGVR, true
	}
	return schema.GroupVersionResource{}, false
}

// FromPodGroup reports whether a gang of source s is completed from a
// PodGroup object (ApplyPodGroup).
func (s GangSource) FromPodGroup() bool {
	_, ok := s.PodGroupGVR()
	return ok
}

// TopologyLevel is one level of AnnotationGangTopology.
type TopologyLevel struct {
	Key      string
	Required bool
}

// Gang is the internal model of a pod group, whichever way it was declared.
type Gang struct {
	Namespace string
	Name      string
	Source    GangSource
	// MinMember is 0 for a PodGroup-declared gang until the PodGroup
	// object has been read (ApplyPodGroup).
	MinMember int
	// MaxMember is how many members may run at once (AnnotationGangMaxMember);
	// 0: no cap.
	MaxMember int
	Timeout   time.Duration
	// Levels come from AnnotationGangTopology; nil means the extender's
	// configured levels.
	Levels []TopologyLevel
	// MinTaskMember, Queue and PriorityClassName come from a Volcano
	// PodGroup (spec.minTaskMember, spec.queue, VolcanoDefaultQueue when
	// unset, spec.priorityClassName); empty for other sources.
	// MinTaskMember is the minimum number of pods per Volcano task (the
	// pods' volcano.sh/task-spec annotation); ApplyPodGroup raises
	// MinMember to their sum, but nothing yet checks each task's count.
	MinTaskMember     map[string]int
	Queue             string
	PriorityClassName string
}

// Key is "namespace/name".
func (g *Gang) Key() string { return g.Namespace + "/" + g.Name }

// ErrInvalidGang marks a malformed gang declaration.
var ErrInvalidGang = errors.New("invalid gang declaration")

// gangOnlyAnnotations are the annotations that mean something only on a
// member of a gang: on a pod that declares none, GangOf refuses them (the
// pod would run alone, as its author did not mean).
var gangOnlyAnnotations = []string{AnnotationGangMinMember, AnnotationGangMaxMember, AnnotationGangTimeout, AnnotationGangTopology}

// MaxGangMembers bounds AnnotationGangMinMember and AnnotationGangMaxMember,
// as a PodGroup's spec.minMember (an int32) is bounded.
const MaxGangMembers = math.MaxInt32

// parseMembers parses a value of AnnotationGangMinMember or
// AnnotationGangMaxMember: 1..MaxGangMembers, written plainly
// (ParseDecimal).
func parseMembers(v string) (int, error) {
	n, err := ParseDecimal(v, 1, MaxGangMembers)
	return int(n), err
}

// GangOf returns the gang a pod belongs to; ok is false for a pod in none.
// A malformed declaration is an ErrInvalidGang with ok true (and no gang):
// the pod is held as a gang's, never taken as a plain pod. It is malformed
// when:
//   - it names its gang more than one way and not the same gang each time,
//     or names both a scheduler-plugins and a Volcano PodGroup (which object
//     would hold its size is then ambiguous);
//   - the gang's name is not a DNS-1123 subdomain (the name of a PodGroup
//     object; the gang's name is part of the keys Tessera files it under);
//   - a size, cap or timeout is not a plain decimal in its range
//     (ParseDecimal: " 2", "+2" and "02" are refused);
//   - it carries a gang-only annotation (AnnotationGangMinMember,
//     AnnotationGangMaxMember, AnnotationGangTimeout,
//     AnnotationGangTopology) but declares no gang.
func GangOf(pod *corev1.Pod) (g *Gang, ok bool, err error) {
	type decl struct{ key, name string }
	var decls []decl
	if v, set := pod.Labels[LabelPodGroup]; set {
		decls = append(decls, decl{"label " + LabelPodGroup, v})
	}
	for _, k := range []string{AnnotationVolcanoGroupName, AnnotationVolcanoGroupNameV2} {
		if v, set := pod.Annotations[k]; set {
			decls = append(decls, decl{"annotation " + k, v})
		}
	}
	if v, set := pod.Annotations[AnnotationGang]; set {
		decls = append(decls, decl{"annotation " + AnnotationGang, v})
	}
	fail := func(format string, a ...any) (*Gang, bool, error) {
		return nil, true, fmt.Errorf("pod %s/%s: %w: %s", pod.Namespace, pod.Name, ErrInvalidGang, fmt.Sprintf(format, a...))
	}
	if len(decls) == 0 {
		for _, k := range gangOnlyAnnotations {
			if _, set := pod.Annotations[k]; set {
				return fail("annotation %s needs a gang: annotation %s (or a PodGroup: label %s, or annotation %s)",
					k, AnnotationGang, LabelPodGroup, AnnotationVolcanoGroupName)
			}
		}
		return nil, false, nil
	}
	for _, d := range decls[1:] {
		if d.name != decls[0].name {
			return fail("%s=%q and %s=%q name different gangs", decls[0].key, decls[0].name, d.key, d.name)
		}
	}
	_, hasLabel := pod.Labels[LabelPodGroup]
	_, hasVolcano := pod.Annotations[AnnotationVolcanoGroupName]
	_, hasVolcanoV2 := pod.Annotations[AnnotationVolcanoGroupNameV2]
	if hasLabel && (hasVolcano || hasVolcanoV2) {
		return fail("%s names a scheduler-plugins PodGroup and %s a Volcano PodGroup: use one", decls[0].key, decls[1].key)
	}
	g = &Gang{Namespace: pod.Namespace, Name: decls[0].name, Timeout: DefaultGangTimeout}
	switch {
	case hasLabel:
		g.Source = GangFromPodGroup
	case hasVolcano || hasVolcanoV2:
		g.Source = GangFromVolcano
	default:
		g.Source = GangFromAnnotations
	}
	if strings.TrimSpace(g.Name) == "" {
		return fail("the gang name (%s) is empty", decls[0].key)
	}
	if errs := validation.IsDNS1123Subdomain(g.Name); len(errs) > 0 {
		return fail("the gang name %q (%s) is not a valid name: %s", g.Name, decls[0].key, strings.Join(errs, "; "))
	}
	if v, set := pod.Annotations[AnnotationGangMinMember]; set {
		n, err := parseMembers(v)
		if err != nil {
			return fail("%s=%q is not a number of members: %v", AnnotationGangMinMember, v, err)
		}
		g.MinMember = n
	} else if g.Source == GangFromAnnotations {
		return fail("%s is required with %s", AnnotationGangMinMember, AnnotationGang)
	}
	if v, set := pod.Annotations[AnnotationGangMaxMember]; set {
		n, err := parseMembers(v)
		if err != nil {
			return fail("%s=%q is not a number of members: %v", AnnotationGangMaxMember, v, err)
		}
		g.MaxMember = n
		if err := g.CheckSize(); err != nil {
			return fail("%v", err)
		}
	}
	if v, set := pod.Annotations[AnnotationGangTimeout]; set {
		s, err := ParseDecimal(v, 1, MaxGangTimeoutSeconds)
		if err != nil {
			return fail("%s=%q is not a number of seconds: %v", AnnotationGangTimeout, v, err)
		}
		g.Timeout = time.Duration(s) * time.Second
	}
	if v, set := pod.Annotations[AnnotationGangTopology]; set {
		levels, err := ParseTopologyLevels(v)
		if err != nil {
			return fail("%s: %v", AnnotationGangTopology, err)
		}
		g.Levels = levels
	}
	return g, true, nil
}

// Room is how many more members may start while running of them run (or
// hold a plan): the cap's remainder, never below 0; -1 without a cap.
// Members beyond it wait for a running member to end.
func (g *Gang) Room(running int) int {
	if g.MaxMember == 0 {
		return -1
	}
	return max(g.MaxMember-running, 0)
}

// Extras are the members of running (the gang's members that run or hold
// a plan) beyond its MinMember, newest first by started: the members an
// elastic gang gives back first under pressure, before any whole workload
// goes, and the only ones it can give back without ending. None when the
// minimum is not known (0) or not exceeded. Start times have a resolution
// of one second, so members that started together are told apart by
// creation (the later first), then by name (the greater first: train-3
// before train-2), whatever order they are listed in.
func (g *Gang) Extras(running []*corev1.Pod, started func(*corev1.Pod) time.Time) []*corev1.Pod {
	if g.MinMember < 1 || len(running) <= g.MinMember {
		return nil
	}
	byAge := append([]*corev1.Pod(nil), running...)
	sort.Slice(byAge, func(i, j int) bool { return newer(byAge[i], byAge[j], started) })
	return byAge[:len(running)-g.MinMember]
}

// newer orders Extras: a before b when a started later, then was created
// later, then has the greater name.
func newer(a, b *corev1.Pod, started func(*corev1.Pod) time.Time) bool {
	if sa, sb := started(a), started(b); !sa.Equal(sb) {
		return sa.After(sb)
	}
	if ca, cb := a.CreationTimestamp.Time, b.CreationTimestamp.Time; !ca.Equal(cb) {
		return ca.After(cb)
	}
	return a.Name > b.Name
}

// CheckSize reports a cap below the minimum: a gang whose MaxMember is set
// below its MinMember could never start.
func (g *Gang) CheckSize() error {
	if g.MaxMember > 0 && g.MaxMember < g.MinMember {
		return fmt.Errorf("%s=%d is below the gang's minimum of %d members", AnnotationGangMaxMember, g.MaxMember, g.MinMember)
	}
	return nil
}

// ParseTopologyLevels parses "key[:required],key[:preferred],...".
func ParseTopologyLevels(v string) ([]TopologyLevel, error) {
	var levels []TopologyLevel
	seen := map[string]bool{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			return nil, fmt.Errorf("%q has an empty level", v)
		}
		key, mode, hasMode := strings.Cut(part, ":")
		key, mode = strings.TrimSpace(key), strings.TrimSpace(mode)
		l := TopologyLevel{Key: key}
		switch {
		case !hasMode, mode == "preferred":
		case mode == "required":
			l.Required = true
		default:
			return nil, fmt.Errorf("level %q: mode %q is neither required nor preferred", key, mode)
		}
		if key == "" || seen[key] {
			return nil, fmt.Errorf("level %q is empty or repeated", key)
		}
		// A level is a node label key: any other never matches a node.
		if errs := validation.IsQualifiedName(key); len(errs) > 0 {
			return nil, fmt.Errorf("level %q is not a node label key: %s", key, strings.Join(errs, "; "))
		}
		seen[key] = true
		levels = append(levels, l)
	}
	return levels, nil
}

// ApplyPodGroup completes a PodGroup-declared gang from its PodGroup object,
// of the kind the gang's Source names:
//   - scheduler-plugins (GangFromPodGroup): spec.minMember and
//     spec.scheduleTimeoutSeconds;
//   - Volcano (GangFromVolcano): spec.minMember, raised to the sum of
//     spec.minTaskMember when that is larger (Volcano needs every task's
//     minimum), spec.queue and spec.priorityClassName. Volcano has no
//     timeout: the default or the pod's annotation applies, and
//     spec.minResources is not read (Tessera plans the members' own
//     requests).
//
// Pod annotations that set the same fields win, so a pod may override the
// object. A malformed object is an ErrInvalidGang naming the field.
func (g *Gang) ApplyPodGroup(pg *unstructured.Unstructured, pod *corev1.Pod) error {
	kind := "PodGroup"
	if g.Source == GangFromVolcano {
		kind = "Volcano PodGroup"
	}
	if pg.GetNamespace() != g.Namespace || pg.GetName() != g.Name {
		return fmt.Errorf("%s %s/%s is not gang %s", kind, pg.GetNamespace(), pg.GetName(), g.Key())
	}
	gvr, ok := g.Source.PodGroupGVR()
	if !ok {
		return fmt.Errorf("gang %s is declared by %s, not by a PodGroup", g.Key(), g.Source)
	}
	// An object of the other PodGroup kind (same resource name, other
	// group) never completes the gang.
	if av := pg.GetAPIVersion(); av != "" {
		if gv, err := schema.ParseGroupVersion(av); err != nil || gv.Group != gvr.Group {
			return fmt.Errorf("%s %s: apiVersion %q is not of group %s", kind, g.Key(), av, gvr.Group)
		}
	}
	invalid := func(field, want string) error {
		v, found, _ := unstructured.NestedFieldNoCopy(pg.Object, "spec", field)
		got := "it is missing"
		if found {
			got = fmt.Sprintf("got %s", describeValue(v))
		}
		return fmt.Errorf("%s %s: %w: spec.%s must be %s; %s", kind, g.Key(), ErrInvalidGang, field, want, got)
	}
	min, found, err := unstructured.NestedInt64(pg.Object, "spec", "minMember")
	if err != nil || !found || min < 1 || min > math.MaxInt32 {
		return invalid("minMember", fmt.Sprintf("an integer from 1 to %d", math.MaxInt32))
	}
	if g.Source == GangFromVolcano {
		return g.applyVolcano(pg, pod, int(min), invalid)
	}
	if _, set := pod.Annotations[AnnotationGangMinMember]; !set {
		g.MinMember = int(min)
	}
	secs, found, err := unstructured.NestedInt64(pg.Object, "spec", "scheduleTimeoutSeconds")
	if err != nil || (found && (secs < 1 || secs > MaxGangTimeoutSeconds)) {
		return invalid("scheduleTimeoutSeconds", fmt.Sprintf("a number from 1 to %d", MaxGangTimeoutSeconds))
	}
	if _, set := pod.Annotations[AnnotationGangTimeout]; found && !set {
		g.Timeout = time.Duration(secs) * time.Second
	}
	return nil
}

// applyVolcano reads the fields of a Volcano PodGroup past minMember. The
// gang is changed only once every field is valid.
func (g *Gang) applyVolcano(pg *unstructured.Unstructured, pod *corev1.Pod, min int, invalid func(field, want string) error) error {
	var tasks map[string]int
	sum := 0
	if raw, found, _ := unstructured.NestedFieldNoCopy(pg.Object, "spec", "minTaskMember"); found && raw != nil {
		m, ok := raw.(map[string]any)
		if !ok {
			return invalid("minTaskMember", "a map of task names to integers")
		}
		tasks = make(map[string]int, len(m))
		for task, v := range m {
			n, ok := v.(int64)
			if !ok || task == "" || n < 0 || n > math.MaxInt32 {
				return invalid("minTaskMember", fmt.Sprintf("a map of task names to integers from 0 to %d (task %q)", math.MaxInt32, task))
			}
			tasks[task] = int(n)
			if sum += int(n); sum > math.MaxInt32 {
				return invalid("minTaskMember", fmt.Sprintf("a map whose integers add up to at most %d", math.MaxInt32))
			}
		}
	}
	queue, _, err := unstructured.NestedString(pg.Object, "spec", "queue")
	if err != nil {
		return invalid("queue", "a string")
	}
	pc, _, err := unstructured.NestedString(pg.Object, "spec", "priorityClassName")
	if err != nil {
		return invalid("priorityClassName", "a string")
	}
	if queue == "" {
		queue = VolcanoDefaultQueue
	}
	if _, set := pod.Annotations[AnnotationGangMinMember]; !set {
		g.MinMember = max(min, sum)
	}
	g.MinTaskMember, g.Queue, g.PriorityClassName = tasks, queue, pc
	return nil
}

// describeValue shows a field's value in an error: its JSON, cut short.
func describeValue(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprintf("%T", v)
	}
	const limit = 64
	if len(b) > limit {
		return string(b[:limit]) + "..."
	}
	return string(b)
}

// HasGangGate reports whether the pod is held by SchedulingGateGang.
func HasGangGate(pod *corev1.Pod) bool {
	for _, gate := range pod.Spec.SchedulingGates {
		if gate.Name == SchedulingGateGang {
			return true
		}
	}
	return false
}

// AnnotationGangPlan records where the gang planner placed a member: the
// node, and for a shared member the GPU. The extender counts a planned pod
// on its node from this annotation (so a plan survives restarts, rebuilt from
// the API server), filter passes only that node, and bind checks it.
const AnnotationGangPlan = Domain + "/gang-plan"

// KindGangPlan is the kind of a GangPlan.
const KindGangPlan = "GangPlan"

// maxPlannedGPUs bounds GangPlan.GPUs: more GPUs than any node has.
const maxPlannedGPUs = 64

// GangPlan is the value of AnnotationGangPlan.
type GangPlan struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Gang is the gang's name; Node the member's planned node.
	Gang string `json:"gang"`
	Node string `json:"node"`
	// GPU is the planned GPU of a shared member (nil for whole GPUs, which
	// the node's device plugin picks), the lowest-indexed one of a
	// multi-GPU slice (AnnotationGPUCount).
	GPU *GPURef `json:"gpu,omitempty"`
	// Spread are the other GPUs of a multi-GPU slice's plan, in increasing
	// index order after GPU, as in its assignment (SharedGPU.Spread): the
	// plan holds the slice's share of each, and the bind puts it on
	// exactly these GPUs. A slice's plan that names fewer GPUs than the
	// slice spans (written before 2026-12, when plans named one GPU for
	// any slice) holds its GPUs by count, as one naming none does, and its
	// bind places it.
	Spread []GPURef `json:"spread,omitempty"`
	// GPUs are the GPUs the plan of a whole-GPU pod (a gang member, or a
	// pod preemption or quota reclaim made room for) holds until it binds:
	// nothing else is placed on them meanwhile, though pods that are
	// leaving (evicted for it) may still run there. The node's device
	// plugin still picks the pod's GPUs when it binds. Absent, the plan
	// holds as many GPUs of the node by count, and while such plans want
	// more GPUs than the node has free, the node takes no new slice (the
	// extender's kept-for-whole-gpus rule).
	GPUs []GPURef `json:"gpus,omitempty"`
	// Expires is when the plan is released if the gang has not bound
	// (RFC 3339).
	Expires time.Time `json:"expires"`
	// Awaits are the UIDs of the pods evicted (or already leaving) to
	// make room for the plan that were still there when it was made: the
	// planner keeps the members' scheduling gates until they are gone, so
	// that kube-scheduler does not find their GPUs still taken, but not
	// past AwaitUntil (RFC 3339, set with Awaits). Kept on the plan, the
	// wait outlives an extender restart.
	Awaits     []types.UID `json:"awaits,omitempty"`
	AwaitUntil *time.Time  `json:"awaitUntil,omitempty"`
}

// MaxAwaited bounds GangPlan.Awaits: a gang of 128 members of 8 GPUs
// evicting a one-GPU notebook per GPU, written on each member's plan in
// about 40 KB (annotations of one object share 256 KiB). A planner with more
// victims still there awaits the first MaxAwaited by UID.
const MaxAwaited = 1024

// GPUsText names the plan's GPUs by index for messages: "GPU 3" (a
// slice's), "GPUs 5, 6" (whole GPUs held), or "" when it names none.
func (p *GangPlan) GPUsText() string {
	gpus := p.GPUs
	if p.GPU != nil {
		gpus = p.SliceGPUs()
	}
	switch {
	case len(gpus) == 1:
		return fmt.Sprintf("GPU %d", gpus[0].Index)
	case len(gpus) > 1:
		idx := make([]string, len(gpus))
		for i, g := range gpus {
			idx[i] = strconv.Itoa(g.Index)
		}
		return "GPUs " + strings.Join(idx, ", ")
	}
	return ""
}

// SliceGPUs are the GPUs the plan of a shared member names, in index
// order: GPU, then Spread; nil when it names none.
func (p *GangPlan) SliceGPUs() []GPURef {
	if p.GPU == nil {
		return nil
	}
	return append([]GPURef{*p.GPU}, p.Spread...)
}

// Where says where the plan holds room, for messages: "GPUs 5, 7 of node
// n1", "GPU 3 of node n1", or "node n1" when it names no GPU.
func (p *GangPlan) Where() string {
	if g := p.GPUsText(); g != "" {
		return g + " of node " + p.Node
	}
	return "node " + p.Node
}

// GetGangPlan reads AnnotationGangPlan; ok is false when it is absent. It
// does not check the seal: components that act on a plan read it through
// Sealer.GangPlan.
func GetGangPlan(annotations map[string]string) (p *GangPlan, ok bool, err error) {
	v, ok := annotations[AnnotationGangPlan]
	if !ok {
		return nil, false, nil
	}
	p, err = ParseGangPlan(v)
	return p, true, err
}

// ParseGangPlan decodes and validates an AnnotationGangPlan value.
func ParseGangPlan(v string) (*GangPlan, error) {
	p := &GangPlan{}
	if err := decodeStrict(v, p); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationGangPlan, err)
	}
	switch {
	case p.APIVersion != Version || p.Kind != KindGangPlan:
		return nil, fmt.Errorf("annotation %s: want apiVersion %s kind %s, got %q %q", AnnotationGangPlan, Version, KindGangPlan, p.APIVersion, p.Kind)
	case p.Gang == "" || p.Node == "":
		return nil, fmt.Errorf("annotation %s: gang and node must be set", AnnotationGangPlan)
	case p.Expires.IsZero():
		return nil, fmt.Errorf("annotation %s: expires must be set", AnnotationGangPlan)
	}
	if p.GPU != nil {
		if err := p.GPU.validate(); err != nil {
			return nil, fmt.Errorf("annotation %s: gpu: %w", AnnotationGangPlan, err)
		}
		if len(p.GPUs) > 0 {
			return nil, fmt.Errorf("annotation %s: gpu (a slice's GPU) and gpus (whole GPUs) are both set", AnnotationGangPlan)
		}
	}
	if err := p.checkSpread(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationGangPlan, err)
	}
	if len(p.GPUs) == 0 {
		p.GPUs = nil // "gpus": [] is no list
	}
	if len(p.GPUs) > maxPlannedGPUs {
		return nil, fmt.Errorf("annotation %s: gpus: %d GPUs, at most %d", AnnotationGangPlan, len(p.GPUs), maxPlannedGPUs)
	}
	seen := make(map[string]bool, len(p.GPUs))
	for i, g := range p.GPUs {
		if err := g.validate(); err != nil {
			return nil, fmt.Errorf("annotation %s: gpus[%d]: %w", AnnotationGangPlan, i, err)
		}
		if seen[g.UUID] {
			return nil, fmt.Errorf("annotation %s: gpus[%d].uuid: %q is listed twice", AnnotationGangPlan, i, g.UUID)
		}
		seen[g.UUID] = true
	}
	if err := p.checkAwaits(); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationGangPlan, err)
	}
	return p, nil
}

// checkSpread validates Spread: only beside GPU, at most MaxGPUCount GPUs
// in all, each once, in increasing index order after GPU.
func (p *GangPlan) checkSpread() error {
	if len(p.Spread) == 0 {
		p.Spread = nil // "spread": [] is no list
		return nil
	}
	if p.GPU == nil {
		return errors.New("spread is set without gpu (a slice's first GPU)")
	}
	if len(p.Spread)+1 > MaxGPUCount {
		return fmt.Errorf("spread: a slice spans at most %d GPUs, got %d", MaxGPUCount, len(p.Spread)+1)
	}
	prev := *p.GPU
	seen := map[string]bool{prev.UUID: true}
	for i, g := range p.Spread {
		if err := g.validate(); err != nil {
			return fmt.Errorf("spread[%d]: %w", i, err)
		}
		if seen[g.UUID] {
			return fmt.Errorf("spread[%d].uuid: %q is listed twice", i, g.UUID)
		}
		if g.Index <= prev.Index {
			return fmt.Errorf("spread[%d].index: the slice's GPUs must be in increasing index order, %d after %d", i, g.Index, prev.Index)
		}
		seen[g.UUID], prev = true, g
	}
	return nil
}

// checkAwaits validates Awaits and AwaitUntil.
func (p *GangPlan) checkAwaits() error {
	if len(p.Awaits) == 0 {
		p.Awaits = nil
		if p.AwaitUntil != nil {
			return errors.New("awaitUntil is set without awaits")
		}
		return nil
	}
	if p.AwaitUntil == nil || p.AwaitUntil.IsZero() {
		return errors.New("awaits is set without awaitUntil")
	}
	if len(p.Awaits) > MaxAwaited {
		return fmt.Errorf("awaits: %d pods, at most %d", len(p.Awaits), MaxAwaited)
	}
	seen := make(map[types.UID]bool, len(p.Awaits))
	for i, uid := range p.Awaits {
		switch {
		case uid == "":
			return fmt.Errorf("awaits[%d] is empty", i)
		case seen[uid]:
			return fmt.Errorf("awaits[%d]: %q is listed twice", i, uid)
		}
		seen[uid] = true
	}
	return nil
}

// Awaiting reports whether the plan still waits, at now, for one of the
// pods it awaits: gone reports whether a pod is gone (or has stopped).
func (p *GangPlan) Awaiting(now time.Time, gone func(types.UID) bool) bool {
	if p.AwaitUntil == nil || !now.Before(*p.AwaitUntil) {
		return false
	}
	for _, uid := range p.Awaits {
		if !gone(uid) {
			return true
		}
	}
	return false
}

// SetGangPlan writes p (apiVersion and kind filled in) to annotations.
func SetGangPlan(annotations map[string]string, p GangPlan) error {
	p.APIVersion, p.Kind = Version, KindGangPlan
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encoding %s: %w", AnnotationGangPlan, err)
	}
	annotations[AnnotationGangPlan] = string(b)
	return nil
}
