package extender

import (
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Cache is the extender's ledger: the nodes' GPUs and what pods and
// reservations use on them. It is rebuilt from informer events; a
// reservation made at bind is counted at once and kept until the informer
// shows the pod bound with its assignment, so no GPU is double-booked in
// between. All methods are safe for concurrent use; NodeStates handed out
// are immutable.
type Cache struct {
	mu     sync.RWMutex
	nodes  map[string]*NodeInfo
	pods   map[types.UID]*PodUse // bound pods, from the informer
	byNode map[string]map[types.UID]struct{}
	// reservations are placements decided at bind, by pod UID.
	reservations map[types.UID]*PodUse
	states       map[string]*NodeState
	// ignoreNUMA drops the nodes' NUMA reports (IgnoreNUMA).
	ignoreNUMA bool
}

// IgnoreNUMA makes the cache drop every node's NUMA report
// (api.AnnotationNUMATopology), so that no pod is held to NUMA alignment:
// tessera-extender --numa-fit=false. Call it before the first SetNode.
func (c *Cache) IgnoreNUMA() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ignoreNUMA = true
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{
		nodes:        map[string]*NodeInfo{},
		pods:         map[types.UID]*PodUse{},
		byNode:       map[string]map[types.UID]struct{}{},
		reservations: map[types.UID]*PodUse{},
		states:       map[string]*NodeState{},
	}
}

// rebuild recomputes the state of node name. Callers hold mu.
func (c *Cache) rebuild(name string) {
	info, ok := c.nodes[name]
	if !ok {
		delete(c.states, name)
		return
	}
	var uses []*PodUse
	for uid := range c.byNode[name] {
		if _, reserved := c.reservations[uid]; reserved {
			continue // the reservation is counted instead
		}
		uses = append(uses, c.pods[uid])
	}
	for _, r := range c.reservations {
		if r.Node == name {
			uses = append(uses, r)
		}
	}
	c.states[name] = BuildNodeState(info, uses)
}

// SetNode adds or updates a node.
func (c *Cache) SetNode(node *corev1.Node) {
	info := NewNodeInfo(node)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ignoreNUMA {
		info.NUMA, info.NUMAErr = nil, nil
	}
	c.nodes[node.Name] = info
	c.rebuild(node.Name)
}

// DeleteNode removes a node (its pods stay until they are deleted).
func (c *Cache) DeleteNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.nodes, name)
	c.rebuild(name)
}

// SetPod adds or updates a pod. Pods not bound to a node, or finished, are
// not counted. It returns the pod's use (nil when not counted), so that the
// caller can report a malformed assignment.
func (c *Cache) SetPod(pod *corev1.Pod) *PodUse {
	var u *PodUse
	switch {
	case gpureq.Terminal(pod):
	case pod.Spec.NodeName != "":
		u = NewPodUse(pod)
	default:
		// A gang member planned but not bound holds its planned place.
		if plan, ok, err := api.GetGangPlan(pod.Annotations); ok && err == nil {
			u = PlannedPodUse(pod, plan)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removePodLocked(pod.UID)
	if r, ok := c.reservations[pod.UID]; ok && reservationSeen(r, pod, u) {
		delete(c.reservations, pod.UID)
		c.rebuild(r.Node)
	}
	if u == nil {
		return nil
	}
	c.pods[pod.UID] = u
	set := c.byNode[u.Node]
	if set == nil {
		set = map[types.UID]struct{}{}
		c.byNode[u.Node] = set
	}
	set[pod.UID] = struct{}{}
	c.rebuild(u.Node)
	return u
}

// reservationSeen reports whether the informer's view of a pod makes its
// reservation r redundant: the pod is finished, bound elsewhere, or bound
// to r's node with the shared slices r counts.
func reservationSeen(r *PodUse, pod *corev1.Pod, u *PodUse) bool {
	switch {
	case gpureq.Terminal(pod):
		return true
	case pod.Spec.NodeName == "":
		return false
	case pod.Spec.NodeName != r.Node:
		return true
	}
	return u != nil && len(u.Shared) >= len(r.Shared)
}

// DeletePod forgets a pod and its reservation.
func (c *Cache) DeletePod(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removePodLocked(uid)
	if r, ok := c.reservations[uid]; ok {
		delete(c.reservations, uid)
		c.rebuild(r.Node)
	}
}

func (c *Cache) removePodLocked(uid types.UID) {
	old, ok := c.pods[uid]
	if !ok {
		return
	}
	delete(c.pods, uid)
	delete(c.byNode[old.Node], uid)
	if len(c.byNode[old.Node]) == 0 {
		delete(c.byNode, old.Node)
	}
	c.rebuild(old.Node)
}

// ErrNoNode is wrapped when a node is not in the cache.
var ErrNoNode = fmt.Errorf("node not in the extender's cache")

// Reserve atomically decides a placement on a node and counts it. decide
// gets the node's current state, without anything the pod itself holds
// (a reservation or the place of its gang plan), and returns the pod's use
// (with Node set to node), or an error, which Reserve returns unchanged. A
// reservation the pod already holds is replaced.
func (c *Cache) Reserve(uid types.UID, node string, decide func(*NodeState) (*PodUse, error)) (*PodUse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev, hadPrev := c.reservations[uid]
	// A placeholder reservation of nothing keeps the pod's own counted use
	// (its planned place) out of the state decide sees.
	c.reservations[uid] = &PodUse{UID: uid, Node: node}
	touched := []string{node}
	if hadPrev {
		touched = append(touched, prev.Node)
	}
	if own, ok := c.pods[uid]; ok {
		touched = append(touched, own.Node)
	}
	c.rebuildAll(touched)
	restore := func() {
		if hadPrev {
			c.reservations[uid] = prev
		} else {
			delete(c.reservations, uid)
		}
		c.rebuildAll(touched)
	}
	st, ok := c.states[node]
	if !ok {
		restore()
		return nil, fmt.Errorf("%w: %s", ErrNoNode, node)
	}
	u, err := decide(st)
	if err != nil {
		restore()
		return nil, err
	}
	u.Node = node
	c.reservations[uid] = u
	c.rebuildAll(touched)
	return u, nil
}

// rebuildAll rebuilds each named node once. Callers hold mu.
func (c *Cache) rebuildAll(names []string) {
	for i, n := range names {
		seen := false
		for _, m := range names[:i] {
			seen = seen || m == n
		}
		if !seen {
			c.rebuild(n)
		}
	}
}

// Snapshot returns the state of every node, by name. The states are
// immutable; ReserveGang uses them to detect a change since.
func (c *Cache) Snapshot() map[string]*NodeState {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make(map[string]*NodeState, len(c.states))
	for n, st := range c.states {
		out[n] = st
	}
	return out
}

// ReserveGang counts the uses of a planned gang (each with Node set) as
// reservations, all or none: when the state of any of their nodes is no
// longer the one in snap, nothing is reserved and an error wrapping
// planner.ErrStaleSnapshot is returned, so that a plan is never reserved
// over a placement made meanwhile. The reservations last until the
// informer shows the pods bound (their plan annotations count them after
// that too) or ReleaseGang.
func (c *Cache) ReserveGang(snap map[string]*NodeState, uses []*PodUse) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var nodes []string
	for _, u := range uses {
		if st, ok := c.states[u.Node]; !ok || st != snap[u.Node] {
			return fmt.Errorf("%w: %s", planner.ErrStaleSnapshot, u.Node)
		}
		nodes = append(nodes, u.Node)
	}
	for _, u := range uses {
		if prev, ok := c.reservations[u.UID]; ok {
			nodes = append(nodes, prev.Node)
		}
		c.reservations[u.UID] = u
	}
	c.rebuildAll(nodes)
	return nil
}

// ReleaseGang drops the reservations of the pods uids hold (a released
// plan).
func (c *Cache) ReleaseGang(uids []types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var nodes []string
	for _, uid := range uids {
		if r, ok := c.reservations[uid]; ok {
			delete(c.reservations, uid)
			nodes = append(nodes, r.Node)
		}
	}
	c.rebuildAll(nodes)
}

// Unreserve drops a pod's reservation (when its Binding failed).
func (c *Cache) Unreserve(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.reservations[uid]; ok {
		delete(c.reservations, uid)
		c.rebuild(r.Node)
	}
}

// Reservation returns a pod's reservation, if any.
func (c *Cache) Reservation(uid types.UID) (*PodUse, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	r, ok := c.reservations[uid]
	return r, ok
}

// Reservations returns how many reservations are held.
func (c *Cache) Reservations() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.reservations)
}

// Nodes returns the states of the named nodes; unknown names map to nil.
func (c *Cache) Nodes(names []string) []*NodeState {
	out := make([]*NodeState, len(names))
	c.mu.RLock()
	defer c.mu.RUnlock()
	for i, n := range names {
		out[i] = c.states[n]
	}
	return out
}

// Node returns one node's state.
func (c *Cache) Node(name string) (*NodeState, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	s, ok := c.states[name]
	return s, ok
}

// PodUse returns the use of a bound pod or reservation by UID.
func (c *Cache) PodUse(uid types.UID) (*PodUse, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if r, ok := c.reservations[uid]; ok {
		return r, true
	}
	u, ok := c.pods[uid]
	return u, ok
}
