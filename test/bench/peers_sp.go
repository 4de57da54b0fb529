package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/test/framework/install"
)

// spProfile is the profile of scheduler-plugins' kube-scheduler that the
// benchmark's pods name.
const spProfile = "scheduler-plugins"

// spSchedulerConfig is scheduler-plugins' KubeSchedulerConfiguration with
// both plugins this benchmark compares, as their manifests enable each
// (manifests/coscheduling and manifests/capacityscheduling
// scheduler-config.yaml, merged into one profile): Coscheduling at every
// extension point and as the only QueueSort, CapacityScheduling at every
// extension point and as the only PostFilter. permitWaitingTimeSeconds is
// 60 (their example has 10) so that a gang of the benchmark's size is not
// timed out on a loaded machine; the PodGroups set the same timeout.
func spSchedulerConfig(kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
clientConnection:
  kubeconfig: %q
profiles:
- schedulerName: %s
  plugins:
    multiPoint:
      enabled:
      - name: Coscheduling
      - name: CapacityScheduling
    queueSort:
      enabled:
      - name: Coscheduling
      disabled:
      - name: "*"
    postFilter:
      enabled:
      - name: CapacityScheduling
      disabled:
      - name: "*"
  pluginConfig:
  - name: Coscheduling
    args:
      permitWaitingTimeSeconds: 60
`, kubeconfig, spProfile)
}

// setupSPAccess lets kube-scheduler's identity (system:kube-scheduler, the
// user scheduler-plugins' scheduler runs as here, with the bootstrap
// policy's roles) read and update PodGroups and ElasticQuotas, as
// scheduler-plugins' install manifests do, and writes its kubeconfig.
func setupSPAccess(ctx context.Context, client kubernetes.Interface, kubeconfigFor func(user, file string) (string, error), user string) (string, error) {
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "bench-scheduler-plugins"},
		Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{"scheduling.x-k8s.io"},
			Resources: []string{"podgroups", "podgroups/status", "elasticquotas", "elasticquotas/status"},
			Verbs:     []string{"get", "list", "watch", "create", "delete", "update", "patch"},
		}},
	}
	if err := createRoleFor(ctx, client, role, user); err != nil {
		return "", err
	}
	return kubeconfigFor(user, "scheduler-plugins.kubeconfig")
}

// installSPCRDs creates scheduler-plugins' CRDs (PodGroup, ElasticQuota;
// copied next to its binary by build-peer-bins.sh) and waits until they
// are established. Tessera reads the same PodGroups and ElasticQuotas.
func installSPCRDs(ctx context.Context, cfg *rest.Config, dir string) error {
	a, err := install.NewApplier(cfg)
	if err != nil {
		return err
	}
	for _, f := range []string{"podgroups.yaml", "elasticquotas.yaml"} {
		objs, err := install.ReadDocuments("", filepath.Join(dir, f))
		if err != nil {
			return err
		}
		for _, o := range objs {
			if _, err := a.Create(ctx, o); err != nil {
				return err
			}
			if o.GetKind() == "CustomResourceDefinition" {
				if err := install.WaitEstablished(ctx, a.Dynamic(), o.GetName()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// createElasticQuota gives ns an ElasticQuota whose min and max hold the
// whole cluster, so that CapacityScheduling (and Tessera's quota) check
// every GPU pod but refuse none.
func createElasticQuota(ctx context.Context, dyn dynamic.Interface, ns string, gpus int) error {
	q := map[string]any{
		"cpu":                         strconv.Itoa(gpus * 1000),
		"memory":                      strconv.Itoa(gpus) + "Ti",
		string(api.ResourceGPU):       strconv.Itoa(gpus),
		string(api.ResourceGPUMemory): strconv.Itoa(gpus * gpuMemMiB / memUnitMiB),
		string(api.ResourceGPUCore):   strconv.Itoa(gpus * api.CoresPerGPU),
		hamiResourceGPU:               strconv.Itoa(gpus * hamiSplitCount),
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1",
		"kind":       "ElasticQuota",
		"metadata":   map[string]any{"name": "bench", "namespace": ns},
		"spec":       map[string]any{"min": q, "max": q},
	}}
	eqs := dyn.Resource(api.ElasticQuotaGVR).Namespace(ns)
	old, err := eqs.Get(ctx, "bench", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		if _, err := eqs.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ElasticQuota: %w", err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ElasticQuota: %w", err)
	}
	obj.SetResourceVersion(old.GetResourceVersion())
	if _, err := eqs.Update(ctx, obj, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update ElasticQuota: %w", err)
	}
	return nil
}

// createPodGroup creates the scheduler-plugins PodGroup name with
// minMember members and a 60 s schedule timeout.
func createPodGroup(ctx context.Context, dyn dynamic.Interface, ns, name string, minMember int) error {
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.x-k8s.io/v1alpha1",
		"kind":       "PodGroup",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec":       map[string]any{"minMember": int64(minMember), "scheduleTimeoutSeconds": int64(60)},
	}}
	if _, err := dyn.Resource(api.PodGroupGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create PodGroup %s: %w", name, err)
	}
	return nil
}

// deletePodGroups deletes every PodGroup in ns.
func deletePodGroups(ctx context.Context, dyn dynamic.Interface, ns string) error {
	if err := dyn.Resource(api.PodGroupGVR).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete PodGroups: %w", err)
	}
	return nil
}

// startSPScheduler runs scheduler-plugins' kube-scheduler as its own
// process with the flags the control plane gives kube-scheduler, and
// waits for its /readyz. scorePercent, when not negative, is set as its
// percentageOfNodesToScore. It returns the process and its address.
func startSPScheduler(ctx context.Context, bin, kubeconfig, dir string, scorePercent int, timeout time.Duration) (*extenderProc, string, error) {
	sub := filepath.Join(dir, "scheduler-plugins")
	if err := os.MkdirAll(sub, 0o700); err != nil {
		return nil, "", fmt.Errorf("scheduler-plugins dir: %w", err)
	}
	cfg := filepath.Join(sub, "config.yaml")
	if err := os.WriteFile(cfg, []byte(spSchedulerConfig(kubeconfig)), 0o600); err != nil {
		return nil, "", fmt.Errorf("write scheduler-plugins config: %w", err)
	}
	if scorePercent >= 0 {
		if err := setScorePercent(cfg, scorePercent); err != nil {
			return nil, "", err
		}
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, "", fmt.Errorf("scheduler-plugins address: %w", err)
	}
	args := []string{
		"--config=" + cfg,
		"--bind-address=127.0.0.1",
		"--secure-port=" + port,
		"--cert-dir=" + filepath.Join(sub, "certs"),
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		schedulerMetricsArg,
		"--v=2",
	}
	p, err := startProc(ctx, bin, args, nil, filepath.Join(dir, "scheduler-plugins.log"), "https://"+addr+"/readyz", timeout)
	if err != nil {
		return nil, "", err
	}
	p.addr = addr
	return p, addr, nil
}
