package nodesim

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"

	"github.com/tessera-gpu/tessera/test/framework/kubelet"
)

// PodResourcesSocket is where a node serves the kubelet's PodResources API
// (the kubelet's own server, k8s.io/kubernetes/pkg/kubelet/apis/podresources,
// over the device manager and the node's running pods).
func PodResourcesSocket(stateDir string) string { return filepath.Join(stateDir, "pod-resources.sock") }

// activePods is the kubelet's pod list as the PodResources server sees it.
type activePods struct {
	mu   sync.Mutex
	pods map[types.UID]*v1.Pod
}

func (a *activePods) set(p *v1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pods[p.UID] = p
}

func (a *activePods) remove(uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pods, uid)
}

func (a *activePods) GetActivePods() []*v1.Pod { return a.GetPods() }

func (a *activePods) GetPods() []*v1.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]*v1.Pod, 0, len(a.pods))
	for _, p := range a.pods {
		out = append(out, p)
	}
	return out
}

func (a *activePods) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pods {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return nil, false
}

// devicesProvider is the container manager's DevicesProvider over the
// device manager (the same conversion as pkg/kubelet/cm).
type devicesProvider struct{ dm *kubelet.DeviceManager }

func (d devicesProvider) UpdateAllocatedDevices() { d.dm.Manager().UpdateAllocatedDevices() }

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	return containerDevices(d.dm.Manager().GetDevices(podUID, containerName))
}

func (d devicesProvider) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	return containerDevices(d.dm.Manager().GetAllocatableDevices())
}

func containerDevices(devs devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	var out []*podresourcesapi.ContainerDevices
	for resourceName, resourceDevs := range devs {
		for devID, dev := range resourceDevs {
			topo := dev.GetTopology()
			if topo == nil {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID}})
				continue
			}
			for _, node := range topo.GetNodes() {
				out = append(out, &podresourcesapi.ContainerDevices{ResourceName: resourceName, DeviceIds: []string{devID},
					Topology: &podresourcesapi.TopologyInfo{Nodes: []*podresourcesapi.NUMANode{{ID: node.GetID()}}}})
			}
		}
	}
	return out
}

// cpusProvider is the container manager's CPUsProvider over the CPU
// manager (empty without one).
type cpusProvider struct{ dm *kubelet.DeviceManager }

func (c cpusProvider) GetCPUs(podUID, containerName string) []int64 {
	return int64s(c.dm.ExclusiveCPUs(podUID, containerName).List())
}

func (c cpusProvider) GetAllocatableCPUs() []int64 { return int64s(c.dm.AllocatableCPUs().List()) }

func int64s(v []int) []int64 {
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

// noResources provides no memory or dynamic resources (no memory manager
// on simulated nodes).
type noResources struct{}

func (noResources) GetCPUs(string, string) []int64                              { return nil }
func (noResources) GetAllocatableCPUs() []int64                                 { return nil }
func (noResources) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noResources) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }
func (noResources) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

// servePodResources serves the PodResources v1 API until ctx ends.
func servePodResources(ctx context.Context, sock string, pods *activePods, dm *kubelet.DeviceManager) error {
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("PodResources socket: %w", err)
	}
	srv := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(srv, podresources.NewV1PodResourcesServer(ctx, podresources.PodResourcesProviders{
		Pods: pods, Devices: devicesProvider{dm}, Cpus: cpusProvider{dm}, Memory: noResources{}, DynamicResources: noResources{},
	}))
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	return srv.Serve(l)
}
