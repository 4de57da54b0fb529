package gang_test

import (
	"testing"
	"time"

	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/test/framework/extenderenv"
)

// TestPreemptionNeverBreaksAGang: kube-scheduler's preemption (the
// extender's preempt verb; Tessera's own preemptor is off here) takes no
// member of a gang spread over two nodes for a pod of higher priority,
// with ElasticQuotas enforced or not (--quota=false once let every member
// go alone: the gang rules were read through the quota ledger only).
func TestPreemptionNeverBreaksAGang(t *testing.T) {
	for _, quota := range []string{"--quota=false", "--quota=true"} {
		t.Run(quota, func(t *testing.T) {
			e := start(t, quota, "--preemption=false")
			w := e.WatchPods(t)
			pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "high"}, Value: 1000}
			if _, err := e.Client.SchedulingV1().PriorityClasses().Create(t.Context(), pc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			e.CreateNode(t, h100Node("n0", nil))
			e.CreateNode(t, h100Node("n1", nil))
			createMember(t, e, "g", 2, 0, 8)
			createMember(t, e, "g", 2, 1, 8)
			waitWhole(t, e, w, "g", 2, 60*time.Second)
			e.CreatePod(t, extenderenv.PodSpec{Name: "urgent", GPUs: 8, PriorityClass: "high"})
			e.WaitEvent(t, ns, "urgent", "FailedScheduling", "", 30*time.Second)
			time.Sleep(3 * time.Second) // kube-scheduler tries again, preemption included
			for _, m := range []string{"g-0", "g-1"} {
				if p := e.GetPod(t, ns, m); p.DeletionTimestamp != nil {
					t.Errorf("gang member %s was preempted alone: the gang is broken", m)
				}
			}
			if p := e.GetPod(t, ns, "urgent"); p.Spec.NodeName != "" || p.Status.NominatedNodeName != "" {
				t.Errorf("urgent bound to %q, nominated to %q: room was made by taking a gang member", p.Spec.NodeName, p.Status.NominatedNodeName)
			}
		})
	}
}
