package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// A user's manifests on the local cluster, as on make demo's: a namespace
// made with the API alone (kube-controller-manager's ServiceAccount
// controller gives it its default ServiceAccount), a Deployment of two
// slice pods, and a Job of four 4-GPU pods, two at a time, on the 8-GPU
// node v100-1, whose containers run `sleep 2` (the node simulator ends a
// container when its sleep ends). The Deployment's pods run, and a deleted
// one comes back; the Job completes, which needs the first two pods' GPUs
// released for the next two; nothing is over-committed.
func TestUsersWorkloadsRun(t *testing.T) {
	c := getCluster(t)
	client := c.Client()
	const ns = "e2e-workloads"
	waitReleased(t, c)
	if _, err := client.CoreV1().Namespaces().Create(t.Context(), &v1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		fg := metav1.DeletePropagationForeground
		_ = client.AppsV1().Deployments(ns).Delete(ctx, "infer", metav1.DeleteOptions{PropagationPolicy: &fg})
		_ = client.BatchV1().Jobs(ns).Delete(ctx, "train", metav1.DeleteOptions{PropagationPolicy: &fg})
		deleteAll(t, c, ns)
	})
	if err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		t.Fatalf("namespace %s got no default ServiceAccount: %v", ns, err)
	}

	labels := map[string]string{"app": "infer"}
	tmpl := podSpec{memUnits: 4, cores: 10, labels: labels}.pod(ns)
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "infer", Namespace: ns},
		Spec: appsv1.DeploymentSpec{Replicas: new(int32(2)), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: tmpl.Spec}}}
	if _, err := client.AppsV1().Deployments(ns).Create(t.Context(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := func(ctx context.Context, selector string) ([]v1.Pod, error) {
		l, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return nil, err
		}
		var out []v1.Pod
		for _, p := range l.Items {
			if p.Status.Phase == v1.PodRunning && p.DeletionTimestamp == nil {
				out = append(out, p)
			}
		}
		return out, nil
	}
	var infer []v1.Pod
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		infer, err = running(ctx, "app=infer")
		return err == nil && len(infer) == 2, nil
	}); err != nil {
		t.Fatalf("Deployment infer: %d of 2 pods Running: %v", len(infer), err)
	}
	deleteNow(t, ns, infer[0].Name, client)
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		ps, err := running(ctx, "app=infer")
		if err != nil || len(ps) != 2 {
			return false, nil
		}
		for _, p := range ps {
			if p.Name == infer[0].Name {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Fatalf("Deployment infer: the deleted pod %s was not replaced: %v", infer[0].Name, err)
	}

	jobLabels := map[string]string{"app": "train"}
	jt := podSpec{gpus: 4, node: "v100-1", labels: jobLabels}.pod(ns)
	jt.Spec.RestartPolicy = v1.RestartPolicyNever
	jt.Spec.Containers[0].Command = []string{"sleep", "2"}
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: ns},
		Spec: batchv1.JobSpec{Parallelism: new(int32(2)), Completions: new(int32(4)), BackoffLimit: new(int32(0)),
			Template: v1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: jobLabels}, Spec: jt.Spec}}}
	start := time.Now()
	if _, err := client.BatchV1().Jobs(ns).Create(t.Context(), job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *batchv1.Job
	if err := wait.PollUntilContextTimeout(t.Context(), 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		j, err := client.BatchV1().Jobs(ns).Get(ctx, "train", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = j
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobFailed && cond.Status == v1.ConditionTrue {
				return false, fmt.Errorf("job failed: %s: %s", cond.Reason, cond.Message)
			}
		}
		return j.Status.Succeeded == 4, nil
	}); err != nil {
		status := "never read"
		if last != nil {
			status = fmt.Sprintf("%+v", last.Status)
		}
		t.Fatalf("Job train did not complete 4 pods of 4 GPUs, 2 at a time, on v100-1: %v; status %s", err, status)
	}
	t.Logf("Job train: 4 pods of 4 GPUs completed on v100-1 in %s (2 at a time, sleep 2)", time.Since(start).Round(100*time.Millisecond))
	occ, pods := occupancy(t, c)
	checkNoOvercommit(t, occ)
	checkRunningPods(t, c, pods)
}
