package planner_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// An elastic gang (4 members of 4 GPUs, minMember 2) on a cluster with
// room for 2 starts with 2, then grows by one member each time room for
// one appears, and never plans a member without room.
func TestElasticGangStartsAtMinAndGrows(t *testing.T) {
	f := newGangFixture(t, testbuild.EightGPUNodes(2)...)
	// Node n1 is full; n0 has room for two 4-GPU members.
	var fillers []*corev1.Pod
	for i := range 2 {
		p := testbuild.Pod(fmt.Sprintf("fill-%d", i)).Whole(4).Node("n1").Holding(4*i, 4*i+1, 4*i+2, 4*i+3).Obj()
		p.UID = types.UID(fmt.Sprintf("uid-fill-%d", i))
		if _, err := f.client.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.SetPod(p)
		fillers = append(fillers, p)
	}
	for i := range 4 {
		f.member("el", 2, i, 4, f.now)
	}
	planned := func() int {
		n := 0
		for _, s := range f.state("el-") {
			if s.planned && !s.gated {
				n++
			}
		}
		return n
	}
	f.sync()
	f.sync()
	if n := planned(); n != 2 {
		t.Fatalf("planned %d members with room for 2, want 2 (minMember): %v", n, f.state("el-"))
	}
	for i, want := range []int{3, 4} {
		if err := f.client.CoreV1().Pods(fillers[i].Namespace).Delete(context.Background(), fillers[i].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		f.cache.DeletePod(fillers[i].UID)
		f.sync()
		f.sync()
		if n := planned(); n != want {
			t.Fatalf("after room for one more: planned %d, want %d: %v", n, want, f.state("el-"))
		}
	}
}
