package extender

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// newTestCache builds a cache from objects.
func newTestCache(t testing.TB, nodes []*corev1.Node, pods []*corev1.Pod) *Cache {
	t.Helper()
	c := NewCache()
	for _, n := range nodes {
		c.SetNode(n)
	}
	for _, p := range pods {
		if u := c.SetPod(p); u != nil && u.Err != nil {
			t.Logf("pod %s: %v", p.Name, u.Err)
		}
	}
	return c
}

func mustState(t testing.TB, c *Cache, name string) *NodeState {
	t.Helper()
	st, ok := c.Node(name)
	if !ok {
		t.Fatalf("node %s not in cache", name)
	}
	return st
}

// freeOf renders the allocator view of a node as "milli/memMiB" per GPU.
func freeOf(st *NodeState) string {
	parts := make([]string, len(st.view.GPUs))
	for i, g := range st.view.GPUs {
		parts[i] = fmt.Sprintf("%d/%d", g.MilliFree, g.MemFreeMiB)
	}
	return strings.Join(parts, " ")
}
