package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// explanation collects what explain prints, section by section.
type explanation struct {
	w     io.Writer
	label int
}

func (x *explanation) line(label, format string, args ...any) {
	fmt.Fprintf(x.w, "%-*s %s\n", x.label, label+":", fmt.Sprintf(format, args...))
}

func (x *explanation) more(format string, args ...any) {
	fmt.Fprintf(x.w, "%-*s %s\n", x.label, "", fmt.Sprintf(format, args...))
}

// explain prints why a pod waits or where it runs: its phase and
// conditions, gates, what it asks for, Tessera's decisions on it (only
// those Tessera sealed), its gang, queue and quota, the extender's
// per-node fit when the extender answers, and the pod's Events.
func (e *env) explain(ctx context.Context, w io.Writer, namespace, name string) error {
	pod, err := e.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return e.apiErr(fmt.Sprintf("pod %s/%s", namespace, name), err)
	}
	x := &explanation{w: w, label: 13}
	now := e.now()
	trust, keyErr := e.trust(ctx)
	if trust == nil {
		trust = &podtrust.Filter{} // trusts nothing: every decision annotation is dropped
	}
	ignored := trust.Pod(pod)

	x.line("Pod", "%s/%s", pod.Namespace, pod.Name)
	phase := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		phase += " (being deleted)"
	}
	x.line("Phase", "%s, created %s ago", phase, ago(now, pod.CreationTimestamp.Time))
	if d, err := extender.ParseDemand(pod); err != nil {
		x.line("Asks for", "a malformed GPU request: %v", err)
	} else {
		x.line("Asks for", "%s", extender.DescribePodDemand(pod, &d))
	}
	if pod.Spec.PriorityClassName != "" || (pod.Spec.Priority != nil && *pod.Spec.Priority != 0) {
		prio := int32(0)
		if pod.Spec.Priority != nil {
			prio = *pod.Spec.Priority
		}
		x.line("Priority", "%s", strings.TrimSpace(fmt.Sprintf("%d %s", prio, pod.Spec.PriorityClassName)))
	}
	for i, g := range pod.Spec.SchedulingGates {
		label := ""
		if i == 0 {
			label = "Gates"
		}
		why := "not Tessera's: whoever added it removes it"
		switch g.Name {
		case api.SchedulingGateGang:
			why = "Tessera lifts it once the whole gang is planned"
			if _, member, _ := api.GangOf(pod); !member {
				why = "the pod declares no gang: Tessera lifts it; a Queue's pod, once the Queue admits it"
			}
		case api.SchedulingGateQueue:
			why = "Tessera lifts it once the pod's Queue admits it and a node is planned"
		}
		if label != "" {
			x.line(label, "%s (%s)", g.Name, why)
		} else {
			x.more("%s (%s)", g.Name, why)
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			x.line("Scheduled", "%s %s", c.Status, strings.TrimSpace(c.Reason+" "+gpustatus.Truncate(c.Message, 400)))
		}
	}

	// Tessera's decisions: only what it sealed.
	if keyErr != nil {
		x.line("Decisions", "not shown: %v", keyErr)
	}
	for _, ig := range ignored {
		if keyErr == nil {
			x.line("Ignored", "%s", ig)
		}
	}
	if pod.Spec.NodeName != "" {
		x.line("Node", "%s", pod.Spec.NodeName)
		if a, ok, err := api.GetAssignment(pod.Annotations); ok && err == nil {
			for _, c := range a.Containers {
				for _, g := range c.GPUs {
					x.more("container %s: whole GPU %d (%s)", c.Name, g.Index, g.UUID)
				}
				if s := c.Shared; s != nil {
					for _, g := range s.GPUs() {
						x.more("container %s: slice of GPU %d (%s): %d MiB, %d%% compute", c.Name, g.Index, g.UUID, s.MemoryMiB, s.Cores)
					}
				}
				for _, m := range c.MIG {
					x.more("container %s: MIG %s %s on GPU %d (%s)", c.Name, m.Profile, m.UUID, m.GPU.Index, m.GPU.UUID)
				}
			}
		} else if keyErr == nil && len(gpureq.QuotaCount(pod)) > 0 {
			x.more("no GPU assignment recorded yet")
		}
	} else if !gpureq.Ended(pod) {
		x.line("Node", "none yet")
	}
	if p, ok, err := api.GetGangPlan(pod.Annotations); ok && err == nil {
		where := p.Node
		if g := p.GPUsText(); g != "" {
			where += ", " + g
		}
		x.line("Plan", "planned by Tessera on %s, released if not bound by %s (in %s)", where, p.Expires.UTC().Format(time.RFC3339), p.Expires.Sub(now).Round(time.Second))
	}

	all, podsErr := e.client.CoreV1().Pods(pod.Namespace).List(ctx, metav1.ListOptions{})
	if podsErr != nil {
		x.line("Namespace", "its pods could not be read: %v", e.apiErr("pods", podsErr))
	}
	e.explainGang(ctx, x, pod, all, trust)
	e.explainQueue(ctx, x, pod, all)
	e.explainQuota(ctx, x, pod)
	e.explainExtender(ctx, x, pod)
	return e.explainEvents(ctx, w, pod, now)
}

func (e *env) explainGang(ctx context.Context, x *explanation, pod *corev1.Pod, all *corev1.PodList, trust *podtrust.Filter) {
	g, ok, err := api.GangOf(pod)
	if err != nil {
		x.line("Gang", "malformed declaration: %v", err)
		return
	}
	if !ok {
		return
	}
	desc := fmt.Sprintf("%s (declared by %s", g.Key(), g.Source)
	if gvr, ok := g.Source.PodGroupGVR(); ok {
		pg, err := e.dyn.Resource(gvr).Namespace(g.Namespace).Get(ctx, g.Name, metav1.GetOptions{})
		switch {
		case err != nil:
			desc += fmt.Sprintf("; its PodGroup could not be read: %v", err)
		default:
			if err := g.ApplyPodGroup(pg, pod); err != nil {
				desc += fmt.Sprintf("; PodGroup: %v", err)
			}
			if phase, _, _ := unstructuredString(pg.Object, "status", "phase"); phase != "" {
				desc += ", PodGroup phase " + phase
			}
		}
	}
	if g.MinMember > 0 {
		desc += fmt.Sprintf(", minMember %d", g.MinMember)
	}
	desc += ")"
	x.line("Gang", "%s", desc)
	if all == nil {
		return
	}
	var members, bound, gated, planned int
	for i := range all.Items {
		p := all.Items[i].DeepCopy()
		if gpureq.Ended(p) {
			continue
		}
		if pg, ok, err := api.GangOf(p); !ok || err != nil || pg.Key() != g.Key() {
			continue
		}
		members++
		trust.Quiet().Pod(p)
		switch {
		case p.Spec.NodeName != "":
			bound++
		case api.HasGangGate(p) || api.HasQueueGate(p):
			gated++
		}
		if _, ok, err := api.GetGangPlan(p.Annotations); ok && err == nil {
			planned++
		}
	}
	x.more("%d members: %d bound, %d planned by Tessera, %d gated", members, bound, planned, gated)
}

func (e *env) explainQueue(ctx context.Context, x *explanation, pod *corev1.Pod, all *corev1.PodList) {
	rows, err := e.readQueues(ctx)
	if err != nil {
		x.line("Queue", "Queues could not be read: %v", err)
		return
	}
	var row *queueRow
	for i := range rows {
		if slices.Contains(rows[i].spec.Namespaces, pod.Namespace) {
			row = &rows[i]
			break
		}
	}
	if row == nil {
		if len(rows) > 0 {
			x.line("Queue", "none serves namespace %s (its GPU pods are not queued)", pod.Namespace)
		}
		return
	}
	q, st := row.spec, row.status
	parent := ""
	if q.Parent != "" {
		parent = ", parent " + q.Parent
	}
	x.line("Queue", "%s%s", q.Name, parent)
	if row.err != nil {
		x.more("invalid, admits nothing new: %v", row.err)
	}
	if pos, n, ok := queuePosition(pod, all, q.Namespaces); ok {
		x.more("position %d of %d waiting GPU pods of the queue's namespaces (priority, then age; across queues the smaller share goes first)", pos, n)
	}
	for _, r := range governedResources(append(slices.Collect(maps.Keys(q.Resources)), slices.Collect(maps.Keys(st.Used))...)) {
		spec, named := q.Resources[r]
		if !named && st.Used[r] == 0 {
			continue
		}
		limit := "none"
		if spec.Limited {
			limit = fmt.Sprint(spec.Limit)
		}
		borrow := ""
		if b := st.Used[r] - spec.Guaranteed; b > 0 {
			borrow = fmt.Sprintf(", borrowing %d", b)
		}
		x.more("%s: guaranteed %d, limit %s, used %d, fair share %d, used/fair %s%s", shortResource(r), spec.Guaranteed, limit, st.Used[r], st.FairShare[r], share(st.Used[r], st.FairShare[r]), borrow)
	}
	if st.UsageUpdated.IsZero() {
		x.more("status: not written yet by tessera-extender")
	} else {
		x.more("status written %s ago", e.now().Sub(st.UsageUpdated).Round(time.Second))
	}
}

// queuePosition is the pod's place among the unbound GPU pods of the
// queue's namespaces, by priority then creation (1 is next); ok is false
// for a pod that does not wait.
func queuePosition(pod *corev1.Pod, all *corev1.PodList, namespaces []string) (pos, n int, ok bool) {
	if all == nil || pod.Spec.NodeName != "" || gpureq.Ended(pod) {
		return 0, 0, false
	}
	prio := func(p *corev1.Pod) int32 {
		if p.Spec.Priority != nil {
			return *p.Spec.Priority
		}
		return 0
	}
	var waiting []*corev1.Pod
	for i := range all.Items {
		p := &all.Items[i]
		if slices.Contains(namespaces, p.Namespace) && p.Spec.NodeName == "" && !gpureq.Ended(p) && len(gpureq.QuotaCount(p)) > 0 {
			waiting = append(waiting, p)
		}
	}
	sort.SliceStable(waiting, func(i, j int) bool {
		a, b := waiting[i], waiting[j]
		if prio(a) != prio(b) {
			return prio(a) > prio(b)
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Name < b.Name
	})
	for i, p := range waiting {
		if p.UID == pod.UID && p.Name == pod.Name {
			return i + 1, len(waiting), true
		}
	}
	return 0, 0, false
}

func (e *env) explainQuota(ctx context.Context, x *explanation, pod *corev1.Pod) {
	list, err := e.dyn.Resource(api.ElasticQuotaGVR).Namespace(pod.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return // the CRD is optional: no line
	}
	for i := range list.Items {
		q, err := api.ElasticQuotaFromUnstructured(&list.Items[i])
		if err != nil {
			x.line("ElasticQuota", "%s: %v", list.Items[i].GetName(), err)
			continue
		}
		x.line("ElasticQuota", "%s: min %s, max %s", q.Name, resourceList(q.Min), resourceList(q.Max))
	}
}

func resourceList(l corev1.ResourceList) string {
	if len(l) == 0 {
		return "none"
	}
	var parts []string
	for _, r := range governedResources(slices.Collect(maps.Keys(l))) {
		if v, ok := l[r]; ok {
			parts = append(parts, shortResource(r)+"="+v.String())
		}
	}
	return strings.Join(parts, ", ")
}

func (e *env) explainExtender(ctx context.Context, x *explanation, pod *corev1.Pod) {
	if e.ext == nil {
		return
	}
	var st extender.PodStatus
	path := extender.StatusPodPath + url.PathEscape(pod.Namespace) + "/" + url.PathEscape(pod.Name)
	if err := e.ext.Get(ctx, path, &st); err != nil {
		x.line("Extender", "no answer: %v", err)
		if pod.Spec.NodeName == "" {
			x.more("(the last FailedScheduling Event below carries the extender's reasons as kube-scheduler summed them)")
		}
		return
	}
	p := st.Pending
	if p == nil {
		if len(st.GPUs) > 0 {
			x.line("Extender", "its ledger counts on %s:", st.Node)
			for _, g := range st.GPUs {
				x.more("%s", g)
			}
		}
		return
	}
	if p.Admission != "" {
		x.line("Extender", "queue %s now: %s", p.Queue, p.Admission)
	} else {
		x.line("Extender", "not queued")
	}
	if p.Quota != "" {
		x.more("ElasticQuota now: %s", p.Quota)
	}
	if p.Reserved != "" {
		x.more("room held for it on %s", p.Reserved)
	}
	if p.Error != "" {
		x.more("request: %s", p.Error)
	}
	x.more("it fits %d of %d nodes now (GPUs, CPU, memory; cordons, taints, its node selector and affinity):", p.Fitting, len(p.Nodes))
	tw := tabwriter.NewWriter(x.w, 0, 4, 2, ' ', 0)
	pad := strings.Repeat(" ", x.label+1)
	fmt.Fprintf(tw, "%sNODE\tFITS\tWHY NOT\n", pad)
	for _, n := range p.Nodes {
		fits := "yes"
		if !n.Fits {
			fits = "no"
		}
		fmt.Fprintf(tw, "%s%s\t%s\t%s\n", pad, n.Node, fits, n.Reason)
	}
	_ = tw.Flush()
}

func (e *env) explainEvents(ctx context.Context, w io.Writer, pod *corev1.Pod, now time.Time) error {
	sel := fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": pod.Name}.AsSelector().String()
	list, err := e.client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		_, werr := fmt.Fprintf(w, "\nEvents: could not be read: %v\n", e.apiErr("events", err))
		return werr
	}
	var evs []corev1.Event
	for _, ev := range list.Items {
		if ev.InvolvedObject.Kind == "Pod" && ev.InvolvedObject.Name == pod.Name && (ev.InvolvedObject.UID == "" || ev.InvolvedObject.UID == pod.UID) {
			evs = append(evs, ev)
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return eventTime(evs[i]).Before(eventTime(evs[j])) })
	if len(evs) == 0 {
		_, err := fmt.Fprintln(w, "\nEvents: none")
		return err
	}
	fmt.Fprintln(w, "\nEvents (oldest first):")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  AGE\tTYPE\tREASON\tFROM\tMESSAGE")
	for _, ev := range evs {
		from := ev.Source.Component
		if from == "" {
			from = ev.ReportingController
		}
		count := ""
		if ev.Count > 1 {
			count = fmt.Sprintf(" (x%d)", ev.Count)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s%s\n", ago(now, eventTime(ev)), ev.Type, ev.Reason, from, gpustatus.Truncate(ev.Message, 600), count)
	}
	return tw.Flush()
}

func eventTime(ev corev1.Event) time.Time {
	switch {
	case !ev.LastTimestamp.IsZero():
		return ev.LastTimestamp.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

func ago(now, t time.Time) string {
	if t.IsZero() {
		return "?"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func unstructuredString(obj map[string]any, path ...string) (string, bool, error) {
	cur := any(obj)
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		if cur, ok = m[p]; !ok {
			return "", false, nil
		}
	}
	s, ok := cur.(string)
	return s, ok, nil
}
