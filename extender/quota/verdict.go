package quota

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Workloads groups pods into units of eviction: each gang whole (by
// api.GangOf), each other pod alone. A gang's priority is its members'
// highest, its creation its oldest member's.
func Workloads(pods []*corev1.Pod) []core.Workload {
	byKey := map[string]*core.Workload{}
	var keys []string
	for _, p := range pods {
		key, name := "pod/"+p.Namespace+"/"+p.Name, p.Name
		if g, ok, err := api.GangOf(p); ok && err == nil {
			key, name = "gang/"+g.Key(), "gang "+g.Name
		}
		prio := int32(0)
		if p.Spec.Priority != nil {
			prio = *p.Spec.Priority
		}
		w := byKey[key]
		if w == nil {
			w = &core.Workload{Namespace: p.Namespace, Name: name, Priority: prio, Created: p.CreationTimestamp.Time, Uses: core.Resources{}}
			byKey[key] = w
			keys = append(keys, key)
		}
		w.Priority = max(w.Priority, prio)
		if p.CreationTimestamp.Time.Before(w.Created) {
			w.Created = p.CreationTimestamp.Time
		}
		w.Uses = w.Uses.Add(Use(p))
		w.Pods = append(w.Pods, p.Name)
	}
	sort.Strings(keys)
	out := make([]core.Workload, 0, len(keys))
	for _, k := range keys {
		w := byKey[k]
		sort.Strings(w.Pods)
		out = append(out, *w)
	}
	return out
}

// Reason is why quota refuses a pod at filter (the metric label reason).
type Reason string

// Reasons of a refusal.
const (
	// AboveMax: the pod would take its namespace above its max.
	AboveMax Reason = "quota-above-max"
	// NotLendable: the pod would borrow beyond what governed namespaces
	// can lend.
	NotLendable Reason = "quota-borrow-limit"
)

// Verdict is quota's answer for a pod at filter.
type Verdict struct {
	Allowed bool
	// WithinMin: admitted without borrowing, so reclaim may make room.
	WithinMin bool
	Reason    Reason
	Message   string
	// Unresolvable: preemption cannot help (no lower-priority work of the
	// pod's own namespace whose removal would admit it).
	Unresolvable bool
}

// AdmitRequest decides whether namespace ns may start work of priority
// prio using req on view v, and explains a refusal precisely.
// Every refusal's message begins with RefusalPrefix.
func AdmitRequest(v *View, ns string, prio int32, req core.Resources, what string) Verdict {
	st := v.State
	d := st.Admit(ns, req)
	if d.Allowed {
		return Verdict{Allowed: true, WithinMin: !d.Borrowing, Message: d.Reason}
	}
	q := st.Quotas[ns]
	after := st.Used[ns].Add(req)
	out := Verdict{Reason: NotLendable}
	for _, name := range sortedResourceNames(req) {
		if m, capped := q.Max[name]; capped && after[name] > m {
			out.Reason = AboveMax
			out.Message = fmt.Sprintf(RefusalPrefix+"%s asks for %d %s; namespace %s uses %d, its ElasticQuota max is %d", what, req[name], name, ns, st.Used[ns][name], m)
			break
		}
	}
	if out.Reason == NotLendable {
		total, lendable := core.Resources{}, core.Resources{}
		for n, qq := range st.Quotas {
			total = total.Add(st.Used[n])
			lendable = lendable.Add(qq.Min)
		}
		for k, c := range st.Capacity {
			lendable[k] = max(lendable[k], c)
		}
		for _, name := range sortedResourceNames(req) {
			if req[name] > 0 && total[name]+req[name] > lendable[name] {
				out.Message = fmt.Sprintf(RefusalPrefix+"%s asks for %d %s; namespace %s would borrow above its min %d, but governed namespaces use %d of %d that can be lent", what, req[name], name, ns, q.Min[name], total[name], lendable[name])
				break
			}
		}
		if out.Message == "" {
			out.Message = RefusalPrefix + d.Reason
		}
	}
	// Preemption helps only by lower-priority work of the same namespace
	// (CanPreempt refuses other namespaces' victims to work above min):
	// tier preemption (extender.Preemptor) takes the fewest of them that
	// admit it and make it fit, by the same rule (AdmitsWithout).
	var lower []*corev1.Pod
	for _, p := range v.Pods {
		if p.Namespace == ns && corev1helpers.PodPriority(p) < prio {
			lower = append(lower, p)
		}
	}
	out.Unresolvable = !st.AdmitsWithout(ns, req, Workloads(lower))
	return out
}

func sortedResourceNames(r core.Resources) []corev1.ResourceName {
	out := make([]corev1.ResourceName, 0, len(r))
	for k := range r {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// GangOf reads a pod's gang: api.GangOf, or one that completes it
// (planner.GangBook.GangOf).
type GangOf func(*corev1.Pod) (*api.Gang, bool, error)

// PreemptVictims applies quota and gang rules to kube-scheduler's victims
// on one node for preemptor (asking req): a victim that is a gang member
// stays unless every live member of its gang is among the victims (the
// verb can only name pods of this node, so a gang spread over nodes is
// never broken) or it is one of the gang's extra members (beyond its
// minMember, newest first: api.Gang.Extras), which go one by one and
// leave the gang at its minimum at least; and a workload of another
// namespace goes only where core.CanPreempt allows (the preemptor within
// its min, the victim's namespace staying at or above its own). It
// returns the victims allowed, which of them are extra members, and the
// reasons of those dropped, by pod name. gangOf reads a pod's gang
// (api.GangOf, or the planner's planner.GangBook, which knows a PodGroup's
// minMember).
func PreemptVictims(v *View, gangOf GangOf, members func(gang *api.Gang) []*corev1.Pod, preemptor *corev1.Pod, req core.Resources, victims []*corev1.Pod) (allowed []*corev1.Pod, extra map[types.UID]bool, dropped map[string]string) {
	dropped = map[string]string{}
	extra = map[types.UID]bool{}
	onNode := map[types.UID]bool{}
	for _, p := range victims {
		onNode[p.UID] = true
	}
	type unit struct {
		w     core.Workload
		pods  []*corev1.Pod
		extra bool
	}
	units := map[string]*unit{}
	var keys []string
	for _, p := range victims {
		key := "pod/" + p.Namespace + "/" + p.Name
		g, isGang, err := gangOf(p)
		if isGang && err == nil {
			key = "gang/" + g.Key()
		}
		if units[key] != nil {
			continue
		}
		pods := []*corev1.Pod{p}
		if isGang && err == nil {
			pods = liveMembers(members(g))
			whole := true
			for _, m := range pods {
				if !onNode[m.UID] {
					whole = false
				}
			}
			if !whole {
				extras := map[types.UID]bool{}
				for _, e := range g.Extras(pods, gpureq.StartedAt) {
					extras[e.UID] = true
				}
				for _, m := range victims {
					if mg, ok, err := gangOf(m); !ok || err != nil || mg.Key() != g.Key() {
						continue
					}
					if extras[m.UID] {
						mk := key + "/member/" + m.Name
						units[mk] = &unit{w: Workloads([]*corev1.Pod{m})[0], pods: []*corev1.Pod{m}, extra: true}
						keys = append(keys, mk)
						continue
					}
					dropped[m.Name] = fmt.Sprintf("member of gang %s, which has members on other nodes: preempting it would break the gang (only its %d newest members beyond minMember %d may go alone)", g.Key(), len(extras), g.MinMember)
				}
				units[key] = &unit{}
				continue
			}
		}
		ws := Workloads(pods)
		units[key] = &unit{w: ws[0], pods: pods}
		keys = append(keys, key)
	}
	// Lowest priority first, as kube-scheduler would pick them.
	sort.SliceStable(keys, func(i, j int) bool { return units[keys[i]].w.Priority < units[keys[j]].w.Priority })
	st := v.State.Clone()
	for _, k := range keys {
		u := units[k]
		ok, why := st.CanPreempt(preemptor.Namespace, req, u.w)
		if !ok {
			for _, p := range u.pods {
				if onNode[p.UID] {
					dropped[p.Name] = why
				}
			}
			continue
		}
		if _, governed := st.Quotas[u.w.Namespace]; governed {
			st.Used[u.w.Namespace] = st.Used[u.w.Namespace].Sub(u.w.Uses)
		}
		allowed = append(allowed, u.pods...)
		if u.extra {
			for _, p := range u.pods {
				extra[p.UID] = true
			}
		}
	}
	return allowed, extra, dropped
}

// liveMembers are the members of a gang that hold room: bound or planned,
// not ended (the others have nothing to break or give back).
func liveMembers(members []*corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, m := range members {
		_, planned := m.Annotations[api.AnnotationGangPlan]
		if gpureq.Ended(m) || (m.Spec.NodeName == "" && !planned) {
			continue
		}
		out = append(out, m)
	}
	return out
}

// NodeExtras returns, of the pods on one node (onNode), the extra members
// of elastic gangs (api.Gang.Extras: beyond minMember, newest first) of a
// lower priority than preemptor, the newest first, leaving out the gangs
// with a member among victims (PreemptVictims' gang rules decide those).
// The preempt verb offers them beside kube-scheduler's victims:
// kube-scheduler spares the pods that started first, so on a node where
// an extra member runs beside whole workloads of the same priority that
// started after it, kube-scheduler's victims are the workloads, where an
// elastic gang is to give back its extra members first.
func NodeExtras(gangOf GangOf, members func(gang *api.Gang) []*corev1.Pod, preemptor *corev1.Pod, onNode []*corev1.Pod, victims map[types.UID]bool) []*corev1.Pod {
	prio := corev1helpers.PodPriority(preemptor)
	here := map[types.UID]bool{}
	decided := map[string]bool{}
	for _, p := range onNode {
		here[p.UID] = true
		if g, ok, err := gangOf(p); ok && err == nil && victims[p.UID] {
			decided[g.Key()] = true
		}
	}
	var out []*corev1.Pod
	for _, p := range onNode {
		g, ok, err := gangOf(p)
		if !ok || err != nil || decided[g.Key()] {
			continue
		}
		decided[g.Key()] = true
		for _, e := range g.Extras(liveMembers(members(g)), gpureq.StartedAt) {
			if here[e.UID] && corev1helpers.PodPriority(e) < prio {
				out = append(out, e)
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return gpureq.StartedAt(out[i]).After(gpureq.StartedAt(out[j])) })
	return out
}

// Describe renders resources for messages, e.g. "16 tessera.dev/gpu".
func Describe(r core.Resources) string {
	var parts []string
	for _, k := range sortedResourceNames(r) {
		if r[k] != 0 {
			parts = append(parts, fmt.Sprintf("%d %s", r[k], k))
		}
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// RefusalPrefix begins the message of every quota refusal, which the
// filter gives kube-scheduler and kube-scheduler writes into the pod's
// PodScheduled condition.
const RefusalPrefix = "tessera: quota: "

// RefusedByQuota reports a pod whose PodScheduled condition says quota
// refused it (RefusalPrefix).
func RefusedByQuota(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.Contains(c.Message, RefusalPrefix)
		}
	}
	return false
}
