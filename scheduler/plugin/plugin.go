// Package plugin is Tessera as a kube-scheduler framework plugin: a thin
// adapter that calls the extender's Server in process where kube-scheduler
// would call its HTTP verbs. What a GPU request means, which node fits and
// which is best stay in package extender; this package only maps the
// framework's extension points onto it:
//
//   - PreFilter asks the Server's filter once for every node the pod may
//     go to (by its taints, tolerations and required node affinity), and
//     hands kube-scheduler the nodes it passes, its shortlist, as the only
//     nodes to filter further. A pod whose shortlist all fails
//     kube-scheduler's other filters is tried again at once with every
//     node that fits (PostFilter), not preempted for.
//   - PreScore and Score give the Server's prioritize scores, scaled like
//     the extender entries' weights (deploy/extender/scheduler-config.yaml).
//   - Reserve counts the pod in the ledger in the scheduling cycle, so the
//     next pod sees its GPUs taken; Bind binds it as the bind verb does.
//
// Pods that ask for no Tessera resource are left to kube-scheduler's own
// plugins but for the CPU-only score.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
	"k8s.io/utils/clock"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	podelig "github.com/tessera-gpu/tessera/internal/eligible"
)

// Name is the plugin's name in a KubeSchedulerConfiguration.
const Name = "Tessera"

// Core is what the plugin asks of the extender (extender.Server).
type Core interface {
	FilterArgs(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult
	FilterAll(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult
	PrioritizeArgs(ctx context.Context, args *extenderv1.ExtenderArgs, cpuOnly bool) (extenderv1.HostPriorityList, error)
	Reserve(pod *corev1.Pod, node string) error
	Unreserve(uid types.UID)
	Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error
	RoomBeingFreed(pod *corev1.Pod, nodes []string) bool
}

var _ Core = (*extender.Server)(nil)

// Trust removes from a pod what its creator wrote in Tessera's name
// (podtrust.Filter).
type Trust interface {
	Pod(pod *corev1.Pod) []api.Ignored
}

// Activator puts a pod back in the active queue (framework.Handle).
type Activator interface {
	Activate(logger klog.Logger, pods map[string]*corev1.Pod)
}

// Score scales: an extender score step (0..10) is worth 10 × weight
// points in kube-scheduler; a plugin score (0..100) × weight. With the
// plugin's weight at the GPU entry's (200), GPU scores are the Server's
// times 10, and CPU-only scores (that entry's weight is 20) as they are.
const (
	gpuScale = framework.MaxNodeScore / extenderv1.MaxExtenderPriority
	cpuScale = 1
)

// wideFor is how long a pod whose shortlist failed is filtered with every
// node that fits.
const wideFor = time.Minute

// Plugin is Tessera's kube-scheduler plugin.
type Plugin struct {
	core  Core
	trust Trust
	ready func() bool
	// readyBy is when PreFilter stops waiting for the caches to sync and
	// answers errNotReady at once.
	readyBy  time.Time
	activate Activator
	clock    clock.PassiveClock

	mu   sync.Mutex
	wide map[types.UID]time.Time
}

var (
	_ framework.PreFilterPlugin  = (*Plugin)(nil)
	_ framework.PostFilterPlugin = (*Plugin)(nil)
	_ framework.PreScorePlugin   = (*Plugin)(nil)
	_ framework.ScorePlugin      = (*Plugin)(nil)
	_ framework.ReservePlugin    = (*Plugin)(nil)
	_ framework.BindPlugin       = (*Plugin)(nil)
)

// New returns the plugin over core. ready reports whether the extender's
// caches have synced.
func New(core Core, trust Trust, ready func() bool, activate Activator, clk clock.PassiveClock) *Plugin {
	return &Plugin{core: core, trust: trust, ready: ready, readyBy: clk.Now().Add(readyWait), activate: activate, clock: clk, wide: map[types.UID]time.Time{}}
}

// readyWait bounds PreFilter's wait for the extender's caches in the first
// moments of the process: they sync within seconds of its start, and
// kube-scheduler waits for its own caches likewise before its first cycle.
// Answering errNotReady at once logged an error for every GPU pod of the
// first seconds after a restart (each retried after a backoff). Past it
// (caches that never sync: RBAC, the API server) nothing waits, so that
// the scheduling loop is not slowed for other pods.
const readyWait = 15 * time.Second

// awaitReady reports whether the extender's caches have synced, waiting
// for them until readyBy.
func (p *Plugin) awaitReady(ctx context.Context) bool {
	if p.ready() {
		return true
	}
	left := p.readyBy.Sub(p.clock.Now())
	if left <= 0 {
		return false
	}
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, left, true, func(context.Context) (bool, error) {
		return p.ready(), nil
	})
	return err == nil
}

// Name implements framework.Plugin.
func (p *Plugin) Name() string { return Name }

// managed reports whether pod asks for a Tessera resource: the pods the
// extender entry's managedResources send to the extender.
func managed(pod *corev1.Pod) bool {
	has := func(cs []corev1.Container) bool {
		for i := range cs {
			for n := range cs[i].Resources.Requests {
				if api.IsTesseraResource(n) {
					return true
				}
			}
			for n := range cs[i].Resources.Limits {
				if api.IsTesseraResource(n) {
					return true
				}
			}
		}
		return false
	}
	return has(pod.Spec.Containers) || has(pod.Spec.InitContainers)
}

// cycle is what PreFilter leaves for the later points of one pod's cycle.
type cycle struct {
	// pod is the trusted copy the Server decided on.
	pod *corev1.Pod
	// narrowed: the shortlist left out nodes that fit.
	narrowed bool
	// scores are PreScore's, by node.
	scores map[string]int64
	// passed are the nodes PreFilter passed.
	passed []string
}

func (c *cycle) Clone() fwk.StateData { return c }

const stateKey fwk.StateKey = Name

func readCycle(state fwk.CycleState) *cycle {
	d, err := state.Read(stateKey)
	if err != nil {
		return nil
	}
	c, _ := d.(*cycle)
	return c
}

// trusted returns a copy of pod without what its creator wrote in
// Tessera's name.
func (p *Plugin) trusted(pod *corev1.Pod) *corev1.Pod {
	own := pod.DeepCopy()
	p.trust.Pod(own)
	return own
}

// errNotReady is the answer when the extender's caches have not synced
// within readyWait (the verbs' 503): the pod is tried again after a
// backoff.
var errNotReady = errors.New("tessera: the GPU ledger's caches have not synced yet")

// PreFilter implements framework.PreFilterPlugin.
func (p *Plugin) PreFilter(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) (*framework.PreFilterResult, *fwk.Status) {
	if !managed(pod) {
		return nil, fwk.NewStatus(fwk.Skip)
	}
	if !p.awaitReady(ctx) {
		return nil, fwk.AsStatus(errNotReady)
	}
	own := p.trusted(pod)
	names := eligible(own, nodes)
	args := &extenderv1.ExtenderArgs{Pod: own, NodeNames: &names}
	var res *extenderv1.ExtenderFilterResult
	if p.isWide(pod.UID) {
		res = p.core.FilterAll(ctx, args)
	} else {
		res = p.core.FilterArgs(ctx, args)
	}
	if res.Error != "" {
		// As kube-scheduler treats an extender's error: the pod is
		// retried after a backoff.
		return nil, fwk.AsStatus(errors.New(res.Error))
	}
	var passed []string
	if res.NodeNames != nil {
		passed = *res.NodeNames
	}
	if len(passed) == 0 {
		// Unresolvable: kube-scheduler's preemption counts GPUs per node,
		// not per GPU; Tessera's preemptor makes room for pods it found
		// no node for (docs/extender.md).
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, summary(len(nodes), len(names), res))
	}
	fitting := len(names) - len(res.FailedNodes) - len(res.FailedAndUnresolvableNodes)
	state.Write(stateKey, &cycle{pod: own, narrowed: len(passed) < fitting, passed: passed})
	return &framework.PreFilterResult{NodeNames: sets.New(passed...)}, nil
}

// PreFilterExtensions implements framework.PreFilterPlugin.
func (p *Plugin) PreFilterExtensions() framework.PreFilterExtensions { return nil }

// eligible names the nodes pod may be scheduled on by their cordon,
// taints and labels (package eligible: kube-scheduler's NodeUnschedulable,
// TaintToleration and NodeAffinity filters, through the same helpers), so
// that the shortlist is taken among nodes the pod may go to.
func eligible(pod *corev1.Pod, nodes []fwk.NodeInfo) []string {
	allowed := podelig.For(pod)
	out := make([]string, 0, len(nodes))
	for _, ni := range nodes {
		if n := ni.Node(); allowed.Allows(n) {
			out = append(out, n.Name)
		}
	}
	return out
}

// summary is the reason PreFilter gives when no node fits: the Server's
// reasons with their node counts, most frequent first.
func summary(all, eligible int, res *extenderv1.ExtenderFilterResult) string {
	counts := map[string]int{}
	for _, m := range res.FailedNodes {
		counts[m]++
	}
	for _, m := range res.FailedAndUnresolvableNodes {
		counts[m]++
	}
	msgs := make([]string, 0, len(counts))
	for m := range counts {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool {
		if counts[msgs[i]] != counts[msgs[j]] {
			return counts[msgs[i]] > counts[msgs[j]]
		}
		return msgs[i] < msgs[j]
	})
	var b strings.Builder
	if eligible < all {
		fmt.Fprintf(&b, "%d node(s) had untolerated taints, were cordoned or did not match the pod's node affinity", all-eligible)
	}
	for _, m := range msgs {
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%d node(s): %s", counts[m], m)
	}
	if b.Len() == 0 {
		return "tessera: no node"
	}
	return b.String()
}

// PostFilter implements framework.PostFilterPlugin, before
// DefaultPreemption. A pod whose room is being freed (planned for it, or
// pods leaving a node it fits once they are gone) is not preempted for
// again: DefaultPreemption would choose victims by GPU count, blind to
// which GPUs (seen on make demo: a 4-GPU NVLink pod that Tessera had made
// room for in one clique, while its victims still held their devices, had
// two more pods of the other clique evicted). A pod whose shortlist
// kube-scheduler's other filters all refused goes back to the active queue
// to be filtered with every node that fits, before any preemption.
func (p *Plugin) PostFilter(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, _ framework.NodeToStatusReader) (*framework.PostFilterResult, *fwk.Status) {
	c := readCycle(state)
	if c != nil && p.core.RoomBeingFreed(c.pod, c.passed) {
		return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "tessera: room for the pod is being freed (pods evicted for it are leaving); nothing more is preempted for it")
	}
	if c == nil || !c.narrowed {
		return nil, fwk.NewStatus(fwk.Unschedulable)
	}
	p.setWide(pod.UID)
	p.activate.Activate(klog.FromContext(ctx), map[string]*corev1.Pod{pod.Namespace + "/" + pod.Name: pod})
	return nil, fwk.NewStatus(fwk.UnschedulableAndUnresolvable, "tessera: the nodes that place the pod's GPUs best failed other filters; trying again with every node they fit")
}

func (p *Plugin) isWide(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	until, ok := p.wide[uid]
	if ok && p.clock.Now().After(until) {
		delete(p.wide, uid)
		return false
	}
	return ok
}

func (p *Plugin) setWide(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.clock.Now()
	for u, until := range p.wide {
		if now.After(until) {
			delete(p.wide, u)
		}
	}
	p.wide[uid] = now.Add(wideFor)
}

func (p *Plugin) dropWide(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.wide, uid)
}

// PreScore implements framework.PreScorePlugin: the Server scores the
// nodes left, GPU pods by their placement and CPU-only pods by what they
// leave of GPU nodes' CPU.
func (p *Plugin) PreScore(ctx context.Context, state fwk.CycleState, pod *corev1.Pod, nodes []fwk.NodeInfo) *fwk.Status {
	c := readCycle(state)
	cpuOnly := c == nil
	if cpuOnly {
		if !p.ready() {
			return fwk.NewStatus(fwk.Skip) // as the ignorable CPU entry
		}
		c = &cycle{pod: p.trusted(pod)}
		state.Write(stateKey, c)
	}
	names := make([]string, 0, len(nodes))
	for _, ni := range nodes {
		if n := ni.Node(); n != nil {
			names = append(names, n.Name)
		}
	}
	list, err := p.core.PrioritizeArgs(ctx, &extenderv1.ExtenderArgs{Pod: c.pod, NodeNames: &names}, cpuOnly)
	if err != nil {
		if cpuOnly {
			klog.FromContext(ctx).V(2).Info("CPU-only score skipped", "pod", klog.KObj(pod), "err", err)
			return fwk.NewStatus(fwk.Skip)
		}
		return fwk.AsStatus(err)
	}
	scale := int64(gpuScale)
	if cpuOnly {
		scale = cpuScale
	}
	c.scores = make(map[string]int64, len(list))
	for _, h := range list {
		c.scores[h.Host] = h.Score * scale
	}
	return nil
}

// Score implements framework.ScorePlugin.
func (p *Plugin) Score(_ context.Context, state fwk.CycleState, _ *corev1.Pod, ni fwk.NodeInfo) (int64, *fwk.Status) {
	c := readCycle(state)
	if c == nil || ni.Node() == nil {
		return 0, nil
	}
	return c.scores[ni.Node().Name], nil
}

// ScoreExtensions implements framework.ScorePlugin.
func (p *Plugin) ScoreExtensions() framework.ScoreExtensions { return nil }

// Reserve implements framework.ReservePlugin: the pod's GPUs on node are
// counted in the ledger before its cycle ends.
func (p *Plugin) Reserve(_ context.Context, state fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	c := readCycle(state)
	if c == nil || !managed(pod) {
		return nil
	}
	p.dropWide(pod.UID)
	if err := p.core.Reserve(c.pod, node); err != nil {
		return fwk.NewStatus(fwk.Unschedulable, err.Error())
	}
	return nil
}

// Unreserve implements framework.ReservePlugin.
func (p *Plugin) Unreserve(_ context.Context, _ fwk.CycleState, pod *corev1.Pod, _ string) {
	if managed(pod) {
		p.core.Unreserve(pod.UID)
	}
}

// Bind implements framework.BindPlugin: as the extender's bind verb
// (the assignment of a shared pod written first); other pods are left to
// the next bind plugin.
func (p *Plugin) Bind(ctx context.Context, _ fwk.CycleState, pod *corev1.Pod, node string) *fwk.Status {
	if !managed(pod) {
		return fwk.NewStatus(fwk.Skip)
	}
	err := p.core.Bind(ctx, &extenderv1.ExtenderBindingArgs{PodName: pod.Name, PodNamespace: pod.Namespace, PodUID: pod.UID, Node: node})
	if err != nil {
		return fwk.AsStatus(err)
	}
	return nil
}
