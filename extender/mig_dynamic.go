package extender

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
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
	// has not recorded yet: any GPU may be its, so none is free.
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
// with a GPU without a tenant (DecideMIGRepartition); the node agent
// repartitions it and publishes the new instances, and the pod then fits.
type MIGDynamic struct {
	Cache  *Cache
	Pods   func() ([]*corev1.Pod, error)
	Nodes  func() ([]*corev1.Node, error)
	Client kubernetes.Interface
	Events EventRecorder
	// Cooldown is how long a pod or node asked for is left alone
	// (default 30s): the node agent needs time to serve and publish.
	Cooldown time.Duration
	Now      func() time.Time

	mu     sync.Mutex
	asked  map[types.UID]time.Time
	nodeAt map[string]time.Time
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
	value string
}

// Sync makes one pass: it decides under its lock, then writes the
// requests outside it.
func (d *MIGDynamic) Sync(ctx context.Context) error {
	pods, err := d.Pods()
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	var askers []*corev1.Pod
	demands := map[types.UID]map[string]int{}
	for _, p := range pods {
		if !gpureq.PendingUnschedulable(p) {
			continue
		}
		dm, err := ParseDemand(p)
		if err != nil || len(dm.MIG) == 0 {
			continue
		}
		askers = append(askers, p)
		demands[p.UID] = dm.MIG
	}
	if len(askers) == 0 {
		return nil
	}
	nodes, err := d.Nodes()
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	writes := d.decide(askers, demands, nodes)
	var errs []error
	for _, w := range writes {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationMIGLayoutRequest: w.value}}})
		if err == nil {
			_, err = d.Client.CoreV1().Nodes().Patch(ctx, w.dec.Node, types.MergePatchType, patch, metav1.PatchOptions{})
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: writing the MIG layout request: %w", w.dec.Node, err))
			continue
		}
		klog.FromContext(ctx).Info("MIG repartition requested", "pod", klog.KObj(w.pod), "node", w.dec.Node, "gpu", w.dec.Index, "layout", w.dec.GPU.Instances, "destroyed", w.dec.Destroyed)
		if d.Events != nil {
			d.Events.Eventf(w.pod, corev1.EventTypeNormal, "MIGRepartitionRequested", "no node has the MIG instances free: node %s was asked to repartition GPU %d (%s), which has no tenant", w.dec.Node, w.dec.Index, w.dec.GPU.UUID)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d MIG layout requests failed: %w", len(errs), len(writes), errs[0])
	}
	return nil
}

func (d *MIGDynamic) decide(askers []*corev1.Pod, demands map[types.UID]map[string]int, nodes []*corev1.Node) []migWrite {
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
	}
	snap := d.Cache.Snapshot()
	byName := make(map[string]*corev1.Node, len(nodes))
	for _, n := range nodes {
		byName[n.Name] = n
	}
	views := make([]MIGNodeView, 0, len(nodes))
	gens := map[string]int64{}
	for _, n := range nodes {
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		if !ok || err != nil {
			continue
		}
		v := MIGNodeView{Name: n.Name, GPUs: inv.GPUs, Used: map[string]bool{}}
		if at, ok := d.nodeAt[n.Name]; ok && now.Sub(at) < cool {
			v.Busy = true
		}
		if value, ok := n.Annotations[api.AnnotationMIGLayoutRequest]; ok {
			if req, err := api.ParseMIGLayoutRequest(value); err == nil {
				gens[n.Name] = req.Generation
				st, err := api.ParseMIGLayoutStatus(n.Annotations[api.AnnotationMIGLayoutStatus])
				if err != nil || st.Generation != req.Generation {
					v.Busy = true // not served yet
				}
			}
		}
		if s, ok := snap[n.Name]; ok {
			for _, u := range s.Pods {
				for _, uuid := range u.MIG {
					v.Used[uuid] = true
				}
				if len(u.MIGPending) > 0 {
					v.Pending = true
				}
			}
		} else {
			continue
		}
		views = append(views, v)
	}
	sort.Slice(askers, func(i, j int) bool {
		a, b := corev1helpers.PodPriority(askers[i]), corev1helpers.PodPriority(askers[j])
		if a != b {
			return a > b
		}
		return askers[i].CreationTimestamp.Before(&askers[j].CreationTimestamp)
	})
	var out []migWrite
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
			continue
		}
		req := &api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: gens[dec.Node] + 1, GPUs: []api.MIGLayoutGPU{dec.GPU}}
		value, err := api.EncodeMIGLayoutRequest(req)
		if err != nil {
			continue
		}
		d.asked[p.UID] = now
		d.nodeAt[dec.Node] = now
		for i := range views {
			if views[i].Name == dec.Node {
				views[i].Busy = true
			}
		}
		out = append(out, migWrite{pod: p, dec: dec, value: value})
	}
	for uid, at := range d.asked {
		if now.Sub(at) > 10*cool {
			delete(d.asked, uid)
		}
	}
	return out
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
