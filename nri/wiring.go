package nri

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/podtrust"
	"github.com/tessera-gpu/tessera/isolation"
)

// HealthFunc adapts a function to Health.
type HealthFunc func() map[string]string

// Unhealthy implements Health.
func (f HealthFunc) Unhealthy() map[string]string { return f() }

// ObserverFunc adapts a function to ConnectionObserver.
type ObserverFunc func(connected bool)

// SetNRIConnected implements ConnectionObserver.
func (f ObserverFunc) SetNRIConnected(connected bool) { f(connected) }

var _ isolation.Limits = (*Ledger)(nil)

// ContainerLimits implements isolation.Limits: every container of the
// ledger on each of its GPUs, with the memory limit of its shared slice (0
// for whole GPUs and the GPUs of its MIG instances).
func (l *Ledger) ContainerLimits() []isolation.ContainerLimit {
	var out []isolation.ContainerLimit
	for _, e := range l.Snapshot() {
		base := isolation.ContainerLimit{ContainerID: e.ContainerID, PodUID: e.PodUID, Namespace: e.Namespace, Pod: e.Pod, Container: e.Container}
		for _, g := range e.GPUs {
			c := base
			c.GPU = g
			out = append(out, c)
		}
		if s := e.Shared; s != nil {
			for _, g := range s.GPUs() {
				c := base
				c.GPU = g
				c.LimitMiB = s.MemoryMiB
				out = append(out, c)
			}
		}
		// A MIG instance's processes run on its GPU; the hardware limits
		// their memory.
		seen := map[string]bool{}
		for _, m := range e.MIG {
			if !seen[m.GPU.UUID] {
				seen[m.GPU.UUID] = true
				c := base
				c.GPU = m.GPU
				out = append(out, c)
			}
		}
	}
	return out
}

// SharedGPUs lists the GPUs with shared tenants in the ledger, by index: what
// the MPS daemons must serve.
func (l *Ledger) SharedGPUs() []api.GPURef { return sharedGPUs(l.Snapshot()) }

// KubeRecorder implements AssignmentRecorder with client-go: it merges the
// container's shared slice into the pod's assignment annotation, with the
// pod's resourceVersion as a precondition so that a concurrent writer (the
// node agent's whole-GPU sync) is never overwritten.
type KubeRecorder struct {
	Client kubernetes.Interface
	// Trust reads the pod's assignment (only Tessera's sealed one counts)
	// and its Sealer seals what is written; required.
	Trust *podtrust.Filter
}

var _ AssignmentRecorder = KubeRecorder{}

// RecordShared implements AssignmentRecorder.
func (k KubeRecorder) RecordShared(ctx context.Context, pod Pod, container string, shared api.SharedGPU) error {
	const attempts = 3
	var err error
	for i := 0; i < attempts; i++ {
		if err = k.recordOnce(ctx, pod, container, shared); err == nil {
			return nil
		}
	}
	return err
}

func (k KubeRecorder) recordOnce(ctx context.Context, pod Pod, container string, shared api.SharedGPU) error {
	p, err := k.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading pod %s: %w", pod, err)
	}
	if pod.UID != "" && string(p.UID) != pod.UID {
		return fmt.Errorf("pod %s is now another pod (UID %s, not %s)", pod, p.UID, pod.UID)
	}
	k.Trust.Quiet().Pod(p)
	a, found, err := api.GetAssignment(p.Annotations)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod, err)
	}
	if !found {
		a = api.NewAssignment()
	}
	if c := a.Container(container); c != nil {
		if c.Shared != nil && !reflect.DeepEqual(*c.Shared, shared) {
			return fmt.Errorf("pod %s container %s already has a shared assignment on GPU %s", pod, container, c.Shared.GPU.UUID)
		}
		s := shared
		c.Shared = &s
	} else {
		s := shared
		a.Containers = append(a.Containers, api.ContainerAssignment{Name: container, Shared: &s})
	}
	sort.Slice(a.Containers, func(i, j int) bool { return a.Containers[i].Name < a.Containers[j].Name })
	value, err := api.EncodeAssignment(a)
	if err != nil {
		return fmt.Errorf("pod %s: %w", pod, err)
	}
	annotations, err := k.Trust.Sealed(p.UID, api.AnnotationAssignment, value)
	if err != nil {
		return fmt.Errorf("recording the assignment of pod %s: %w", pod, err)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": p.ResourceVersion,
		"annotations":     annotations,
	}})
	if err != nil {
		return err
	}
	if _, err := k.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("recording the assignment of pod %s: %w", pod, err)
	}
	return nil
}

// OptionsFromConfig derives the decision options from the node agent's
// configuration: CDI devices when the device list strategy uses CDI, device
// nodes otherwise. uvmMajor comes from UVMMajor, pipeDir from the MPS
// controller (isolation.MPS.PipeDir), policy places pods that bypassed the
// scheduler extender.
func OptionsFromConfig(cfg *api.NodeAgentConfig, uvmMajor int64, pipeDir func(uuid string) string, policy allocator.Policy) Options {
	return Options{
		MemoryUnitMiB:    cfg.MemoryUnitMiB,
		MemoryReserveMiB: cfg.MemoryReserveMiB,
		CDI:              cfg.HasStrategy(api.DeviceListCDICRI) || cfg.HasStrategy(api.DeviceListCDIAnnotations),
		CDIKind:          cfg.CDIKind,
		CDIDeviceName:    cfg.CDIDeviceName,
		UVMMajor:         uvmMajor,
		MPSPipeDir:       pipeDir,
		Policy:           policy,
		NonGPU:           NonGPUFromConfig(cfg),
	}
}

// HealthFromInventory reads GPU health from an inventory source, such as
// the device plugin agent's Inventory method.
func HealthFromInventory(inventory func() *api.GPUInventory) Health {
	return HealthFunc(func() map[string]string {
		out := map[string]string{}
		for _, g := range inventory().GPUs {
			if !g.Healthy {
				out[g.UUID] = g.Reason
			}
		}
		return out
	})
}
