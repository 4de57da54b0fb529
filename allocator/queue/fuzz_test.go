package queue

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// specsFrom decodes fuzz bytes into specs, six bytes a queue: name,
// parent, namespace, guarantee, limit, weight. Names come from a small set
// so that parents, cycles, duplicates and shared namespaces are common.
func specsFrom(data []byte) ([]Spec, map[string]quota.Resources) {
	var specs []Spec
	used := map[string]quota.Resources{}
	for len(data) >= 6 {
		b := data[:6]
		data = data[6:]
		sp := Spec{Name: fmt.Sprintf("q%d", b[0]%10)}
		if p := b[1] % 11; p < 10 {
			sp.Parent = fmt.Sprintf("q%d", p)
		}
		if ns := b[2] % 6; ns < 5 {
			sp.Namespaces = []string{fmt.Sprintf("ns%d", ns)}
		}
		sp.Guaranteed = quota.Resources{gpu: int64(int8(b[3]))}
		if b[4]&0x80 == 0 {
			sp.Limit = quota.Resources{gpu: int64(b[4] % 32)}
		}
		if b[5]&0x80 == 0 {
			sp.Weight = map[corev1.ResourceName]int64{gpu: int64(int8(b[5] << 1))}
		}
		specs = append(specs, sp)
		used[sp.Name] = gpus(int64(b[3] % 7))
	}
	return specs, used
}

// FuzzBuild: any specs build a tree without panicking, every path ends at
// its queue, follows the tree's parents and never loops, and every question
// on a state of that tree answers.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{0, 10, 0, 4, 8, 1, 1, 0, 1, 2, 4, 1, 2, 0, 2, 2, 4, 0})
	f.Add([]byte{0, 1, 0, 0, 0x80, 0x80, 1, 0, 0, 0, 0x80, 0x80}) // a cycle, a shared namespace
	f.Add([]byte{0, 10, 5, 0xff, 1, 0xff, 0, 10, 5, 1, 1, 1})     // negative, duplicate
	f.Add([]byte{1, 0, 5, 0, 0x80, 0x80, 2, 1, 5, 0, 0x80, 0x80, 3, 2, 5, 0, 0x80, 0x80, 4, 3, 5, 0, 0x80, 0x80,
		5, 4, 5, 0, 0x80, 0x80, 6, 5, 5, 0, 0x80, 0x80, 7, 6, 5, 0, 0x80, 0x80, 8, 7, 5, 0, 0x80, 0x80, 9, 8, 1, 3, 0x80, 0x80}) // deep
	f.Fuzz(func(t *testing.T, data []byte) {
		specs, used := specsFrom(data)
		tree := Build(specs)
		names := tree.Names()
		for _, name := range names {
			path := tree.Path(name)
			if len(path) == 0 || len(path) > len(names) || path[len(path)-1] != name {
				t.Fatalf("Path(%s) = %v", name, path)
			}
			for i := 1; i < len(path); i++ {
				if tree.Parent(path[i]) != path[i-1] {
					t.Fatalf("Path(%s) = %v, but %s's parent is %q", name, path, path[i], tree.Parent(path[i]))
				}
			}
			if tree.Parent(path[0]) != "" {
				t.Fatalf("Path(%s) = %v starts below the top", name, path)
			}
			if len(path) > MaxDepth && tree.Invalid(name) == "" {
				t.Fatalf("queue %s is %d deep and valid", name, len(path))
			}
			_ = tree.Children(name)
		}
		_ = tree.Leaves()
		for ns := 0; ns < 5; ns++ {
			if q, ok := tree.QueueOf(fmt.Sprintf("ns%d", ns)); ok && tree.Path(q) == nil {
				t.Fatalf("QueueOf(ns%d) = %s, not in the tree", ns, q)
			}
		}
		s := &State{Tree: tree, Capacity: gpus(20), Used: used, Pending: used, HalfLife: time.Hour,
			Usage: map[string]Usage{"q1": {gpu: 100}}}
		fair := s.FairShare()
		var top int64
		for _, r := range tree.Children("") {
			top += fair[r][gpu]
		}
		if top > 20 {
			t.Fatalf("top-level fair shares sum to %d, above capacity 20", top)
		}
		var ws []Workload
		for _, name := range names {
			ws = append(ws, wl(name, "w", 0, 0, 1))
			_ = s.Admit(name, gpus(2))
			_, _ = s.CanPreempt(name, gpus(1), wl("q0", "v", 0, 0, 1))
		}
		s.Order(ws)
		for _, leaf := range tree.Leaves() {
			_, _ = s.Reclaim(leaf, gpus(2), ws, freed(2))
		}
	})
}
