package isolation

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// KubeEvictor evicts pods through the Eviction API (PodDisruptionBudgets
// apply), with a precondition on the pod's UID so that a new pod of the
// same name is never evicted.
type KubeEvictor struct {
	Client kubernetes.Interface
}

var _ Evictor = KubeEvictor{}

// Evict implements Evictor.
func (k KubeEvictor) Evict(ctx context.Context, namespace, name string, uid types.UID, reason string) error {
	ev := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: namespace, Name: name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	}
	if err := k.Client.CoreV1().Pods(namespace).EvictV1(ctx, ev); err != nil {
		return fmt.Errorf("evicting pod %s/%s (%s): %w", namespace, name, reason, err)
	}
	return nil
}

// NVMLUtilization reads per-process utilisation samples through NVML,
// asking each time only for samples newer than the last ones seen.
type NVMLUtilization struct {
	Lib nvml.Interface

	mu   sync.Mutex
	last map[int]uint64
}

var _ UtilizationSource = (*NVMLUtilization)(nil)

// ProcessUtilization implements UtilizationSource.
func (n *NVMLUtilization) ProcessUtilization(index int) ([]ProcessUtilization, error) {
	dev, ret := n.Lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %d: %s", index, ret.Error())
	}
	n.mu.Lock()
	if n.last == nil {
		n.last = map[int]uint64{}
	}
	since := n.last[index]
	n.mu.Unlock()
	samples, ret := dev.GetProcessUtilization(since)
	if ret == nvml.ERROR_NOT_FOUND {
		return nil, nil // no sample since the last call
	}
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GPU %d: process utilisation: %s", index, ret.Error())
	}
	// Keep each process's newest sample.
	latest := map[uint32]nvml.ProcessUtilizationSample{}
	newest := since
	for _, s := range samples {
		if cur, ok := latest[s.Pid]; !ok || s.TimeStamp >= cur.TimeStamp {
			latest[s.Pid] = s
		}
		newest = max(newest, s.TimeStamp)
	}
	out := make([]ProcessUtilization, 0, len(latest))
	for _, s := range latest {
		out = append(out, ProcessUtilization{PID: s.Pid, SMPercent: s.SmUtil})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	n.mu.Lock()
	n.last[index] = newest
	n.mu.Unlock()
	return out, nil
}
