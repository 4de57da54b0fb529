package extender

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
)

// StateSource is the ledger as the handlers use it.
type StateSource interface {
	Nodes(names []string) []*NodeState
	Node(name string) (*NodeState, bool)
	Reserve(uid types.UID, node string, decide func(*NodeState) (*PodUse, error)) (*PodUse, error)
	Reservation(uid types.UID) (*PodUse, bool)
	Unreserve(uid types.UID)
}

var _ StateSource = (*Cache)(nil)

// PodClient reads and writes pods at the API server.
type PodClient interface {
	// GetPod reads a pod, possibly from a cache.
	GetPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// GetFreshPod reads a pod from the API server.
	GetFreshPod(ctx context.Context, namespace, name string) (*corev1.Pod, error)
	// Bind creates the pod's Binding to node, conditional on its UID. A
	// non-empty assignment is written in the same request (the Binding's
	// annotations, which the API server copies onto the pod), and the
	// Binding is then conditional on pod's resourceVersion too: a pod
	// changed since it was read is a Conflict.
	Bind(ctx context.Context, pod *corev1.Pod, node, assignment string) error
}

// EventRecorder records Kubernetes Events (record.EventRecorder fits).
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Server answers kube-scheduler's extender calls.
type Server struct {
	state   StateSource
	policy  allocator.Policy
	pods    PodClient
	events  EventRecorder
	metrics *Metrics
	quota   QuotaHooks
	queues  QueueGate
	// shortlist: filter passes at most this many fitting nodes, the
	// policy's best (0: all).
	shortlist int
	// order makes whole-GPU binds wait for the slice binds in flight on
	// their node.
	order bindOrder
	// reserved are the pods placed by Reserve whose bind has not begun.
	reservedMu sync.Mutex
	reserved   map[types.UID]*reservedPod
	// backfill, when set, shows a pod a reservation's room it may use
	// (backfill.go).
	backfill atomic.Pointer[BackfillView]
	// answers are the preempt verb's recent answers (roomBeingFreed).
	answers preemptAnswers
	// quotaBindMu serializes the quota check and the reservation of the
	// binds quota checks (admitAtBind).
	quotaBindMu sync.Mutex
	// now is the clock of the preempt verb's memory (time.Now when nil).
	now func() time.Time
}

// NewServer returns a Server. events and metrics may be nil.
func NewServer(state StateSource, policy allocator.Policy, pods PodClient, events EventRecorder, metrics *Metrics) *Server {
	return &Server{state: state, policy: policy, pods: pods, events: events, metrics: metrics}
}

// SetShortlist makes filter pass at most k fitting nodes, those the
// policy scores best, instead of every fitting node (k <= 0: all). Call
// it before serving.
func (s *Server) SetShortlist(k int) { s.shortlist = k }

// SetQuota makes filter and preempt enforce quota (nil: none). Call it
// before serving.
func (s *Server) SetQuota(q QuotaHooks) { s.quota = q }

func (s *Server) event(pod *corev1.Pod, reason, format string, args ...any) {
	if s.events != nil && pod != nil && pod.Name != "" {
		s.events.Eventf(pod, corev1.EventTypeWarning, reason, format, args...)
	}
}

// FilterArgs runs the filter verb on decoded arguments.
func (s *Server) FilterArgs(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	return s.filter(ctx, args, s.shortlist)
}

// FilterAll is FilterArgs without the shortlist: every node that fits
// passes. tessera-scheduler asks it for a pod whose shortlisted nodes all
// failed kube-scheduler's other filters.
func (s *Server) FilterAll(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	return s.filter(ctx, args, 0)
}

func (s *Server) filter(ctx context.Context, args *extenderv1.ExtenderArgs, k int) *extenderv1.ExtenderFilterResult {
	res := &extenderv1.ExtenderFilterResult{FailedNodes: extenderv1.FailedNodesMap{}, FailedAndUnresolvableNodes: extenderv1.FailedNodesMap{}}
	if args.Pod == nil {
		res.Error = "filter: the request names no pod"
		return res
	}
	if plan, ok, err := api.GetGangPlan(args.Pod.Annotations); ok {
		if err != nil {
			res.Error = err.Error()
			s.event(args.Pod, "InvalidGangPlan", "%v", err)
			return res
		}
		s.filterPlanned(ctx, args, plan, res)
		return res
	}
	if msg, held := s.unadmitted(args.Pod); held {
		// A gang is bound whole or not at all: a member the planner has
		// not placed passes no node, webhook or not (the planner plans
		// ungated members too; the plan's update brings it back).
		for _, n := range argNames(args) {
			res.FailedNodes[n] = msg
		}
		if args.NodeNames != nil {
			res.NodeNames = &[]string{}
		} else if args.Nodes != nil {
			res.Nodes = &corev1.NodeList{Items: []corev1.Node{}}
		}
		return res
	}
	d, err := ParseDemand(args.Pod)
	if err != nil {
		res.Error = err.Error()
		s.event(args.Pod, "InvalidGPURequest", "%v", err)
		return res
	}
	names := argNames(args)
	var qv equota.Verdict
	if s.quota != nil {
		if qv = s.quota.AdmitPod(ctx, args.Pod); !qv.Allowed {
			s.rejectByQuota(args, qv, res)
			return res
		}
	}
	states := s.viewsFor(args.Pod, s.state.Nodes(names))
	passed := make([]bool, len(names))
	reasons := make([]Reason, len(names))
	q := NewQuery(&d)
	parallelFor(len(names), func(i int) {
		reasons[i] = q.Check(states[i])
		passed[i] = reasons[i] == Fits
	})
	var counts map[Reason]int
	type msgKey struct {
		r               Reason
		model           string
		unit, sliceBase int64
	}
	msgs := map[msgKey]string{}
	for i, r := range reasons {
		if r == Fits {
			continue
		}
		if counts == nil {
			counts = map[Reason]int{}
		}
		counts[r]++
		k := msgKey{r: r}
		if st := states[i]; st != nil {
			k.model, k.unit, k.sliceBase = st.Info.Model, st.Info.UnitMiB, st.Info.SliceBaseMiB
		}
		m, ok := msgs[k]
		switch {
		case nodeSpecific(r, states[i]):
			m = Explain(r, states[i], &d) // not shared with other nodes
		case !ok:
			m = Explain(r, states[i], &d)
			msgs[k] = m
		}
		if r.Unresolvable() {
			res.FailedAndUnresolvableNodes[names[i]] = m
		} else {
			res.FailedNodes[names[i]] = m
		}
	}
	for r, n := range counts {
		s.metrics.rejected(r, n)
	}
	left := shortlist(s.policy, q, args.Pod, states, passed, k)
	s.metrics.shortlisted(left)
	if args.NodeNames != nil {
		out := make([]string, 0, len(names))
		for i, n := range names {
			if passed[i] {
				out = append(out, n)
			}
		}
		res.NodeNames = &out
	} else if args.Nodes != nil {
		out := &corev1.NodeList{Items: make([]corev1.Node, 0, len(names))}
		for i := range args.Nodes.Items {
			if passed[i] {
				out.Items = append(out.Items, args.Nodes.Items[i])
			}
		}
		res.Nodes = out
	}
	if qv.WithinMin && len(names) > 0 && !slices.Contains(passed, true) {
		// Within its min and no room: reclaim may make some.
		s.quota.NoRoom(args.Pod)
	}
	klog.FromContext(ctx).V(4).Info("Filtered", "pod", klog.KObj(args.Pod), "nodes", len(names), "rejected", counts, "leftOut", left)
	return res
}

// rejectByQuota rejects every node for a pod quota refuses.
func (s *Server) rejectByQuota(args *extenderv1.ExtenderArgs, v equota.Verdict, res *extenderv1.ExtenderFilterResult) {
	names := argNames(args)
	for _, n := range names {
		if v.Unresolvable {
			res.FailedAndUnresolvableNodes[n] = v.Message
		} else {
			res.FailedNodes[n] = v.Message
		}
	}
	s.metrics.rejected(Reason(v.Reason), len(names))
	if args.NodeNames != nil {
		res.NodeNames = &[]string{}
	} else if args.Nodes != nil {
		res.Nodes = &corev1.NodeList{Items: []corev1.Node{}}
	}
	if s.events != nil {
		s.events.Eventf(args.Pod, corev1.EventTypeWarning, api.EventQuotaExceeded, "%s", v.Message)
	}
}

// filterPlanned passes only the node of a gang member's plan: the planner
// reserved the member's place there for the whole gang, so the GPU check
// is not repeated (the ledger counts the member itself on that node).
func (s *Server) filterPlanned(ctx context.Context, args *extenderv1.ExtenderArgs, plan *api.GangPlan, res *extenderv1.ExtenderFilterResult) {
	names := argNames(args)
	passed := make([]bool, len(names))
	other := fmt.Sprintf("tessera: gang %s planned this pod on node %s", plan.Gang, plan.Node)
	if _, member, _ := api.GangOf(args.Pod); !member && plan.Gang == args.Pod.Name {
		other = fmt.Sprintf("tessera: the room freed for this pod (by preemption or quota reclaim) is held on node %s", plan.Node)
	}
	for i, n := range names {
		switch {
		case n != plan.Node:
			res.FailedAndUnresolvableNodes[n] = other
		default:
			if _, known := s.state.Node(n); !known {
				res.FailedNodes[n] = Explain(UnknownNode, nil, &Demand{})
				continue
			}
			passed[i] = true
		}
	}
	if args.NodeNames != nil {
		out := []string{}
		for i, n := range names {
			if passed[i] {
				out = append(out, n)
			}
		}
		res.NodeNames = &out
	} else if args.Nodes != nil {
		out := &corev1.NodeList{}
		for i := range args.Nodes.Items {
			if passed[i] {
				out.Items = append(out.Items, args.Nodes.Items[i])
			}
		}
		res.Nodes = out
	}
	klog.FromContext(ctx).V(4).Info("Filtered a planned gang member", "pod", klog.KObj(args.Pod), "gang", plan.Gang, "node", plan.Node, "passed", slices.Contains(passed, true))
}

func argNames(args *extenderv1.ExtenderArgs) []string {
	if args.NodeNames != nil {
		return *args.NodeNames
	}
	if args.Nodes == nil {
		return nil
	}
	names := make([]string, len(args.Nodes.Items))
	for i := range args.Nodes.Items {
		names[i] = args.Nodes.Items[i].Name
	}
	return names
}

// PrioritizeArgs runs the prioritize verb. With cpuOnly (the verb of the
// extender entry without managedResources, called for every pod), pods
// that use GPUs get a flat score, since the main entry scores them.
func (s *Server) PrioritizeArgs(ctx context.Context, args *extenderv1.ExtenderArgs, cpuOnly bool) (extenderv1.HostPriorityList, error) {
	if args.Pod == nil {
		return nil, errors.New("prioritize: the request names no pod")
	}
	d, err := ParseDemand(args.Pod)
	if err != nil {
		return nil, err
	}
	names := argNames(args)
	out := make(extenderv1.HostPriorityList, len(names))
	if cpuOnly && d.UsesGPUs() {
		for i, n := range names {
			out[i] = extenderv1.HostPriority{Host: n}
		}
		return out, nil
	}
	states := s.state.Nodes(names)
	raw := make([]float64, len(names))
	fits := make([]bool, len(names))
	q := NewQuery(&d)
	aligned := make([]bool, len(names))
	parallelFor(len(states), func(i int) {
		raw[i], fits[i] = q.Score(s.policy, states[i])
		aligned[i] = fits[i] && states[i].numaAligned(&d)
	})
	scores := NormalizeScores(raw, fits, extenderv1.MaxExtenderPriority)
	PreferAligned(scores, fits, aligned)
	for i, n := range names {
		out[i] = extenderv1.HostPriority{Host: n, Score: scores[i]}
	}
	return out, nil
}

// ErrPodMismatch is wrapped when the pod to bind is not the one the
// scheduler named (it was deleted and recreated) or is already bound
// elsewhere.
var ErrPodMismatch = errors.New("pod changed since it was scheduled")

// Bind places the pod named by args on its node: for a shared request it
// chooses the GPU and creates the Binding with the pod's assignment
// annotation, one write that binds and records the choice together. The
// placement is counted in the ledger before the write and rolled back when
// the Binding fails.
func (s *Server) Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error {
	if args.PodName == "" || args.Node == "" {
		return errors.New("bind: pod name and node are required")
	}
	err := s.bind(ctx, args, s.pods.GetPod)
	if errors.Is(err, errStalePod) || errors.Is(err, ErrNotPlannedNode) {
		// The cached copy was stale (the Binding conflicted), or showed no
		// plan, or another, where kube-scheduler, which read a newer copy,
		// bound a pod the planner had just planned and released: once more
		// with a fresh one (seen in an e2e run: a queued pod's bind refused
		// as not admitted yet, and the pod then waited for minutes).
		err = s.bind(ctx, args, s.pods.GetFreshPod)
	}
	return err
}

// bindPoll is how often a bind that waits on its node (waitPlannedSlices,
// waitOffered) looks at the node's state again.
const bindPoll = 20 * time.Millisecond

// waitNode calls check on node's state every bindPoll until it is
// satisfied or the node is gone (nil), or ctx ends: then it returns the last
// reason check gave with ctx's error.
func (s *Server) waitNode(ctx context.Context, node string, check func(*NodeState) (ok bool, why string)) (string, error) {
	t := time.NewTicker(bindPoll)
	defer t.Stop()
	for {
		st, ok := s.state.Node(node)
		if !ok {
			return "", nil
		}
		done, why := check(st)
		if done {
			return "", nil
		}
		select {
		case <-ctx.Done():
			return why, ctx.Err()
		case <-t.C:
		}
	}
}

// waitPlannedSlices waits until node has no gang member but self that is
// planned on some of its GPUs for a slice and not bound yet, or ctx ends.
// Such a member's GPUs are known to the ledger but not to the node, whose
// kubelet could give one to the whole-GPU pod being bound. A member whose
// bind would be refused (plannedSliceBindable) is not waited for: its
// plan's GPUs are taken or gone, so the kubelet cannot give them away, and
// waiting for it held every whole-GPU bind of the node until its plan
// expired.
func (s *Server) waitPlannedSlices(ctx context.Context, node string, self types.UID) error {
	why, err := s.waitNode(ctx, node, func(st *NodeState) (bool, string) {
		var waiting []string
		for uid, u := range st.Pods {
			if uid != self && u.Planned && len(u.PlannedGPUs) > 0 && plannedSliceBindable(st, u) {
				waiting = append(waiting, u.Key())
			}
		}
		sort.Strings(waiting)
		return len(waiting) == 0, strings.Join(waiting, ", ")
	})
	if err != nil {
		return fmt.Errorf("waiting for gang members planned on shared GPUs of %s to be bound (%s): %w", node, why, err)
	}
	return nil
}

// plannedSliceBindable reports whether the bind of u, a member planned on
// GPUs of node st for a slice, would place it there now (reserve's check),
// or may once the pods leaving the node are gone (its bind waits for them:
// reserveHeld).
func plannedSliceBindable(st *NodeState, u *PodUse) bool {
	if len(leavingPods(st)) > 0 {
		return true
	}
	if !u.plannedGPUsIn(st.Info) {
		return false
	}
	d := &Demand{Shares: u.PlannedShares, GPUCount: len(u.PlannedGPUs)}
	gpus := make([]api.GPURef, len(u.PlannedGPUs))
	for i, uuid := range u.PlannedGPUs {
		gpus[i] = api.GPURef{UUID: uuid, Index: st.Info.GPUs[st.Info.position(uuid)].Index}
	}
	_, ok := ReusePlannedShared(st, u.UID, d, plannedAssignment(st.Info, d, gpus))
	return ok
}

// offeredWait bounds how long a bind waits for its node to offer what the
// pod needs (NodeState.Offers); past it the bind fails and the scheduler
// tries the pod again. It is below the scheduler's httpTimeout for the
// extender (30 s in deploy/extender/scheduler-config.yaml).
const offeredWait = 20 * time.Second

// waitOffered waits until node offers what the pod uid reserved there
// needs from its kubelet (NodeState.Offers): a GPU the ledger freed when
// its pod of the other kind ended, but whose devices for this kind the
// node agent still withholds, is offered once the agent's inventory says
// so, which it does only after the kubelet was sent the device again. The
// agent's withholding follows the kubelet's allocations and the slices
// assigned to the node's pods, which the ledger counts too, so the wait
// ends when the kubelet frees what ended; a node whose agent is down keeps
// its last inventory, and the bind fails after offeredWait.
func (s *Server) waitOffered(ctx context.Context, node string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, offeredWait)
	defer cancel()
	start := time.Now()
	var key string
	why, err := s.waitNode(ctx, node, func(st *NodeState) (bool, string) {
		u, ok := st.Pods[uid]
		if !ok {
			return true, ""
		}
		key = u.Key()
		return st.Offers(u)
	})
	if err != nil {
		return fmt.Errorf("node %s does not offer the pod's GPUs yet: %s: %w", node, why, err)
	}
	if waited := time.Since(start); waited > bindPoll && key != "" {
		klog.FromContext(ctx).V(2).Info("The node offers the pod's GPUs again", "pod", key, "node", node, "waited", waited.Round(time.Millisecond))
	}
	return nil
}

// ErrNotPlannedNode is wrapped when a gang member is bound to a node other
// than its plan's.
var ErrNotPlannedNode = errors.New("not the node of the pod's gang plan")

// QueueGate tells the namespaces a Queue serves.
type QueueGate interface {
	Queued(namespace string) bool
}

// SetQueues makes the verbs hold back the GPU pods of namespaces a Queue
// serves until the planner admits them (their plan): without it, a pod
// whose gate was removed by its owner (or never added: the webhook failed
// open) would skip its queue's order and limits.
func (s *Server) SetQueues(q QueueGate) { s.queues = q }

// unadmitted reports a pod with no plan that only the planner may place:
// a gang member, or a GPU pod of a queued namespace; with the message the
// filter and bind give.
func (s *Server) unadmitted(pod *corev1.Pod) (string, bool) {
	if msg, member := unplannedMember(pod); member {
		return msg, true
	}
	if s.queues != nil && len(gpureq.QuotaCount(pod)) > 0 && s.queues.Queued(pod.Namespace) {
		return fmt.Sprintf("tessera: namespace %s is served by a Queue: this pod waits to be admitted in its queue's order", pod.Namespace), true
	}
	return "", false
}

// unplannedMember reports a pod that belongs to a gang (or declares one
// malformed) and has no plan, with the message the filter and bind give.
func unplannedMember(pod *corev1.Pod) (string, bool) {
	g, member, err := api.GangOf(pod)
	switch {
	case !member:
		return "", false
	case err != nil:
		return fmt.Sprintf("tessera: %v", err), true
	}
	return fmt.Sprintf("tessera: gang %s is placed whole by Tessera's gang planner, and this member is not planned yet", g.Key()), true
}

// plannedAssignment is the assignment that puts every shared container of
// d on the planned GPUs of a node described by info (index order: one, or
// all of a multi-GPU slice's).
func plannedAssignment(info *NodeInfo, d *Demand, gpus []api.GPURef) *api.Assignment {
	a := api.NewAssignment()
	for _, sh := range d.Shares {
		s := gpureq.Resolve(sh, info.UnitMiB, info.SliceBaseMiB)
		shared := &api.SharedGPU{GPU: gpus[0], MemoryMiB: s.MemMiB, Cores: s.Cores}
		if len(gpus) > 1 {
			shared.Spread = slices.Clone(gpus[1:])
		}
		a.Containers = append(a.Containers, api.ContainerAssignment{Name: sh.Name, Shared: shared})
	}
	return a
}

// ErrQuotaAtBind is returned by bind when the pod's namespace may no
// longer take what it asks for: kube-scheduler's next filter says why.
var ErrQuotaAtBind = errors.New("quota refuses the pod at bind")

// admitAndReserve reserves pod's place on node (reserveHeld), first
// asking quota again for a pod without a plan: kube-scheduler binds
// asynchronously, so the filter of a namespace's next pod may run before
// this bind reserved anything, and a burst of pods passed a namespace's
// ElasticQuota max (make demo: 7 pods of 2 GPUs under a max of 12). The
// check and the reservation are made together under quotaBindMu, so each
// bind sees the binds before it. A planned pod (a gang member, room held
// by preemption or reclaim) counts already and was admitted when planned:
// it is not asked again (refusing one member would split its gang).
func (s *Server) admitAndReserve(ctx context.Context, pod *corev1.Pod, node string, pl *placement) (*PodUse, error) {
	if s.quota == nil || pl.plan != nil {
		return s.reserveHeld(ctx, pod, node, pl)
	}
	s.quotaBindMu.Lock()
	defer s.quotaBindMu.Unlock()
	if err := s.admitAtBind(ctx, pod); err != nil {
		return nil, err
	}
	use, err := s.reserveHeld(ctx, pod, node, pl)
	if err == nil {
		s.quota.Book(pod)
	}
	return use, err
}

// admitAtBind asks quota again for pod at bind or Reserve (the caller
// holds quotaBindMu): an ErrQuotaAtBind with the quota's message, and a
// QuotaExceeded Event, when it refuses.
func (s *Server) admitAtBind(ctx context.Context, pod *corev1.Pod) error {
	if v := s.quota.AdmitPod(ctx, pod); !v.Allowed {
		s.event(pod, api.EventQuotaExceeded, "%s", v.Message)
		return fmt.Errorf("%w: %s", ErrQuotaAtBind, v.Message)
	}
	return nil
}

// errStalePod is returned by bind when the pod changed since it was read.
var errStalePod = errors.New("pod changed since it was read")

func (s *Server) bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs, get func(context.Context, string, string) (*corev1.Pod, error)) error {
	logger := klog.FromContext(ctx)
	pod, err := get(ctx, args.PodNamespace, args.PodName)
	if err != nil {
		return fmt.Errorf("bind %s/%s: %w", args.PodNamespace, args.PodName, err)
	}
	if args.PodUID != "" && pod.UID != args.PodUID {
		return fmt.Errorf("bind %s/%s: %w: UID %s, scheduled as %s", pod.Namespace, pod.Name, ErrPodMismatch, pod.UID, args.PodUID)
	}
	switch pod.Spec.NodeName {
	case args.Node:
		logger.V(2).Info("Pod already bound", "pod", klog.KObj(pod), "node", args.Node)
		return nil
	case "":
	default:
		return fmt.Errorf("bind %s/%s to %s: %w: already bound to %s", pod.Namespace, pod.Name, args.Node, ErrPodMismatch, pod.Spec.NodeName)
	}
	pl, err := s.placing(pod, args.Node)
	if err != nil {
		if pl.reason != "" {
			s.event(pod, pl.reason, "%v", err)
		}
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, args.Node, err)
	}
	d := pl.demand
	held := s.takeReserved(pod.UID, args.Node)
	var slice *sliceBind
	if len(d.Shares) > 0 {
		if slice = held.sliceBind(); slice == nil {
			slice = s.order.slice(args.Node)
		}
		defer slice.end()
	}
	if pl.malformed != nil {
		// A malformed assignment is overwritten below; say so.
		s.event(pod, "MalformedAssignment", "replacing malformed assignment: %v", pl.malformed)
	}
	var use *PodUse
	if u, ok := s.state.Reservation(pod.UID); held != nil && ok && u.Node == args.Node {
		// Placed by Reserve, within the scheduler's cycle: the pods
		// reserved since saw it there, so it stays.
		use = u
	} else if use, err = s.admitAndReserve(ctx, pod, args.Node, &pl); err != nil {
		s.event(pod, "FailedBinding", "%v", err)
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, args.Node, err)
	}
	use.Namespace, use.Name = pod.Namespace, pod.Name
	var assignment string
	if len(use.Shared) > 0 {
		if assignment, err = api.EncodeAssignment(SharedAssignment(pl.prev, use)); err != nil {
			s.state.Unreserve(pod.UID)
			return fmt.Errorf("bind %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	if d.WholeGPUs > 0 {
		// The kubelet chooses these GPUs: the node agent must first see
		// the slices reserved on the node before them: gang members
		// planned on a GPU (they bind later), and slice binds in flight
		// (bindOrder; a planned member registers before it stops being
		// planned).
		err := s.waitPlannedSlices(ctx, args.Node, pod.UID)
		if err == nil {
			err = s.order.waitSlices(ctx, args.Node, slice)
		}
		if err != nil {
			s.state.Unreserve(pod.UID)
			return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, args.Node, err)
		}
	}
	// The ledger may have freed a GPU the node still withholds from this
	// pod's kind (its last pod of the other kind just ended): the kubelet
	// would refuse the pod until the node offers it again.
	if err := s.waitOffered(ctx, args.Node, pod.UID); err != nil {
		s.state.Unreserve(pod.UID)
		s.event(pod, "FailedBinding", "%v", err)
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, args.Node, err)
	}
	if err := s.pods.Bind(ctx, pod, args.Node, assignment); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			// A retry whose first Binding went through?
			cur, gerr := s.pods.GetFreshPod(ctx, pod.Namespace, pod.Name)
			if gerr == nil && cur.UID == pod.UID && cur.Spec.NodeName == args.Node {
				logger.V(2).Info("Binding already exists", "pod", klog.KObj(pod), "node", args.Node)
				return nil
			}
			if gerr == nil && cur.ResourceVersion != pod.ResourceVersion {
				// Read before a change (bound elsewhere, recreated):
				// the caller decides again from a fresh read.
				s.state.Unreserve(pod.UID)
				return fmt.Errorf("bind %s/%s: %w: %w", pod.Namespace, pod.Name, errStalePod, err)
			}
		}
		s.state.Unreserve(pod.UID)
		s.event(pod, "FailedBinding", "binding to %s failed: %v", args.Node, err)
		return fmt.Errorf("bind %s/%s to %s: %w", pod.Namespace, pod.Name, args.Node, err)
	}
	s.metrics.placed(d.Kind().String())
	logger.V(2).Info("Bound", "pod", klog.KObj(pod), "node", args.Node, "shared", use.Shared, "wholeGPUs", use.WholePending)
	return nil
}

// placement is what placing a pod on a node starts from.
type placement struct {
	demand Demand
	// plan is the pod's gang plan, nil when it has none.
	plan *api.GangPlan
	// prev is the assignment recorded for the pod (the pod came through
	// the trust filter: one Tessera sealed for it), nil when none.
	prev *api.Assignment
	// malformed is why a recorded assignment was unreadable (then prev
	// is nil and the bind overwrites it).
	malformed error
	// reason is the Event reason of placing's error, "" for none.
	reason string
}

// placing reads what placing pod on node needs, or says why the pod may
// not go there: a malformed plan or request, another node planned, or a
// pod only the planner may place.
func (s *Server) placing(pod *corev1.Pod, node string) (placement, error) {
	var pl placement
	plan, planned, err := api.GetGangPlan(pod.Annotations)
	switch {
	case err != nil:
		pl.reason = "InvalidGangPlan"
		return pl, err
	case planned && plan.Node != node:
		return pl, fmt.Errorf("%w: gang %s planned it on %s", ErrNotPlannedNode, plan.Gang, plan.Node)
	case planned:
		pl.plan = plan
	default:
		if msg, held := s.unadmitted(pod); held {
			return pl, fmt.Errorf("%w: %s", ErrNotPlannedNode, msg)
		}
	}
	if pl.demand, err = ParseDemand(pod); err != nil {
		pl.reason = "InvalidGPURequest"
		return pl, err
	}
	pl.prev, _, pl.malformed = api.GetAssignment(pod.Annotations)
	if pl.malformed != nil {
		pl.prev = nil
	}
	return pl, nil
}

// reserve counts pod on node in the ledger, placed as its bind places it:
// its recorded slices when they still fit, a planned slice's GPUs (all
// those it spans), else the policy's choice (a plan that names no GPU, or
// fewer than the slice spans, held them by count: PlannedPodUse).
func (s *Server) reserve(pod *corev1.Pod, node string, pl *placement) (*PodUse, error) {
	d, plan := &pl.demand, pl.plan
	planned := plannedSliceGPUs(plan, d)
	return s.state.Reserve(pod.UID, node, func(st *NodeState) (*PodUse, error) {
		st = s.ViewFor(pod, st)
		if u, ok := ReuseShared(st, pod.UID, d, pl.prev); ok {
			return u, nil
		}
		if planned != nil {
			// A planned slice goes to its planned GPUs or not at all.
			if u, ok := ReusePlannedShared(st, pod.UID, d, plannedAssignment(st.Info, d, planned)); ok {
				return u, nil
			}
			by := "gang " + plan.Gang + "'s plan"
			if plan.Gang == pod.Name {
				by = "its plan" // a pod planned alone (queued, or room made for it)
			}
			if len(planned) == 1 {
				return nil, fmt.Errorf("%w: %s put it on GPU %s, which no longer has room", ErrNoFit, by, planned[0].UUID)
			}
			uuids := make([]string, len(planned))
			for i, g := range planned {
				uuids[i] = g.UUID
			}
			return nil, fmt.Errorf("%w: %s put it on GPUs %s, which no longer have room", ErrNoFit, by, strings.Join(uuids, ", "))
		}
		return ChoosePlacement(s.policy, st, pod.UID, d)
	})
}

// reserveHeld is reserve for a bind. A pod whose room is planned on node
// (a gang member, or a pod preemption or quota reclaim made room for) that
// does not fit there while pods are leaving the node (the victims evicted
// for it) waits for them to go, up to offeredWait, and is placed then:
// kube-scheduler binds it as soon as its plan passes the filter, and a
// multi-GPU slice, held by count, is placed only at its bind (it failed,
// with a FailedBinding Event, for kube-scheduler to try again).
func (s *Server) reserveHeld(ctx context.Context, pod *corev1.Pod, node string, pl *placement) (*PodUse, error) {
	use, err := s.reserve(pod, node, pl)
	if err == nil || !s.heldWhileLeaving(node, pl, err) {
		return use, err // placed, or no room that leaving pods will free
	}
	wctx, cancel := context.WithTimeout(ctx, offeredWait)
	defer cancel()
	why, werr := s.waitNode(wctx, node, func(st *NodeState) (bool, string) {
		leaving := leavingPods(st)
		return len(leaving) == 0, strings.Join(leaving, ", ")
	})
	if werr != nil {
		return nil, fmt.Errorf("%w; pods still leaving the node (%s): %w", err, why, werr)
	}
	klog.FromContext(ctx).V(2).Info("Placing a held pod once the pods leaving its node are gone", "pod", klog.KObj(pod), "node", node)
	return s.reserve(pod, node, pl)
}

// leavingPods are the pods (namespace/name, sorted) being deleted from
// node state st.
func leavingPods(st *NodeState) []string {
	var leaving []string
	for _, u := range st.Pods {
		if u.Leaving {
			leaving = append(leaving, u.Key())
		}
	}
	sort.Strings(leaving)
	return leaving
}

// Reserve counts pod on node in the ledger now, as its bind will place it,
// for a scheduler that binds later (tessera-scheduler's Reserve point):
// the pods it schedules meanwhile see the room taken. Unreserve drops it.
// pod must have come through the trust filter.
//
// The bind keeps this placement: the pods reserved after it were placed
// around it (a slice put on a free GPU, say, before whole GPUs reserved
// next to it, which would leave the slice no GPU when it decided again). A
// slice's bind counts as in flight from here (bindOrder): a whole-GPU pod
// reserved on the node after it is bound only after its Binding, even
// when its own bind runs first.
func (s *Server) Reserve(pod *corev1.Pod, node string) error {
	pl, err := s.placing(pod, node)
	var slice *sliceBind
	if err == nil && len(pl.demand.Shares) > 0 {
		slice = s.order.slice(node)
	}
	if err == nil && s.quota != nil && pl.plan == nil {
		// As at bind (admitAndReserve): the filter of a namespace's next
		// pod may have run before this one reserved anything.
		s.quotaBindMu.Lock()
		defer s.quotaBindMu.Unlock()
		if err = s.admitAtBind(context.Background(), pod); err == nil {
			defer func() {
				if _, ok := s.state.Reservation(pod.UID); ok {
					s.quota.Book(pod)
				}
			}()
		}
	}
	if err == nil {
		_, err = s.reserve(pod, node, &pl)
		if err != nil && s.heldWhileLeaving(node, &pl, err) {
			// Its room is held (the plan counts it on the node) while the
			// pods evicted for it leave: the bind places it once they are
			// gone (reserveHeld), as it does for kube-scheduler's bind
			// verb, instead of a failed cycle.
			err = nil
		}
	}
	if err != nil {
		if slice != nil {
			slice.end()
		}
		return fmt.Errorf("reserve %s/%s on %s: %w", pod.Namespace, pod.Name, node, err)
	}
	s.holdReserved(pod.UID, &reservedPod{node: node, slice: slice})
	return nil
}

// heldWhileLeaving reports that reserving a pod with a plan on node failed
// (err) only for room that pods leaving the node still take.
func (s *Server) heldWhileLeaving(node string, pl *placement, err error) bool {
	if pl.plan == nil || !errors.Is(err, ErrNoFit) {
		return false
	}
	st, ok := s.state.Node(node)
	return ok && len(leavingPods(st)) > 0
}

// reservedPod is a pod placed by Reserve, until its bind begins.
type reservedPod struct {
	node string
	// slice is its slice bind in flight, nil for a pod without slices.
	slice *sliceBind
}

// sliceBind is r's slice bind (nil for none or a nil r).
func (r *reservedPod) sliceBind() *sliceBind {
	if r == nil {
		return nil
	}
	return r.slice
}

// end ends r's slice bind, if any.
func (r *reservedPod) end() {
	if r != nil && r.slice != nil {
		r.slice.end()
	}
}

// reservedFor bounds how long a slice reserved by Reserve counts as in
// flight without its bind or Unreserve (a scheduler that never came back).
const reservedFor = 2 * time.Minute

func (s *Server) holdReserved(uid types.UID, r *reservedPod) {
	s.reservedMu.Lock()
	if s.reserved == nil {
		s.reserved = map[types.UID]*reservedPod{}
	}
	prev := s.reserved[uid]
	s.reserved[uid] = r
	s.reservedMu.Unlock()
	prev.end()
	if r.slice != nil {
		time.AfterFunc(reservedFor, r.slice.end)
	}
}

// popReserved forgets and returns what Reserve placed for uid (nil:
// nothing).
func (s *Server) popReserved(uid types.UID) *reservedPod {
	s.reservedMu.Lock()
	defer s.reservedMu.Unlock()
	r := s.reserved[uid]
	delete(s.reserved, uid)
	return r
}

// takeReserved returns what Reserve placed for uid on node (nil: nothing);
// its slice bind is now the bind's to end.
func (s *Server) takeReserved(uid types.UID, node string) *reservedPod {
	r := s.popReserved(uid)
	if r != nil && r.node != node {
		r.end()
		return nil
	}
	return r
}

// Unreserve drops what Reserve (or a failed bind) counted for the pod uid.
func (s *Server) Unreserve(uid types.UID) {
	s.state.Unreserve(uid)
	s.popReserved(uid).end()
}

// SharedAssignment returns the assignment recording use's shared slices,
// keeping the whole GPUs prev records.
func SharedAssignment(prev *api.Assignment, use *PodUse) *api.Assignment {
	a := api.NewAssignment()
	if prev != nil {
		for _, c := range prev.Containers {
			if len(c.GPUs) > 0 {
				a.Containers = append(a.Containers, api.ContainerAssignment{Name: c.Name, GPUs: c.GPUs})
			}
		}
	}
	// A container's slice of several GPUs is one SharedGPU, its GPUs by
	// index.
	for _, sh := range use.Shared {
		ref := api.GPURef{UUID: sh.UUID, Index: sh.Index}
		c := a.Container(sh.Container)
		if c == nil {
			a.Containers = append(a.Containers, api.ContainerAssignment{Name: sh.Container})
			c = &a.Containers[len(a.Containers)-1]
		}
		if c.Shared == nil {
			c.Shared = &api.SharedGPU{GPU: ref, MemoryMiB: sh.MemMiB, Cores: sh.Cores}
			continue
		}
		refs := append(c.Shared.GPUs(), ref)
		sort.Slice(refs, func(i, j int) bool { return refs[i].Index < refs[j].Index })
		c.Shared.GPU, c.Shared.Spread = refs[0], refs[1:]
	}
	return a
}

// PreemptArgs runs the preempt verb: per node, it keeps only the victims
// whose removal makes the pod fit at GPU level, and drops nodes where it
// would not fit even with all of them gone.
func (s *Server) PreemptArgs(ctx context.Context, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, error) {
	if args.Pod == nil {
		return nil, errors.New("preempt: the request names no pod")
	}
	if roomPlanned(args.Pod) {
		// Its room is planned (a gang's, or held by Tessera's preemption):
		// nothing more is evicted for it.
		return &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}, nil
	}
	d, err := ParseDemand(args.Pod)
	if err != nil {
		s.event(args.Pod, "InvalidGPURequest", "%v", err)
		return nil, err
	}
	victims := map[string][]types.UID{}
	for node, v := range args.NodeNameToMetaVictims {
		if v == nil {
			continue
		}
		for _, p := range v.Pods {
			if p != nil {
				victims[node] = append(victims[node], types.UID(p.UID))
			}
		}
		if _, ok := victims[node]; !ok {
			victims[node] = nil
		}
	}
	pdb := map[string]int64{}
	for node, v := range args.NodeNameToVictims {
		if v == nil {
			continue
		}
		pdb[node] = v.NumPDBViolations
		for _, p := range v.Pods {
			if p != nil {
				victims[node] = append(victims[node], p.UID)
			}
		}
		if _, ok := victims[node]; !ok {
			victims[node] = nil
		}
	}
	for node, v := range args.NodeNameToMetaVictims {
		if v != nil {
			pdb[node] = v.NumPDBViolations
		}
	}
	now := s.preemptNow()
	nodes := make([]string, 0, len(victims))
	for node := range victims {
		nodes = append(nodes, node)
	}
	sort.Strings(nodes)
	if s.roomBeingFreed(args.Pod, &d, nodes, now) {
		klog.FromContext(ctx).V(2).Info("Preemption: room is being freed for the pod already; nothing more preempted", "pod", klog.KObj(args.Pod), "nominated", args.Pod.Status.NominatedNodeName)
		return &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}, nil
	}
	cands := map[string]preemptCandidate{}
	for node, vs := range victims {
		st, _ := s.state.Node(node)
		var extra map[types.UID]bool
		var first []types.UID
		if s.quota != nil {
			// The node's extra members of elastic gangs are offered too,
			// and go first among pods of their priority (kube-scheduler
			// spares the pods that started first).
			first = s.quota.NodeExtras(args.Pod, st, vs)
			var ok bool
			offered := append(slices.Clone(vs), first...)
			if vs, extra, ok = s.quota.PreemptVictims(ctx, args.Pod, st, offered); !ok {
				continue
			}
		}
		kept, ok := Preempt(st, &d, vs, first)
		if !ok {
			continue
		}
		if s.quota != nil && !s.quota.AdmitsWithout(ctx, args.Pod, st, kept) {
			// The GPUs fit without some victims, but quota needs them
			// gone too (the pod's namespace is above its max).
			if !s.quota.AdmitsWithout(ctx, args.Pod, st, vs) {
				continue
			}
			kept = vs
		}
		if len(kept) == 0 {
			// The pod fits this node's GPUs as they are: kube-scheduler's
			// count disagrees only for a while (pods leaving still hold
			// their devices, a GPU is not offered again yet). Nothing is
			// preempted on any node: a node without victims would fail
			// kube-scheduler's whole preemption ("expected at least one
			// victim pod"), and one with victims elsewhere would evict
			// for room this node is about to give.
			klog.FromContext(ctx).V(2).Info("Preemption: the pod fits a node's GPUs without victims; nothing preempted", "pod", klog.KObj(args.Pod), "node", node)
			return &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: map[string]*extenderv1.MetaVictims{}}, nil
		}
		cands[node] = preemptCandidate{victims: kept, extra: extra, pdb: pdb[node]}
	}
	extrasFirst(cands, s.state.Node)
	s.answers.remember(args.Pod.UID, cands, now)
	res := &extenderv1.ExtenderPreemptionResult{NodeNameToMetaVictims: make(map[string]*extenderv1.MetaVictims, len(cands))}
	for node, c := range cands {
		mv := &extenderv1.MetaVictims{Pods: make([]*extenderv1.MetaPod, 0, len(c.victims)), NumPDBViolations: c.pdb}
		for _, uid := range c.victims {
			mv.Pods = append(mv.Pods, &extenderv1.MetaPod{UID: string(uid)})
		}
		res.NodeNameToMetaVictims[node] = mv
	}
	klog.FromContext(ctx).V(3).Info("Preemption", "pod", klog.KObj(args.Pod), "candidates", len(victims), "kept", len(res.NodeNameToMetaVictims))
	return res, nil
}
