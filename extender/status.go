package extender

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/extender/verbs"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

// Paths of the read-only status views (GET). StatusPath is the HTML page;
// the others are JSON.
const (
	StatusPath          = "/status"
	StatusOccupancyPath = "/status/occupancy"
	StatusQueuesPath    = "/status/queues"
	StatusPendingPath   = "/status/pending"
	// StatusPodPath is followed by namespace/name.
	StatusPodPath = "/status/pods/"
)

// Status serves read-only views of the extender's ledger, queues and
// pending pods: what runs on which GPU, each queue's guarantee, use and
// share, and why pending GPU pods wait. It reads the informers' caches
// (pods already sanitized: only Tessera's sealed decisions are in them)
// and never writes; it shows no pod spec beyond names, requests and
// scheduling state (no env, no secrets).
type Status struct {
	cache  *Cache
	queues *planner.QueueBook
	quota  *equota.Enforcer
	pods   func() ([]*corev1.Pod, error)
	now    func() time.Time
	// reservations, when set, are the gang planner's reservation records.
	reservations func() []api.ReservationRecord
}

// SetReservations makes the status page show the planner's reservations
// (planner.GangPlanner.ReservationRecords). Call it before serving.
func (s *Status) SetReservations(f func() []api.ReservationRecord) { s.reservations = f }

// NewStatus returns the views of cache, queues (nil: no Queues), quota
// (nil: no ElasticQuotas) and the pod informer's cache pods.
func NewStatus(cache *Cache, queues *planner.QueueBook, quota *equota.Enforcer, pods func() ([]*corev1.Pod, error)) *Status {
	return &Status{cache: cache, queues: queues, quota: quota, pods: pods, now: time.Now}
}

// Register adds the status handlers to mux; each answers 503 until ready.
func (s *Status) Register(mux *http.ServeMux, ready func() bool) {
	for path, h := range map[string]http.HandlerFunc{
		StatusPath:                           s.handlePage,
		StatusOccupancyPath:                  s.handleOccupancy,
		StatusQueuesPath:                     s.handleQueues,
		StatusPendingPath:                    s.handlePending,
		StatusPodPath + "{namespace}/{name}": s.handlePod,
	} {
		mux.Handle("GET "+path, verbs.UntilReady(ready, h))
	}
}

// Snapshot is everything the views read, taken once per request.
type Snapshot struct {
	Nodes map[string]*NodeState
	Pods  []*corev1.Pod
	// Reservations are the gang planner's reservation records (none
	// without a planner).
	Reservations []api.ReservationRecord
	Queues       *planner.QueueSnapshot // nil without Queues
	// Quota is the ElasticQuota verdict on each pending GPU pod of a
	// namespace a quota governs.
	Quota map[types.UID]equota.Verdict
}

// Take reads the ledger, the pods, the queues and the quota verdicts on
// pending GPU pods now.
func (s *Status) Take(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{Nodes: s.cache.Snapshot()}
	if s.reservations != nil {
		snap.Reservations = s.reservations()
	}
	var err error
	if snap.Pods, err = s.pods(); err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	if s.queues != nil {
		if snap.Queues, err = s.queues.Snapshot(); err != nil {
			return nil, fmt.Errorf("queues: %w", err)
		}
	}
	if s.quota != nil && s.quota.Ledger != nil && s.quota.Ledger.Quotas != nil {
		snap.Quota = map[types.UID]equota.Verdict{}
		governed := s.quota.Ledger.Quotas.Quotas()
		for _, p := range snap.Pods {
			if _, ok := governed[p.Namespace]; ok && p.Spec.NodeName == "" && !gpureq.Ended(p) && len(gpureq.QuotaCount(p)) > 0 {
				snap.Quota[p.UID] = s.quota.AdmitPod(ctx, p)
			}
		}
	}
	return snap, nil
}

// OccupancyView is the per-node, per-GPU use in the ledger: every pod
// counted on a node (bound, or planned and held for a gang, a queued pod
// or a preemption, marked "(planned)"), and pods by phase.
func OccupancyView(snap *Snapshot) *gpustatus.Cluster {
	c := &gpustatus.Cluster{Nodes: []*gpustatus.Node{}}
	names := make([]string, 0, len(snap.Nodes))
	for n := range snap.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		st := snap.Nodes[name]
		info := st.Info
		n := &gpustatus.Node{Name: name, GPUs: []*gpustatus.GPU{}, Cordoned: info.eligibility != nil && info.eligibility.Spec.Unschedulable}
		c.Nodes = append(c.Nodes, n)
		switch {
		case info.Err != nil:
			n.Err = fmt.Sprintf("malformed GPU inventory: %v", info.Err)
			continue
		case !info.HasInventory:
			n.Err = "no GPU inventory"
			continue
		}
		byUUID := map[string]*gpustatus.GPU{}
		for _, g := range info.GPUs {
			o := &gpustatus.GPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemMiB, Healthy: g.Healthy, Reason: g.Reason}
			if g.InMIG {
				o.MIG = &gpustatus.MIG{Instances: []gpustatus.MIGInstance{}}
			}
			n.GPUs = append(n.GPUs, o)
			byUUID[g.UUID] = o
		}
		// The instances of the GPUs in MIG mode, in inventory order.
		migGPU := map[string]*gpustatus.GPU{}
		for _, in := range info.MIG {
			o := n.GPUs[in.GPU]
			o.MIG.Instances = append(o.MIG.Instances, gpustatus.MIGInstance{UUID: in.UUID, Profile: in.Profile, Healthy: in.Healthy})
			migGPU[in.UUID] = o
		}
		uses := make([]*PodUse, 0, len(st.Pods))
		for _, u := range st.Pods {
			uses = append(uses, u)
		}
		sort.Slice(uses, func(i, j int) bool { return uses[i].Key() < uses[j].Key() })
		type hold struct{ uuid, who string }
		var holds []hold
		for _, u := range uses {
			who := u.Key()
			if u.Planned {
				who += " (planned)"
			}
			for _, uuid := range u.Whole {
				if o := byUUID[uuid]; o != nil {
					o.AddWhole(who)
				}
			}
			for _, uuid := range u.PlannedWhole {
				holds = append(holds, hold{uuid, who})
			}
			// What the ledger counts: the pod's slices at its peak on
			// each GPU (an init container's slice is gone once the
			// containers after it run).
			for p, a := range sharedPeaks(info, u.sharedOn(info)) {
				n.GPUs[p].AddShared(who, a.MemMiB, a.Cores)
			}
			for _, uuid := range u.MIG {
				if o := migGPU[uuid]; o != nil {
					o.AddMIG(who, uuid)
				}
			}
			if u.WholePending > 0 {
				n.Unrecorded = append(n.Unrecorded, gpustatus.UnrecordedLine(who, u.WholePending))
			}
			if len(u.MIGPending) > 0 {
				n.UnrecordedMIG = append(n.UnrecordedMIG, who+": "+gpustatus.DescribeMIG(u.MIGPending))
			}
		}
		for _, h := range holds {
			// A GPU a plan holds shows its holder once the pods leaving
			// it (evicted for the holder) are gone; before, it shows
			// them, not an over-commitment.
			if o := byUUID[h.uuid]; o != nil && len(o.Whole) == 0 && len(o.Shared) == 0 {
				o.AddWhole(h.who)
			}
		}
	}
	running := gpustatus.GangsRunning(snap.Pods)
	for _, p := range snap.Pods {
		switch p.Status.Phase {
		case corev1.PodRunning:
			c.Pods.Running++
		case corev1.PodFailed:
			c.Pods.Failed++
		case corev1.PodSucceeded:
		default:
			if p.Spec.NodeName == "" {
				c.Pods.Pending = append(c.Pods.Pending, p.Namespace+"/"+p.Name+": "+gpustatus.PendingReason(p, running))
			} else {
				c.Pods.Pending = append(c.Pods.Pending, p.Namespace+"/"+p.Name+": starting on "+p.Spec.NodeName)
			}
		}
	}
	sort.Strings(c.Pods.Pending)
	return c
}

// QueueView is one Queue as the extender sees it now, in quota's integer
// units per resource.
type QueueView struct {
	Name       string   `json:"name"`
	Parent     string   `json:"parent,omitempty"`
	Namespaces []string `json:"namespaces,omitempty"`
	// Invalid says why the queue admits nothing (a malformed or orphaned
	// queue).
	Invalid    string          `json:"invalid,omitempty"`
	Guaranteed quota.Resources `json:"guaranteed"`
	// Limit holds the resources the queue caps.
	Limit  quota.Resources               `json:"limit"`
	Weight map[corev1.ResourceName]int64 `json:"weight,omitempty"`
	// Used and Pending are the subtree's running-or-planned and waiting
	// work.
	Used    quota.Resources `json:"used"`
	Pending quota.Resources `json:"pending"`
	// FairShare is the hierarchical water-filling share now.
	FairShare quota.Resources `json:"fairShare"`
	// Borrowed is what Used holds above the guarantee.
	Borrowed quota.Resources `json:"borrowed"`
	// Share orders the queues (smaller goes first): recent and current use
	// over the entitlement (docs/queues.md).
	Share float64 `json:"share"`
}

// QueuesView lists the queues, parents before children (nil without
// Queues).
func QueuesView(snap *Snapshot) []QueueView {
	qs := snap.Queues
	if qs == nil || qs.State == nil || qs.State.Tree == nil {
		return []QueueView{}
	}
	st := qs.State
	tree := st.Tree
	used, pending := map[string]quota.Resources{}, map[string]quota.Resources{}
	for _, leaf := range tree.Leaves() {
		for _, q := range tree.Path(leaf) {
			used[q] = used[q].Add(st.Used[leaf])
			pending[q] = pending[q].Add(st.Pending[leaf])
		}
	}
	fair := st.FairShare()
	out := []QueueView{}
	for _, name := range tree.Names() {
		sp, _ := tree.Spec(name)
		v := QueueView{Name: name, Parent: sp.Parent, Namespaces: sp.Namespaces, Invalid: tree.Invalid(name),
			Guaranteed: nonNil(sp.Guaranteed), Limit: nonNil(sp.Limit), Weight: sp.Weight,
			Used: nonNil(used[name]), Pending: nonNil(pending[name]), FairShare: nonNil(fair[name]),
			Borrowed: quota.Resources{}, Share: st.Share(name)}
		for r, u := range v.Used {
			if b := u - v.Guaranteed[r]; b > 0 {
				v.Borrowed[r] = b
			}
		}
		out = append(out, v)
	}
	return out
}

func nonNil(r quota.Resources) quota.Resources {
	if r == nil {
		return quota.Resources{}
	}
	return r
}

// PendingPod is a GPU pod that is not bound, and why.
type PendingPod struct {
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	Created   time.Time `json:"created"`
	// Demand is what the pod asks for, in words.
	Demand string `json:"demand"`
	// Gates are the pod's scheduling gates.
	Gates []string `json:"gates,omitempty"`
	Gang  string   `json:"gang,omitempty"`
	Queue string   `json:"queue,omitempty"`
	// Admission is the queue's answer to the pod's request now (the
	// reason it waits, or that it may start and whether it borrows).
	Admission string `json:"admission,omitempty"`
	// Quota is the ElasticQuota's answer now, for a governed namespace.
	Quota string `json:"quota,omitempty"`
	// PlannedNode is the node of the pod's sealed plan (a gang member,
	// a queued pod, room held by preemption).
	PlannedNode string `json:"plannedNode,omitempty"`
	// Reserved is set when the ledger holds room for the pod.
	Reserved string `json:"reserved,omitempty"`
	// Scheduler is kube-scheduler's last word (the PodScheduled
	// condition).
	Scheduler string `json:"scheduler,omitempty"`
	// Fitting counts the nodes where the pod fits now (GPUs, CPU, memory,
	// on a node it may go to: not cordoned, its taints tolerated, its node
	// selector and affinity, package eligible; queue and quota admission
	// are Admission and Quota); Reasons counts the others by reason
	// (ReasonNodeRefusesPod for a node it may not go to).
	Fitting int            `json:"fitting"`
	Reasons map[string]int `json:"reasons,omitempty"`
	// Nodes is the per-node fit (PodView only).
	Nodes []NodeFit `json:"nodes,omitempty"`
	// Error is a malformed GPU request.
	Error string `json:"error,omitempty"`
}

// ReasonNodeRefusesPod is the Reasons key of a node the pod may not go to
// (cordoned, a taint it does not tolerate, outside its node selector or
// affinity), whatever is free there.
const ReasonNodeRefusesPod = "node-refuses-pod"

// NodeFit is whether a pod fits one node now, and why not.
type NodeFit struct {
	Node   string `json:"node"`
	Fits   bool   `json:"fits"`
	Reason string `json:"reason,omitempty"`
}

// PodStatus is one pod as the extender sees it: pending (Pending set) or
// placed (Node and its GPUs).
type PodStatus struct {
	Namespace string      `json:"namespace"`
	Name      string      `json:"name"`
	Phase     string      `json:"phase"`
	Node      string      `json:"node,omitempty"`
	GPUs      []string    `json:"gpus,omitempty"`
	Pending   *PendingPod `json:"pending,omitempty"`
}

// PendingView lists the unbound, unfinished GPU pods, oldest first, with
// why each waits; nodes adds the per-node fit to each.
func PendingView(snap *Snapshot, nodes bool) []PendingPod {
	out := []PendingPod{}
	for _, p := range snap.Pods {
		if p.Spec.NodeName != "" || gpureq.Ended(p) || len(gpureq.QuotaCount(p)) == 0 {
			continue
		}
		out = append(out, pendingOf(snap, p, nodes))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].Namespace+"/"+out[i].Name < out[j].Namespace+"/"+out[j].Name
	})
	return out
}

// PodView is one pod's status, with the per-node fit when it is pending;
// nil when the pod is unknown.
func PodView(snap *Snapshot, namespace, name string) *PodStatus {
	for _, p := range snap.Pods {
		if p.Namespace != namespace || p.Name != name {
			continue
		}
		ps := &PodStatus{Namespace: namespace, Name: name, Phase: string(p.Status.Phase), Node: p.Spec.NodeName}
		if p.Spec.NodeName == "" && !gpureq.Ended(p) {
			pp := pendingOf(snap, p, true)
			ps.Pending = &pp
			return ps
		}
		if st := snap.Nodes[p.Spec.NodeName]; st != nil {
			if u := st.Pods[p.UID]; u != nil {
				ps.GPUs = ledgerLines(st.Info, u, p)
			}
		}
		return ps
	}
	return nil
}

// sliceLines says what the ledger counts of a pod's slices shared: one
// line per GPU, in the order of shared, with what they take of it at once
// at the pod's peak (sharedPeaks) and each container's slice when there
// are several.
func sliceLines(info *NodeInfo, shared []SharedUse) []string {
	peaks := sharedPeaks(info, shared)
	byGPU := map[string][]SharedUse{}
	var order []string
	for _, sh := range shared {
		if _, seen := byGPU[sh.UUID]; !seen {
			order = append(order, sh.UUID)
		}
		byGPU[sh.UUID] = append(byGPU[sh.UUID], sh)
	}
	var out []string
	for _, uuid := range order {
		shs := byGPU[uuid]
		a, ok := peaks[info.position(uuid)]
		if !ok { // not in the inventory: not counted
			a = gpureq.Amount{MemMiB: shs[0].MemMiB, Cores: shs[0].Cores}
		}
		if len(shs) == 1 {
			out = append(out, fmt.Sprintf("%s: %d MiB, %d%% compute (container %s)", gpuName(info, uuid), a.MemMiB, a.Cores, shs[0].Container))
			continue
		}
		parts := make([]string, len(shs))
		note := ""
		for i, sh := range shs {
			kind := "container"
			switch sh.Kind {
			case gpureq.Init:
				kind, note = "init container", "; an init container's slice counts only until it ends"
			case gpureq.Sidecar:
				kind = "sidecar"
			}
			parts[i] = fmt.Sprintf("%s %s: %d MiB, %d%%", kind, sh.Container, sh.MemMiB, sh.Cores)
		}
		out = append(out, fmt.Sprintf("%s: %d MiB, %d%% compute at the pod's peak (%s%s)", gpuName(info, uuid), a.MemMiB, a.Cores, strings.Join(parts, "; "), note))
	}
	return out
}

// ledgerLines says what the ledger counts of pod's use u on the node of
// info: its whole GPUs, slices and MIG instances, and what the node agent
// has not recorded yet.
func ledgerLines(info *NodeInfo, u *PodUse, pod *corev1.Pod) []string {
	var out []string
	for _, uuid := range u.Whole {
		out = append(out, gpuName(info, uuid))
	}
	out = append(out, sliceLines(info, u.sharedOn(info))...)
	// The containers of the instances, from the assignment the ledger
	// read them from (the pod is sanitized: Tessera's).
	container := map[string]string{}
	if a, ok, err := api.GetAssignment(pod.Annotations); ok && err == nil {
		for _, c := range a.Containers {
			for _, m := range c.MIG {
				container[m.UUID] = c.Name
			}
		}
	}
	for _, uuid := range u.MIG {
		in := info.migInstance(uuid)
		if in == nil {
			out = append(out, fmt.Sprintf("MIG %s, not in the node's inventory", uuid))
			continue
		}
		line := fmt.Sprintf("MIG %s %s on %s", in.Profile, uuid, gpuName(info, info.GPUs[in.GPU].UUID))
		if c := container[uuid]; c != "" {
			line += " (container " + c + ")"
		}
		out = append(out, line)
	}
	if u.WholePending > 0 {
		out = append(out, fmt.Sprintf("%d whole GPU(s), not recorded by the node agent yet", u.WholePending))
	}
	if len(u.MIGPending) > 0 {
		out = append(out, gpustatus.DescribeMIG(u.MIGPending)+", not recorded by the node agent yet")
	}
	return out
}

func gpuName(info *NodeInfo, uuid string) string {
	if p := info.position(uuid); p >= 0 {
		return fmt.Sprintf("GPU %d (%s, %s)", info.GPUs[p].Index, gpustatus.ShortModel(info.GPUs[p].Model), uuid)
	}
	return uuid
}

func pendingOf(snap *Snapshot, p *corev1.Pod, perNode bool) PendingPod {
	pp := PendingPod{Namespace: p.Namespace, Name: p.Name, Created: p.CreationTimestamp.UTC()}
	for _, g := range p.Spec.SchedulingGates {
		pp.Gates = append(pp.Gates, g.Name)
	}
	if g, ok, err := api.GangOf(p); ok && err == nil {
		pp.Gang = g.Key()
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			pp.Scheduler = gpustatus.Truncate(strings.TrimSpace(c.Reason+": "+c.Message), 2000)
		}
	}
	if plan, ok, err := api.GetGangPlan(p.Annotations); ok && err == nil {
		pp.PlannedNode = plan.Node // sanitized: Tessera sealed it
	}
	if qs := snap.Queues; qs != nil {
		if q, ok := qs.QueueOf(p.Namespace); ok {
			pp.Queue = q
			d := qs.State.Admit(q, gpureq.QuotaCount(p))
			switch {
			case !d.Allowed:
				pp.Admission = "waits: " + d.Reason
			case d.Borrowing:
				pp.Admission = "may start, borrowing: " + d.Reason
			default:
				pp.Admission = "may start within its guarantee"
			}
		}
	}
	if v, ok := snap.Quota[p.UID]; ok {
		switch {
		case !v.Allowed:
			pp.Quota = "waits: " + v.Message
		case v.WithinMin:
			pp.Quota = "admitted within its min"
		default:
			pp.Quota = strings.TrimSpace("admitted, borrowing: " + v.Message)
		}
	}
	for name, st := range snap.Nodes {
		if u := st.Pods[p.UID]; u != nil && u.Planned {
			pp.Reserved = name
		}
	}
	d, err := ParseDemand(p)
	if err != nil {
		pp.Error = err.Error()
		return pp
	}
	pp.Demand = DescribePodDemand(p, &d)
	names := make([]string, 0, len(snap.Nodes))
	for n := range snap.Nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	q := NewQuery(&d)
	allowed := eligible.For(p)
	for _, n := range names {
		st := snap.Nodes[n]
		r := q.Check(st)
		fit := NodeFit{Node: n, Fits: r == Fits}
		key := string(r)
		if why := st.Refusal(allowed); why != "" {
			// kube-scheduler would not put it there, whatever is free.
			fit.Fits, fit.Reason, key = false, "tessera: "+why, ReasonNodeRefusesPod
		}
		if fit.Fits {
			pp.Fitting++
		} else {
			if fit.Reason == "" {
				fit.Reason = Explain(r, st, &d)
			}
			if pp.Reasons == nil {
				pp.Reasons = map[string]int{}
			}
			pp.Reasons[key]++
		}
		if perNode {
			pp.Nodes = append(pp.Nodes, fit)
		}
	}
	if perNode {
		// Fitting nodes first, then by name.
		slices.SortStableFunc(pp.Nodes, func(a, b NodeFit) int {
			switch {
			case a.Fits == b.Fits:
				return 0
			case a.Fits:
				return -1
			}
			return 1
		})
	}
	return pp
}

// DescribePodDemand says in words what pod asks for (d is its demand): as
// DescribeDemand, and for a pod that asks only for nvidia.com/gpu, that
// Tessera does not place it (said "no GPU" before, while the pod waited
// for nvidia.com/gpu on nodes that have none).
func DescribePodDemand(pod *corev1.Pod, d *Demand) string {
	s := DescribeDemand(d)
	if d.Kind() != allocator.Whole && d.Kind() != allocator.Shared && !d.AsksMIG() {
		if n := gpureq.QuotaCount(pod)[api.ResourceNVIDIAGPU]; n > 0 {
			return fmt.Sprintf("%d %s, which Tessera does not place: NVIDIA's device plugin must serve it on a node (with Tessera's compatibility webhook on, extender.webhooks.nvidiaGPU, such a pod asks for %s from its creation)", n, api.ResourceNVIDIAGPU, api.ResourceGPU)
		}
	}
	return s
}

// DescribeDemand says in words what a pod asks for.
func DescribeDemand(d *Demand) string {
	if d.AsksMIG() {
		return gpustatus.DescribeMIG(d.MIG)
	}
	switch d.Kind() {
	case allocator.Whole:
		s := fmt.Sprintf("%d whole GPU(s)", d.WholeGPUs)
		if d.NVLink {
			s += " in one NVLink clique"
		}
		return s
	case allocator.Shared:
		mem, cores := d.SharedTotals()
		if d.GPUCount > 1 {
			return fmt.Sprintf("a slice of %d GPUs: %d memory unit(s), %d%% compute, split evenly", d.GPUCount, mem, cores)
		}
		return fmt.Sprintf("a slice of one GPU: %d memory unit(s), %d%% compute", mem, cores)
	}
	return "no GPU"
}

func (s *Status) serve(w http.ResponseWriter, r *http.Request, view func(*Snapshot) (any, int)) {
	ctx := r.Context()
	snap, err := s.Take(ctx)
	if err != nil {
		klog.FromContext(ctx).Info("Status view failed", "path", r.URL.Path, "err", err)
		verbs.WriteJSON(ctx, w, http.StatusInternalServerError, &verbs.ErrorReply{Error: err.Error()})
		return
	}
	v, code := view(snap)
	verbs.WriteJSON(ctx, w, code, v)
}

func (s *Status) handleOccupancy(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, func(snap *Snapshot) (any, int) { return OccupancyView(snap), http.StatusOK })
}

func (s *Status) handleQueues(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, func(snap *Snapshot) (any, int) { return QueuesView(snap), http.StatusOK })
}

func (s *Status) handlePending(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, func(snap *Snapshot) (any, int) { return PendingView(snap, false), http.StatusOK })
}

func (s *Status) handlePod(w http.ResponseWriter, r *http.Request) {
	ns, name := r.PathValue("namespace"), r.PathValue("name")
	s.serve(w, r, func(snap *Snapshot) (any, int) {
		if v := PodView(snap, ns, name); v != nil {
			return v, http.StatusOK
		}
		return &verbs.ErrorReply{Error: fmt.Sprintf("pod %s/%s is not in the extender's cache", ns, name)}, http.StatusNotFound
	})
}
