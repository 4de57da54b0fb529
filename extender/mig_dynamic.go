package extender

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/mig"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// MIGNodeView is what dynamic MIG knows of a node: its GPUs from the
// inventory, the MIG instances pods hold there, and whether it may be
// asked now.
type MIGNodeView struct {
	Name string
	GPUs []api.InventoryGPU
	// Used are the MIG UUIDs pods hold (recorded by the node agent).
	Used map[string]bool
	// Pending is true when a pod on the node holds MIG instances the agent
	// has not recorded yet, or recorded instances the node's inventory does
	// not list: any GPU may be its, so none is free.
	Pending bool
	// Busy is true while an earlier request of the node is not served.
	Busy bool
}

// MIGRepartition is a decision: repartition GPU of Node to GPU.Instances.
type MIGRepartition struct {
	Node string
	// Index is the GPU's index on the node.
	Index int
	GPU   api.MIGLayoutGPU
	// Destroyed is the number of the GPU's free instances the layout does
	// not keep.
	Destroyed int
}

// DecideMIGRepartition chooses a GPU without a tenant whose new layout
// holds every instance demand asks (per profile), all on that GPU: a GPU
// in MIG mode, healthy, on a node not busy and with no unrecorded MIG
// pods, none of whose instances a pod holds. The layout is built with
// allocator/mig's dynamic, fragmentation-aware Placer: a free instance
// of the profile is taken, else a new one in unpartitioned slices, else
// the GPU's free instances are replaced. Of the feasible GPUs the one
// destroying fewest instances wins, then the one leaving the least
// expected unplaceable demand, then node name and GPU index. ok is false
// when no GPU can take demand.
func DecideMIGRepartition(demand map[string]int, nodes []MIGNodeView) (MIGRepartition, bool) {
	if len(demand) == 0 {
		return MIGRepartition{}, false
	}
	var best MIGRepartition
	var bestUnpl float64
	found := false
	for _, n := range nodes {
		if n.Busy || n.Pending {
			continue
		}
		for _, g := range n.GPUs {
			if g.MIG == nil || !g.Healthy || tenanted(g, n.Used) {
				continue
			}
			r, unpl, ok := layoutFor(demand, g)
			if !ok {
				continue
			}
			r.Node = n.Name
			if !found || r.Destroyed < best.Destroyed ||
				(r.Destroyed == best.Destroyed && unpl < bestUnpl-1e-12) {
				best, bestUnpl, found = r, unpl, true
			}
		}
	}
	return best, found
}

func tenanted(g api.InventoryGPU, used map[string]bool) bool {
	for _, in := range g.MIG.Instances {
		if used[in.UUID] || !in.Healthy {
			return true
		}
	}
	return false
}

// layoutFor places demand on GPU g; unpl is the expected unplaceable
// demand of the slices it leaves free.
func layoutFor(demand map[string]int, g api.InventoryGPU) (MIGRepartition, float64, bool) {
	model, ok := mig.Lookup(g.Model)
	if !ok {
		return MIGRepartition{}, 0, false
	}
	l := mig.Layout{Model: model}
	for _, in := range g.MIG.Instances {
		l.Instances = append(l.Instances, mig.Instance{Profile: in.Profile, Placement: in.MIGPlacement})
	}
	if l.Validate() != nil {
		return MIGRepartition{}, 0, false
	}
	before := len(l.Instances)
	placed, created, ok := placeAll(demand, l)
	if ok && !created {
		return MIGRepartition{}, 0, false // the GPU has them free as it is
	}
	kept := keptOf(placed, g)
	if !ok {
		kept = -1
	}
	// The GPU has no tenant: its free instances in the way may go. Try
	// each placement of each asked profile with the instances it overlaps
	// removed, and the GPU emptied; keep the layout destroying fewest.
	var tries []mig.Layout
	for p := range demand {
		prof, found := model.Profile(p)
		if !found {
			return MIGRepartition{}, 0, false
		}
		for _, st := range prof.Starts {
			t := mig.Layout{Model: model}
			for _, in := range l.Instances {
				if in.Placement.Start+in.Placement.Size <= st || st+prof.Size <= in.Placement.Start {
					t.Instances = append(t.Instances, in)
				}
			}
			tries = append(tries, t)
		}
	}
	tries = append(tries, mig.Layout{Model: model})
	for _, t := range tries {
		if try, _, ok := placeAll(demand, t); ok {
			if k := keptOf(try, g); k > kept {
				placed, kept = try, k
			}
		}
	}
	if kept < 0 {
		return MIGRepartition{}, 0, false
	}
	l = placed
	sort.Slice(l.Instances, func(i, j int) bool { return l.Instances[i].Placement.Start < l.Instances[j].Placement.Start })
	out := MIGRepartition{Index: g.Index, GPU: api.MIGLayoutGPU{UUID: g.UUID, Instances: []api.MIGLayoutInstance{}}, Destroyed: before - kept}
	for _, in := range l.Instances {
		out.GPU.Instances = append(out.GPU.Instances, api.MIGLayoutInstance{Profile: in.Profile, MIGPlacement: in.Placement})
	}
	return out, mig.UniformMeter(model).Unplaceable(^l.Occupied()), true
}

// placeAll places every instance of demand on l with the dynamic,
// fragmentation-aware Placer. ok is false when one does not fit; created
// is false when every one was an existing free instance.
func placeAll(demand map[string]int, l mig.Layout) (mig.Layout, bool, bool) {
	l.Instances = append([]mig.Instance(nil), l.Instances...)
	pl := mig.Placer{Mode: mig.Dynamic, Strategy: mig.FragAware}
	created := false
	for _, p := range sortedProfiles(demand) {
		for k := 0; k < demand[p]; k++ {
			c, ok := pl.Place(l, p)
			if !ok {
				return l, created, false
			}
			switch {
			case c.Existing:
				for i := range l.Instances {
					if l.Instances[i].Placement == c.Placement {
						l.Instances[i].Used = true
					}
				}
			case c.Repartition:
				l.Instances = []mig.Instance{{Profile: p, Placement: c.Placement, Used: true}}
				created = true
			default:
				l.Instances = append(l.Instances, mig.Instance{Profile: p, Placement: c.Placement, Used: true})
				created = true
			}
		}
	}
	return l, created, true
}

// keptOf counts the instances of GPU g that layout l keeps as they are.
func keptOf(l mig.Layout, g api.InventoryGPU) int {
	kept := 0
	for _, in := range l.Instances {
		for _, old := range g.MIG.Instances {
			if old.Profile == in.Profile && old.MIGPlacement == in.Placement {
				kept++
			}
		}
	}
	return kept
}

// MIGDynamic is the extender's side of dynamic MIG (--dynamic-mig): for a
// pending pod kube-scheduler found unschedulable that asks MIG instances,
// when no node has them free, it writes a MIG layout request on a node
// whose agent serves them (its inventory's DynamicMIG) with a GPU without
// a tenant (DecideMIGRepartition); the node agent repartitions it and
// publishes the new instances, and the pod then fits. A request whose pod
// is gone or was placed, or whose node's agent does not serve requests,
// is withdrawn (the annotation removed); the pod is told by Events which
// node was asked, when that node has not answered yet, and when no node
// it may run on serves dynamic MIG.
type MIGDynamic struct {
	Cache  *Cache
	Pods   func() ([]*corev1.Pod, error)
	Nodes  func() ([]*corev1.Node, error)
	Client kubernetes.Interface
	Events EventRecorder
	// Cooldown is how long a pod or node asked for is left alone
	// (default 30s): the node agent needs time to serve and publish. A
	// request not answered after it is named in an Event on its pod.
	Cooldown time.Duration
	Now      func() time.Time

	mu      sync.Mutex
	asked   map[types.UID]time.Time
	nodeAt  map[string]time.Time
	lastGen map[string]int64     // the last generation written per node
	seen    map[string]time.Time // node/generation -> when first seen unanswered
	told    map[string]time.Time // what a pod was told (a key per Event), and when
}

// Run makes a pass every period until ctx ends.
func (d *MIGDynamic) Run(ctx context.Context, period time.Duration) {
	logger := klog.FromContext(ctx).WithName("dynamic-mig")
	ctx = klog.NewContext(ctx, logger)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		if err := d.Sync(ctx); err != nil {
			logger.Info("Dynamic MIG pass failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

type migWrite struct {
	pod   *corev1.Pod
	dec   MIGRepartition
	gen   int64
	value string
}

// migWithdraw is a request to remove from node: value is the annotation
// as read (the removal is conditional on it), why says why.
type migWithdraw struct {
	node  *corev1.Node
	value string
	why   string
}

// migTell is an Event for a pod.
type migTell struct {
	pod                     *corev1.Pod
	eventtype, reason, text string
}

type migPlan struct {
	withdraw []migWithdraw
	writes   []migWrite
	tells    []migTell
}

// Sync makes one pass: it decides under its lock, then withdraws and
// writes the requests outside it.
func (d *MIGDynamic) Sync(ctx context.Context) error {
	pods, err := d.Pods()
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	nodes, err := d.Nodes()
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	return d.carry(ctx, d.decide(pods, nodes))
}

// carry withdraws and writes what plan says, and tells the pods.
func (d *MIGDynamic) carry(ctx context.Context, plan migPlan) error {
	logger := klog.FromContext(ctx)
	var errs []error
	for _, w := range plan.withdraw {
		// Removed only if it is still the value read: a newer request
		// stays.
		path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(api.AnnotationMIGLayoutRequest, "~", "~0"), "/", "~1")
		patch, err := json.Marshal([]map[string]any{{"op": "test", "path": path, "value": w.value}, {"op": "remove", "path": path}})
		if err == nil {
			_, err = d.Client.CoreV1().Nodes().Patch(ctx, w.node.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: withdrawing the MIG layout request: %w", w.node.Name, err))
			continue
		}
		logger.Info("MIG layout request withdrawn", "node", klog.KObj(w.node), "why", w.why)
		if d.Events != nil {
			d.Events.Eventf(w.node, corev1.EventTypeNormal, "MIGRepartitionWithdrawn", "MIG layout request withdrawn: %s", w.why)
		}
	}
	for _, w := range plan.writes {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationMIGLayoutRequest: w.value}}})
		if err == nil {
			_, err = d.Client.CoreV1().Nodes().Patch(ctx, w.dec.Node, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: writing the MIG layout request: %w", w.dec.Node, err))
			continue
		}
		logger.Info("MIG repartition requested", "pod", klog.KObj(w.pod), "node", w.dec.Node, "gpu", w.dec.Index, "layout", w.dec.GPU.Instances, "destroyed", w.dec.Destroyed, "generation", w.gen)
		if d.Events != nil {
			d.Events.Eventf(w.pod, corev1.EventTypeNormal, "MIGRepartitionRequested", "no node has the MIG instances free: node %s was asked to repartition GPU %d (%s), which has no tenant (MIG layout request %d); the pod waits for that node's agent to answer", w.dec.Node, w.dec.Index, w.dec.GPU.UUID, w.gen)
		}
	}
	if d.Events != nil {
		for _, t := range plan.tells {
			d.Events.Eventf(t.pod, t.eventtype, t.reason, "%s", t.text)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d MIG layout request writes failed: %w", len(errs), len(plan.withdraw)+len(plan.writes), errs[0])
	}
	return nil
}

// migAsker reports whether dynamic MIG may act for p: pending, found
// unschedulable by kube-scheduler, asking MIG instances.
func migAsker(p *corev1.Pod) (map[string]int, bool) {
	if !gpureq.PendingUnschedulable(p) {
		return nil, false
	}
	dm, err := ParseDemand(p)
	if err != nil || len(dm.MIG) == 0 {
		return nil, false
	}
	return dm.MIG, true
}

func (d *MIGDynamic) decide(pods []*corev1.Pod, nodes []*corev1.Node) migPlan {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.Now != nil {
		now = d.Now()
	}
	cool := d.Cooldown
	if cool <= 0 {
		cool = 30 * time.Second
	}
	if d.asked == nil {
		d.asked, d.nodeAt = map[types.UID]time.Time{}, map[string]time.Time{}
		d.lastGen, d.seen, d.told = map[string]int64{}, map[string]time.Time{}, map[string]time.Time{}
	}
	var plan migPlan
	// tell adds an Event for pod once per key.
	tell := func(pod *corev1.Pod, key, eventtype, reason, format string, args ...any) {
		key = string(pod.UID) + "/" + key
		if _, done := d.told[key]; done {
			return
		}
		d.told[key] = now
		plan.tells = append(plan.tells, migTell{pod: pod, eventtype: eventtype, reason: reason, text: fmt.Sprintf(format, args...)})
	}
	byKey := make(map[string]*corev1.Pod, len(pods))
	var askers []*corev1.Pod
	demands := map[types.UID]map[string]int{}
	for _, p := range pods {
		byKey[p.Namespace+"/"+p.Name] = p
		if dm, ok := migAsker(p); ok {
			askers = append(askers, p)
			demands[p.UID] = dm
		}
	}
	snap := d.Cache.Snapshot()
	byName := make(map[string]*corev1.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	views := make([]MIGNodeView, 0, len(nodes))
	var unserved []string // nodes with GPUs in MIG mode whose agent serves no request
	gens := map[string]int64{}
	seen := map[string]bool{}
	for _, n := range nodes {
		gens[n.Name] = d.lastGen[n.Name]
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		invOK := ok && err == nil
		serves := invOK && inv.DynamicMIG
		st, stErr := api.ParseMIGLayoutStatus(n.Annotations[api.AnnotationMIGLayoutStatus])
		if stErr == nil {
			gens[n.Name] = max(gens[n.Name], st.Generation)
		}
		busy := false
		if value, has := n.Annotations[api.AnnotationMIGLayoutRequest]; has {
			req, reqErr := api.ParseMIGLayoutRequest(value)
			why := ""
			switch {
			case reqErr != nil:
				why = reqErr.Error()
			case invOK && !serves:
				why = fmt.Sprintf("request %d for pod %s: the node's agent does not serve MIG layout requests (tessera-node without --dynamic-mig)", req.Generation, req.Pod)
			default:
				if u := gpureq.NotWaiting(req.Pod.String(), req.Pod.UID, byKey[req.Pod.String()]); u != "" {
					why = fmt.Sprintf("request %d: %s", req.Generation, u)
				}
			}
			if req != nil {
				gens[n.Name] = max(gens[n.Name], req.Generation)
			}
			if why != "" {
				plan.withdraw = append(plan.withdraw, migWithdraw{node: n, value: value, why: why})
			} else {
				answered := stErr == nil && st.Generation == req.Generation
				pod := byKey[req.Pod.String()]
				key := fmt.Sprintf("%s/%d", n.Name, req.Generation)
				if !answered {
					busy = true // not served yet
					seen[key] = true
					since, ok := d.seen[key]
					if !ok {
						since = now
						if at, asked := d.asked[pod.UID]; asked && d.lastGen[n.Name] == req.Generation {
							since = at
						}
						d.seen[key] = since
					}
					if now.Sub(since) >= cool {
						tell(pod, "unanswered/"+key, corev1.EventTypeWarning, "MIGRepartitionUnanswered",
							"node %s was asked %s ago to repartition GPU %s for this pod (MIG layout request %d) and has not answered yet; the pod waits for it (is the node's tessera-node agent running?)",
							n.Name, now.Sub(since).Round(time.Second), migRequestGPUs(req), req.Generation)
					}
				} else if st.State != api.MIGLayoutApplied {
					tell(pod, fmt.Sprintf("answer/%s/%s/%s", key, st.State, st.Message), corev1.EventTypeWarning, "MIGRepartition"+string(st.State),
						"node %s answered MIG layout request %d: %s: %s", n.Name, req.Generation, st.State, st.Message)
				}
			}
		}
		if !invOK || !hasMIGGPU(inv) {
			continue
		}
		if !serves {
			unserved = append(unserved, n.Name)
			continue
		}
		v := MIGNodeView{Name: n.Name, GPUs: inv.GPUs, Used: map[string]bool{}, Busy: busy}
		if at, ok := d.nodeAt[n.Name]; ok && now.Sub(at) < cool {
			v.Busy = true
		}
		s, ok := snap[n.Name]
		if !ok {
			continue
		}
		have := map[string]bool{}
		for _, g := range inv.GPUs {
			if g.MIG != nil {
				for _, in := range g.MIG.Instances {
					have[in.UUID] = true
				}
			}
		}
		for _, u := range s.Pods {
			for _, uuid := range u.MIG {
				v.Used[uuid] = true
				if !have[uuid] {
					// A pod holds an instance the node does not list (destroyed
					// out of band, a GPU reset): any GPU may be its.
					v.Pending = true
				}
			}
			if len(u.MIGPending) > 0 {
				v.Pending = true
			}
		}
		views = append(views, v)
	}
	for key := range d.seen {
		if !seen[key] {
			delete(d.seen, key)
		}
	}
	sort.Slice(askers, func(i, j int) bool {
		a, b := corev1helpers.PodPriority(askers[i]), corev1helpers.PodPriority(askers[j])
		if a != b {
			return a > b
		}
		return askers[i].CreationTimestamp.Before(&askers[j].CreationTimestamp)
	})
	for _, p := range askers {
		if at, ok := d.asked[p.UID]; ok && now.Sub(at) < cool {
			continue
		}
		if migFitsSomewhere(demands[p.UID], snap) {
			continue // kube-scheduler will place it as the nodes are
		}
		// Only nodes the pod may run on: its required node affinity and
		// node selector, taints it tolerates, not cordoned.
		allowed := eligible.For(p)
		may := make([]MIGNodeView, 0, len(views))
		for _, v := range views {
			if allowed.Allows(byName[v.Name]) {
				may = append(may, v)
			}
		}
		dec, ok := DecideMIGRepartition(demands[p.UID], may)
		if !ok {
			if len(may) == 0 {
				var names []string
				for _, n := range unserved {
					if allowed.Allows(byName[n]) {
						names = append(names, n)
					}
				}
				if len(names) > 0 {
					tell(p, "unavailable", corev1.EventTypeWarning, "MIGRepartitionUnavailable",
						"no node has the MIG instances free, and no node the pod may run on serves dynamic MIG: the agents of %s (GPUs in MIG mode) run without --dynamic-mig, so none is asked to repartition", strings.Join(names, ", "))
				}
			}
			continue
		}
		gen := gens[dec.Node] + 1
		req := &api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: gen, GPUs: []api.MIGLayoutGPU{dec.GPU},
			Pod: &api.MIGLayoutPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID)}}
		value, err := api.EncodeMIGLayoutRequest(req)
		if err != nil {
			continue
		}
		d.asked[p.UID] = now
		d.nodeAt[dec.Node] = now
		d.lastGen[dec.Node] = gen
		gens[dec.Node] = gen
		for i := range views {
			if views[i].Name == dec.Node {
				views[i].Busy = true
			}
		}
		plan.writes = append(plan.writes, migWrite{pod: p, dec: dec, gen: gen, value: value})
	}
	for uid, at := range d.asked {
		if now.Sub(at) > 10*cool {
			delete(d.asked, uid)
		}
	}
	for key, at := range d.told {
		if now.Sub(at) > 10*cool {
			delete(d.told, key)
		}
	}
	return plan
}

// hasMIGGPU reports whether a node has a GPU in MIG mode.
func hasMIGGPU(inv *api.GPUInventory) bool {
	for _, g := range inv.GPUs {
		if g.MIG != nil {
			return true
		}
	}
	return false
}

// migRequestGPUs names a request's GPUs by UUID.
func migRequestGPUs(req *api.MIGLayoutRequest) string {
	var out []string
	for _, g := range req.GPUs {
		out = append(out, g.UUID)
	}
	return strings.Join(out, ", ")
}

// migFitsSomewhere reports whether a node has demand's instances free now.
func migFitsSomewhere(demand map[string]int, snap map[string]*NodeState) bool {
	for _, s := range snap {
		if s.mig == nil {
			continue
		}
		fits := true
		for p, n := range demand {
			if s.mig.free(p) < n {
				fits = false
				break
			}
		}
		if fits {
			return true
		}
	}
	return false
}
