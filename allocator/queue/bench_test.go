package queue

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// benchState is 5 departments of 10 teams (50 leaf queues) on 400 GPUs,
// every team using, waiting for and having used some GPUs and memory.
func benchState() *State {
	var specs []Spec
	s := &State{
		Capacity: quota.Resources{gpu: 400, mem: 400 * 80},
		Used:     map[string]quota.Resources{}, Pending: map[string]quota.Resources{}, Usage: map[string]Usage{},
		HalfLife: 24 * time.Hour,
	}
	for d := 0; d < 5; d++ {
		dept := fmt.Sprintf("dept-%d", d)
		specs = append(specs, Spec{Name: dept, Guaranteed: quota.Resources{gpu: 60, mem: 60 * 80}})
		for t := 0; t < 10; t++ {
			team := fmt.Sprintf("%s-team-%d", dept, t)
			specs = append(specs, Spec{Name: team, Parent: dept, Namespaces: []string{team},
				Guaranteed: quota.Resources{gpu: 5, mem: 5 * 80}, Limit: quota.Resources{gpu: 40},
				Weight: map[corev1.ResourceName]int64{gpu: int64(1 + t%3)}})
			n := int64((d*10 + t) % 9)
			s.Used[team] = quota.Resources{gpu: n, mem: n * 70}
			s.Pending[team] = quota.Resources{gpu: 2 * n, mem: n * 100}
			s.Usage[team] = Accrue(nil, quota.Resources{gpu: n + 1}, time.Duration(t+1)*time.Hour, s.HalfLife)
		}
	}
	s.Tree = Build(specs)
	return s
}

func BenchmarkOrder(b *testing.B) {
	s := benchState()
	leaves := s.Tree.Leaves()
	ws := make([]Workload, 1000)
	for i := range ws {
		ws[i] = wl(leaves[i%len(leaves)], fmt.Sprintf("w%d", i), int32(i%3)*1000, time.Duration(i)*time.Second, int64(1+i%4))
	}
	work := make([]Workload, len(ws))
	b.ReportAllocs()
	for b.Loop() {
		copy(work, ws)
		s.Order(work)
	}
}

func BenchmarkFairShare(b *testing.B) {
	s := benchState()
	b.ReportAllocs()
	for b.Loop() {
		_ = s.FairShare()
	}
}
