package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/topology"
)

// waitNRI waits up to NRIWait for the NRI plugin to be connected: it is
// away only while the container runtime restarts, and a pod the kubelet is
// admitting meanwhile would otherwise fail.
func (a *Agent) waitNRI(ctx context.Context, logger klog.Logger) {
	if a.nriConnected() || a.opts.NRIWait < 0 {
		return
	}
	logger.Info("Waiting for the NRI plugin to connect before allocating shared units", "timeout", a.opts.NRIWait)
	_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, a.opts.NRIWait, true, func(context.Context) (bool, error) {
		return a.nriConnected(), nil
	})
}

func (a *Agent) nriConnected() bool {
	return a.opts.NRI != nil && a.opts.NRI.Connected()
}

// nriMessage explains why shared units are refused.
func (a *Agent) nriMessage() string {
	node := a.opts.NodeName
	if node == "" {
		node = "this node"
	}
	shared := api.SharedResources()
	names := make([]string, len(shared))
	for i, r := range shared {
		names[i] = string(r)
	}
	return fmt.Sprintf("isolated GPU sharing requires the Tessera NRI plugin, which is not connected on %s; %s are refused until it is (enable NRI in the container runtime and run the NRI plugin)", node, strings.Join(names, " and "))
}

// publishLoop keeps the Node's inventory annotation and shared-isolation
// condition current.
func (a *Agent) publishLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.KubeletSyncInterval.Duration)
	defer t.Stop()
	for {
		connected := a.nriConnected()
		msg := "the NRI plugin is connected: shared GPU units are isolated"
		if !connected {
			msg = a.nriMessage()
		}
		if err := a.opts.Publisher.SetSharedIsolation(ctx, connected, msg); err != nil {
			a.logger.Error(err, "Setting the shared-isolation condition")
		}
		if err := a.opts.Publisher.PublishInventory(ctx, a.Inventory()); err != nil {
			a.logger.Error(err, "Publishing the GPU inventory")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.publishNow:
		}
	}
}

// Inventory is the node's GPU inventory now, with the GPUs whose devices
// the agent withholds from whole and from shared use (state.inventoryView:
// a release only once the kubelet was sent the list that offers the GPU
// again).
func (a *Agent) Inventory() *api.GPUInventory {
	if a.state == nil {
		return BuildInventory(a.opts.Topology, a.model, a.cfg, a.health.Health(), a.nriConnected())
	}
	h, whole, shared := a.state.inventoryView()
	inv := BuildInventory(a.opts.Topology, a.model, a.cfg, h, a.nriConnected())
	inv.WithheldFromWhole, inv.WithheldFromShared = whole, shared
	return inv
}

// ModelGPU is the device model's view of a GPU of the topology.
func ModelGPU(g topology.GPU) devices.GPU {
	d := devices.GPU{Index: g.Index, UUID: g.UUID, NUMANode: g.NUMANode, MemoryMiB: g.MemoryMiB}
	if g.MIG != nil {
		d.MIGMode = true
		for _, in := range g.MIG.Instances {
			d.MIG = append(d.MIG, devices.MIGInstance{UUID: in.UUID, Profile: in.Profile, Start: in.Start, Size: in.Size})
		}
	}
	return d
}

// logMIG says which GPUs are in MIG mode and what of them is served.
func (a *Agent) logMIG() {
	for _, g := range a.opts.Topology.GPUs {
		if g.MIG == nil {
			continue
		}
		var served, skipped []string
		for _, in := range g.MIG.Instances {
			if api.ValidMIGProfile(in.Profile) {
				served = append(served, in.Profile)
			} else {
				skipped = append(skipped, in.Profile+" "+in.UUID)
			}
		}
		a.logger.Info("GPU in MIG mode: offered only as its MIG instances", "gpu", g.Index, "uuid", g.UUID, "instances", served)
		if len(skipped) > 0 {
			a.logger.Info("WARNING: MIG instances of profiles Tessera cannot serve as a resource are not advertised", "gpu", g.Index, "instances", skipped)
		}
	}
	for _, r := range a.absentMIG {
		a.logger.Info("WARNING: a configured MIG resource has no instance on this node; not served", "resource", r)
	}
}

// BuildInventory renders the node's GPUs for the inventory annotation.
// Resources are the model's (the served ones, MIG included).
func BuildInventory(t *topology.Topology, m *devices.Model, cfg *api.NodeAgentConfig, h devices.HealthMap, nri bool) *api.GPUInventory {
	inv := &api.GPUInventory{
		APIVersion:       api.Version,
		Kind:             api.KindGPUInventory,
		MemoryUnitMiB:    cfg.MemoryUnitMiB,
		MemoryReserveMiB: cfg.MemoryReserveMiB,
		SharedIsolation:  nri,
		GPUs:             []api.InventoryGPU{},
		Links:            [][]string{},
		NVLinkCliques:    [][]int{},
	}
	for _, r := range m.Resources() {
		inv.Resources = append(inv.Resources, string(r))
	}
	for _, g := range t.GPUs {
		s := h.Of(g.UUID)
		units := 0
		if slices.Contains(m.Resources(), api.ResourceGPUMemory) {
			units = m.Units(api.ResourceGPUMemory, ModelGPU(g))
		}
		ig := api.InventoryGPU{Index: g.Index, UUID: g.UUID, Model: g.Model, MemoryMiB: g.MemoryMiB, MemoryUnits: units, NUMANode: g.NUMANode, Healthy: s.Healthy}
		if !s.Healthy {
			ig.Reason = s.Reason
		}
		if g.MIG != nil {
			ig.MIG = &api.InventoryMIG{Instances: []api.InventoryMIGInstance{}}
			for _, in := range g.MIG.Instances {
				if !api.ValidMIGProfile(in.Profile) {
					continue // not served (logged at start)
				}
				ig.MIG.Instances = append(ig.MIG.Instances, api.InventoryMIGInstance{
					UUID:         in.UUID,
					Profile:      in.Profile,
					MIGPlacement: api.MIGPlacement{Start: in.Start, Size: in.Size},
					Healthy:      s.Healthy,
				})
			}
		}
		inv.GPUs = append(inv.GPUs, ig)
	}
	for i, row := range t.Links {
		out := make([]string, len(row))
		for j, l := range row {
			switch {
			case i == j:
				out[j] = "X"
			case l.Type == topology.LinkNVSwitch:
				out[j] = fmt.Sprintf("NVS%d", l.NVLinks)
			case l.Type == topology.LinkNVLink:
				out[j] = fmt.Sprintf("NV%d", l.NVLinks)
			default:
				out[j] = l.PCIe
			}
		}
		inv.Links = append(inv.Links, out)
	}
	for _, c := range t.NVLinkCliques {
		inv.NVLinkCliques = append(inv.NVLinkCliques, append([]int(nil), c...))
	}
	return inv
}
