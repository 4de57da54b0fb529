package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// TestKindChangeAfterRelease is the withheld-GPU race of issue 17: one
// a100 node alternates between a 4 GiB slice and a pod of all its GPUs,
// each created as soon as the previous pod object is gone (deleted with
// grace 0). The extender frees a GPU when its pod goes away, but the node
// agent withholds the other kind's devices of that GPU until the kubelet's
// allocations show it free; the extender must wait for the node to
// advertise the devices again (the inventory's withheld sets) instead of
// binding a pod the kubelet then refuses (UnexpectedAdmissionError).
// Both directions: slice then whole, whole then slice.
func TestKindChangeAfterRelease(t *testing.T) {
	c := getCluster(t)
	ns := namespace(t, c, "e2e-release")
	client := c.Client()
	const node, rounds = "a100-2", 6
	gpus := int64(len(inventory(t, c, node).GPUs))
	for round := range rounds {
		first := podSpec{name: fmt.Sprintf("slice-%d", round), memUnits: 4, node: node}
		then := podSpec{name: fmt.Sprintf("whole-%d", round), gpus: gpus, node: node}
		if round%2 == 1 {
			first, then = then, first
		}
		// The first pod starts on a quiet node.
		waitReleased(t, c)
		create(t, client, ns, first)
		waitRunning(t, c, ns, first.name, 90*time.Second)
		deleteNow(t, ns, first.name, client)
		start := time.Now()
		create(t, client, ns, then)
		err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := client.CoreV1().Pods(ns).Get(ctx, then.name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if p.Status.Phase == v1.PodFailed {
				return false, fmt.Errorf("pod failed: %s: %s", p.Status.Reason, p.Status.Message)
			}
			return p.Status.Phase == v1.PodRunning, nil
		})
		if err != nil {
			// Go on: the other direction is a round away.
			t.Errorf("round %d: %s after %s: not Running: %v\n%s", round, then.name, first.name, err, describe(t, c, getPod(t, client, ns, then.name)))
		} else {
			t.Logf("round %d: %s Running %s after %s was gone", round, then.name, time.Since(start).Round(time.Millisecond), first.name)
		}
		deleteNow(t, ns, then.name, client)
	}
}

// deleteNow deletes a pod with grace 0 and waits until the pod object is
// gone.
func deleteNow(t *testing.T, ns, name string, client kubernetes.Interface) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatalf("delete pod %s: %v", name, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s not gone: %v", name, err)
	}
}
