package extender

import "sync"

// bindOrder orders the binds of each node so that a slice reserved on a
// node has its Binding created before any whole-GPU pod reserved on that
// node after it.
//
// Why: the node's kubelet, not the extender, chooses a whole-GPU pod's
// GPUs, and the node agent withholds a GPU from whole use once it sees a
// bound pod whose assignment gives that GPU to a slice. If a slice put on a
// free GPU were bound after a whole-GPU pod reserved later on the same node,
// the kubelet could admit the whole-GPU pod first and give it that GPU; the
// slice would then be refused on the node. Slices reserved after a
// whole-GPU pod need no order: while its GPUs are pending, slices go only to
// GPUs already in use (NodeState.sharedView).
//
// Slice-only binds share a node's lock from before their reservation until
// their Binding exists; binds with whole GPUs take it alone for the same
// span, so they wait for the slices reserved before them. The locks of
// nodes with no bind in flight are dropped.
type bindOrder struct {
	mu    sync.Mutex
	nodes map[string]*nodeBinds
}

type nodeBinds struct {
	rw    sync.RWMutex
	users int
}

// lock takes node's lock, shared for a slice-only bind, and returns its
// release.
func (o *bindOrder) lock(node string, sliceOnly bool) (unlock func()) {
	o.mu.Lock()
	if o.nodes == nil {
		o.nodes = map[string]*nodeBinds{}
	}
	n := o.nodes[node]
	if n == nil {
		n = &nodeBinds{}
		o.nodes[node] = n
	}
	n.users++
	o.mu.Unlock()
	if sliceOnly {
		n.rw.RLock()
	} else {
		n.rw.Lock()
	}
	return func() {
		if sliceOnly {
			n.rw.RUnlock()
		} else {
			n.rw.Unlock()
		}
		o.mu.Lock()
		if n.users--; n.users == 0 {
			delete(o.nodes, node)
		}
		o.mu.Unlock()
	}
}
