package extender

import (
	"context"
	"fmt"
	"sync"
)

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
// A bind with slices registers before its reservation and is done once its
// Binding exists (or it failed); a bind with whole GPUs, once reserved,
// waits for the slice binds registered on its node at that moment. No lock
// is held while either talks to the API server.
type bindOrder struct {
	mu     sync.Mutex
	slices map[string]map[*sliceBind]struct{} // node -> slice binds in flight
}

// sliceBind is one slice bind in flight.
type sliceBind struct {
	o    *bindOrder
	node string
	done chan struct{} // closed when it ends
	once sync.Once
}

// slice registers a slice bind on node; call end once its Binding exists
// or it failed.
func (o *bindOrder) slice(node string) *sliceBind {
	b := &sliceBind{o: o, node: node, done: make(chan struct{})}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.slices == nil {
		o.slices = map[string]map[*sliceBind]struct{}{}
	}
	if o.slices[node] == nil {
		o.slices[node] = map[*sliceBind]struct{}{}
	}
	o.slices[node][b] = struct{}{}
	return b
}

// end ends the slice bind; later calls do nothing.
func (b *sliceBind) end() {
	b.once.Do(func() {
		b.o.mu.Lock()
		delete(b.o.slices[b.node], b)
		if len(b.o.slices[b.node]) == 0 {
			delete(b.o.slices, b.node)
		}
		b.o.mu.Unlock()
		close(b.done)
	})
}

// waitSlices waits until every slice bind in flight on node now, but self
// (nil: none), has ended, or ctx ends.
func (o *bindOrder) waitSlices(ctx context.Context, node string, self *sliceBind) error {
	o.mu.Lock()
	var waits []chan struct{}
	for b := range o.slices[node] {
		if b != self {
			waits = append(waits, b.done)
		}
	}
	o.mu.Unlock()
	for _, done := range waits {
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("waiting for the slices reserved before it on %s to be bound: %w", node, ctx.Err())
		}
	}
	return nil
}
