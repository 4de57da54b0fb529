package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// A pod joins a gang (a group scheduled all-or-nothing) in one of two ways:
//   - the scheduler-plugins way: the label LabelPodGroup names a PodGroup
//     object (scheduling.x-k8s.io/v1alpha1) in the pod's namespace, which
//     holds minMember and scheduleTimeoutSeconds;
//   - without any CRD: the annotation AnnotationGang names the group and
//     AnnotationGangMinMember gives its minimum size (and optionally
//     AnnotationGangTimeout its timeout).
//
// Both lead to one model, Gang.
const (
	// LabelPodGroup is the scheduler-plugins coscheduling label.
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// AnnotationGang names the pod's gang (tessera's own way).
	AnnotationGang = Domain + "/gang"
	// AnnotationGangMinMember is the gang's minimum size, an integer >= 1.
	AnnotationGangMinMember = Domain + "/gang-min-member"
	// AnnotationGangTimeout is how long, in seconds, a planned gang waits
	// for all members to bind before its plan is released.
	AnnotationGangTimeout = Domain + "/gang-timeout-seconds"
	// AnnotationGangTopology lists topology levels (node label keys),
	// lowest first, each optionally suffixed ":required", e.g.
	// "nvidia.com/gpu.clique,topology.kubernetes.io/rack:required". It
	// overrides the extender's configured levels for the gang.
	AnnotationGangTopology = Domain + "/gang-topology"

	// SchedulingGateGang holds gang members until the whole gang is
	// planned. The extender's admission webhook adds it; users may too.
	SchedulingGateGang = Domain + "/gang"

	// DefaultGangTimeout applies when neither the PodGroup nor the
	// annotation gives one.
	DefaultGangTimeout = 10 * time.Minute
	// MaxGangTimeoutSeconds is the longest timeout a time.Duration holds
	// (about 292 years); a longer one is an error, not an overflow.
	MaxGangTimeoutSeconds = int64(math.MaxInt64 / time.Second)
)

// PodGroupGVR and ElasticQuotaGVR are the scheduler-plugins CRDs Tessera
// reads.
var (
	PodGroupGVR     = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "podgroups"}
	ElasticQuotaGVR = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}
)

// GangSource says how a pod named its gang.
type GangSource string

// Gang sources.
const (
	GangFromPodGroup    GangSource = "PodGroup"
	GangFromAnnotations GangSource = "Annotations"
)

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
	Timeout   time.Duration
	// Levels come from AnnotationGangTopology; nil means the extender's
	// configured levels.
	Levels []TopologyLevel
}

// Key is "namespace/name".
func (g *Gang) Key() string { return g.Namespace + "/" + g.Name }

// ErrInvalidGang marks a malformed gang declaration.
var ErrInvalidGang = errors.New("invalid gang declaration")

// GangOf returns the gang a pod belongs to; ok is false for a pod in none.
// A pod that declares its gang both ways must agree on the name.
func GangOf(pod *corev1.Pod) (g *Gang, ok bool, err error) {
	label, hasLabel := pod.Labels[LabelPodGroup]
	name, hasAnn := pod.Annotations[AnnotationGang]
	if !hasLabel && !hasAnn {
		return nil, false, nil
	}
	fail := func(format string, a ...any) (*Gang, bool, error) {
		return nil, true, fmt.Errorf("pod %s/%s: %w: %s", pod.Namespace, pod.Name, ErrInvalidGang, fmt.Sprintf(format, a...))
	}
	if hasLabel && hasAnn && label != name {
		return fail("label %s=%q and annotation %s=%q name different gangs", LabelPodGroup, label, AnnotationGang, name)
	}
	g = &Gang{Namespace: pod.Namespace, Timeout: DefaultGangTimeout}
	if hasLabel {
		g.Name, g.Source = label, GangFromPodGroup
	} else {
		g.Name, g.Source = name, GangFromAnnotations
	}
	if strings.TrimSpace(g.Name) == "" {
		return fail("the gang name is empty")
	}
	if v, set := pod.Annotations[AnnotationGangMinMember]; set {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 {
			return fail("%s=%q: want an integer of at least 1", AnnotationGangMinMember, v)
		}
		g.MinMember = n
	} else if g.Source == GangFromAnnotations {
		return fail("%s is required with %s", AnnotationGangMinMember, AnnotationGang)
	}
	if v, set := pod.Annotations[AnnotationGangTimeout]; set {
		s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || s < 1 || s > MaxGangTimeoutSeconds {
			return fail("%s=%q: want a number of seconds from 1 to %d", AnnotationGangTimeout, v, MaxGangTimeoutSeconds)
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

// ApplyPodGroup completes a PodGroup-declared gang from its PodGroup object
// (spec.minMember, spec.scheduleTimeoutSeconds). Pod annotations that set
// the same fields win, so a pod may override the object.
func (g *Gang) ApplyPodGroup(pg *unstructured.Unstructured, pod *corev1.Pod) error {
	if pg.GetNamespace() != g.Namespace || pg.GetName() != g.Name {
		return fmt.Errorf("PodGroup %s/%s is not gang %s", pg.GetNamespace(), pg.GetName(), g.Key())
	}
	min, found, err := unstructured.NestedInt64(pg.Object, "spec", "minMember")
	if err != nil || !found || min < 1 {
		return fmt.Errorf("PodGroup %s: %w: spec.minMember must be an integer of at least 1", g.Key(), ErrInvalidGang)
	}
	if _, set := pod.Annotations[AnnotationGangMinMember]; !set {
		g.MinMember = int(min)
	}
	secs, found, err := unstructured.NestedInt64(pg.Object, "spec", "scheduleTimeoutSeconds")
	if err != nil || (found && (secs < 1 || secs > MaxGangTimeoutSeconds)) {
		return fmt.Errorf("PodGroup %s: %w: spec.scheduleTimeoutSeconds must be a number from 1 to %d", g.Key(), ErrInvalidGang, MaxGangTimeoutSeconds)
	}
	if _, set := pod.Annotations[AnnotationGangTimeout]; found && !set {
		g.Timeout = time.Duration(secs) * time.Second
	}
	return nil
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

// GangPlan is the value of AnnotationGangPlan.
type GangPlan struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Gang is the gang's name; Node the member's planned node.
	Gang string `json:"gang"`
	Node string `json:"node"`
	// GPU is the planned GPU of a shared member (nil for whole GPUs, which
	// the node's device plugin picks).
	GPU *GPURef `json:"gpu,omitempty"`
	// Expires is when the plan is released if the gang has not bound
	// (RFC 3339).
	Expires time.Time `json:"expires"`
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
	}
	return p, nil
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
