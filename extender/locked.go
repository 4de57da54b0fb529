package extender

import (
	"sync"

	"github.com/tessera-gpu/tessera/allocator"
)

// lockedPolicy serialises a policy that is not safe for concurrent use.
type lockedPolicy struct {
	mu sync.Mutex
	p  allocator.Policy
}

var _ allocator.Policy = (*lockedPolicy)(nil)

func (l *lockedPolicy) Name() string { return l.p.Name() }

func (l *lockedPolicy) Evaluate(n *allocator.Node, r allocator.Request) allocator.Evaluation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.p.Evaluate(n, r)
}
