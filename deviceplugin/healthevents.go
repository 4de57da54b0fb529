package deviceplugin

import (
	"fmt"
	"sort"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/health"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

// EventRecorder records Kubernetes Events; client-go's
// record.EventRecorder (and isolation.EventRecorder) satisfy it. Eventf
// must not block on the API server: record.EventRecorder queues.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// PodUIDs is what a PodWatch may also tell: the UID of a pod of the node,
// "" when it has not seen the pod. An Event on a pod needs it to be listed
// by kubectl describe pod (which selects Events by the pod's UID); the
// PodResources API names the pods that hold devices, without their UIDs.
// *kube.PodWatch implements it.
type PodUIDs interface {
	PodUID(namespace, name string) types.UID
}

// podHold is a pod that holds a GPU, or part of it.
type podHold struct {
	Namespace, Name string
	UID             types.UID
}

// healthEvent is one Event of a change of GPU health: on the Node when Pod
// is nil, else on the pod.
type healthEvent struct {
	Pod     *podHold
	Type    string // corev1.EventTypeWarning or corev1.EventTypeNormal
	Reason  string
	Message string
}

// object is what the Event is about: the pod, or the Node named node (with
// the node's name as its UID, as the kubelet's Node Events have it).
func (e healthEvent) object(node string) runtime.Object {
	if e.Pod != nil {
		return &corev1.ObjectReference{APIVersion: "v1", Kind: "Pod", Namespace: e.Pod.Namespace, Name: e.Pod.Name, UID: e.Pod.UID}
	}
	return &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: node, UID: types.UID(node)}
}

// healthEvents returns the Events of a change of GPU health from prev to
// next, GPU by GPU in the order of gpus: for a GPU that turned unhealthy, a
// Warning api.EventGPUUnhealthy on the Node and one on each pod of
// holders[uuid]; for one that turned healthy again, a Normal
// api.EventGPUHealthy on the Node. A GPU whose health did not change raises
// none, nor does a new reason of a GPU that stays unhealthy, nor a GPU that
// is not in gpus. A GPU missing from a map is healthy in it
// (devices.HealthMap.Of), as the device lists count it.
func healthEvents(node string, gpus []health.GPU, prev, next devices.HealthMap, holders map[string][]podHold) []healthEvent {
	where := "node " + node
	if node == "" {
		where = "this node"
	}
	var out []healthEvent
	for _, g := range gpus {
		was, is := prev.Of(g.UUID), next.Of(g.UUID)
		switch {
		case was.Healthy && !is.Healthy:
			out = append(out, healthEvent{
				Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy,
				Message: fmt.Sprintf("GPU %d (%s) is unhealthy: %s; its devices are withheld until it is healthy again", g.Index, g.UUID, is.Reason),
			})
			for _, p := range holders[g.UUID] {
				out = append(out, healthEvent{
					Pod:  &p,
					Type: corev1.EventTypeWarning, Reason: api.EventGPUUnhealthy,
					Message: fmt.Sprintf("GPU %d (%s) on %s, which this pod uses, is unhealthy: %s", g.Index, g.UUID, where, is.Reason),
				})
			}
		case !was.Healthy && is.Healthy:
			out = append(out, healthEvent{
				Type: corev1.EventTypeNormal, Reason: api.EventGPUHealthy,
				Message: fmt.Sprintf("GPU %d (%s) is healthy again (it was unhealthy: %s)", g.Index, g.UUID, was.Reason),
			})
		}
	}
	return out
}

// podsOn returns, by GPU UUID, the pods that hold the GPU according to the
// kubelet's allocations, each pod once, by namespace and name: whole, by
// shared units (on the GPU(s) of the container's placement when known, else
// on those the unit IDs name, as devices.Model.UsageOf counts them) or by a
// MIG instance of it. Allocations without a pod name (the checkpoint's) are
// left out. uid gives a pod's UID where the allocation has none.
func podsOn(m *devices.Model, allocs []kubeletstate.ContainerDevices, placements map[kubeletstate.ContainerKey]string, uid func(namespace, name string) types.UID) map[string][]podHold {
	byGPU := map[string]map[podHold]bool{}
	for _, c := range allocs {
		if c.Namespace == "" || c.Name == "" {
			continue
		}
		u, _ := m.UsageOf([]devices.Allocation{{Resource: c.Resource, DeviceIDs: c.DeviceIDs, SharedGPU: placements[c.Key()]}})
		gpus := make([]string, 0, len(u.Whole)+len(u.Shared)+len(u.MIG))
		for uuid := range u.Whole {
			gpus = append(gpus, uuid)
		}
		for uuid := range u.Shared {
			gpus = append(gpus, uuid)
		}
		for id := range u.MIG {
			if g, _, ok := m.MIGInstanceOf(id); ok {
				gpus = append(gpus, g.UUID)
			}
		}
		if len(gpus) == 0 {
			continue
		}
		p := podHold{Namespace: c.Namespace, Name: c.Name, UID: types.UID(c.PodUID)}
		if p.UID == "" && uid != nil {
			p.UID = uid(c.Namespace, c.Name)
		}
		for _, uuid := range gpus {
			if byGPU[uuid] == nil {
				byGPU[uuid] = map[podHold]bool{}
			}
			byGPU[uuid][p] = true
		}
	}
	out := make(map[string][]podHold, len(byGPU))
	for uuid, set := range byGPU {
		list := make([]podHold, 0, len(set))
		for p := range set {
			list = append(list, p)
		}
		sort.Slice(list, func(i, j int) bool {
			if list[i].Namespace != list[j].Namespace {
				return list[i].Namespace < list[j].Namespace
			}
			if list[i].Name != list[j].Name {
				return list[i].Name < list[j].Name
			}
			return list[i].UID < list[j].UID
		})
		out[uuid] = list
	}
	return out
}

// reportHealth raises the Events of the change of GPU health from the
// last health reported to h (healthEvents), on the pods that hold a GPU
// by the kubelet's last allocations as the agent read them (with the
// placements of shared containers). It is called by one goroutine at a
// time: Run, then the health watch's callback.
func (a *Agent) reportHealth(h devices.HealthMap) {
	prev := a.healthSeen
	a.healthSeen = h
	if a.opts.Events == nil {
		return
	}
	a.mu.Lock()
	allocs, placements := a.lastKubelet, a.placements
	a.mu.Unlock()
	var uid func(namespace, name string) types.UID
	if p, ok := a.opts.Pods.(PodUIDs); ok {
		uid = p.PodUID
	}
	events := healthEvents(a.opts.NodeName, a.watched, prev, h, podsOn(a.model, allocs, placements, uid))
	for _, ev := range events {
		a.opts.Events.Eventf(ev.object(a.opts.NodeName), ev.Type, ev.Reason, "%s", ev.Message)
	}
	if len(events) > 0 {
		a.logger.V(2).Info("Raised Events of GPU health", "events", len(events))
	}
}
