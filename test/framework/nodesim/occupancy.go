package nodesim

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/api"
)

// GPUOccupancy is what the pods bound to a node use of one GPU, from their
// assignment annotations.
type GPUOccupancy struct {
	GPU       api.InventoryGPU
	ReserveMi uint64
	Whole     []string // namespace/pod
	Shared    []string
	MemoryMiB int64
	Cores     int64
}

// NodeOccupancy is one node's GPUs.
type NodeOccupancy struct {
	Name, Profile string
	GPUs          []*GPUOccupancy
	Err           string
}

// PodCounts counts pods by phase; Pending are listed with their reason.
type PodCounts struct {
	Running, Failed int
	Pending         []string
}

// Occupancy reads every node's inventory and every unfinished bound pod's
// assignment.
func Occupancy(ctx context.Context, client kubernetes.Interface) ([]*NodeOccupancy, PodCounts, error) {
	var counts PodCounts
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, counts, err
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, counts, err
	}
	byNode := map[string]map[string]*GPUOccupancy{}
	var out []*NodeOccupancy
	for _, n := range nodes.Items {
		no := &NodeOccupancy{Name: n.Name, Profile: n.Labels[LabelProfile]}
		out = append(out, no)
		inv, ok, err := api.GetGPUInventory(n.Annotations)
		if !ok || err != nil {
			no.Err = fmt.Sprintf("no GPU inventory (%v)", err)
			continue
		}
		byNode[n.Name] = map[string]*GPUOccupancy{}
		for _, g := range inv.GPUs {
			o := &GPUOccupancy{GPU: g, ReserveMi: inv.MemoryReserveMiB}
			no.GPUs = append(no.GPUs, o)
			byNode[n.Name][g.UUID] = o
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	for _, p := range pods.Items {
		who := p.Namespace + "/" + p.Name
		switch p.Status.Phase {
		case v1.PodRunning:
			counts.Running++
		case v1.PodFailed:
			counts.Failed++
			continue
		case v1.PodSucceeded:
			continue
		default:
			if p.Spec.NodeName == "" {
				counts.Pending = append(counts.Pending, who+": "+pendingReason(&p))
			} else {
				counts.Pending = append(counts.Pending, who+": starting on "+p.Spec.NodeName)
			}
		}
		if p.Spec.NodeName == "" || byNode[p.Spec.NodeName] == nil {
			continue
		}
		a, ok, err := api.GetAssignment(p.Annotations)
		if !ok || err != nil {
			continue
		}
		for _, ca := range a.Containers {
			for _, g := range ca.GPUs {
				if o := byNode[p.Spec.NodeName][g.UUID]; o != nil && !contains(o.Whole, who) {
					o.Whole = append(o.Whole, who)
				}
			}
			if s := ca.Shared; s != nil {
				if o := byNode[p.Spec.NodeName][s.GPU.UUID]; o != nil {
					if !contains(o.Shared, who) {
						o.Shared = append(o.Shared, who)
					}
					o.MemoryMiB += s.MemoryMiB
					o.Cores += s.Cores
				}
			}
		}
	}
	sort.Strings(counts.Pending)
	return out, counts, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func pendingReason(p *v1.Pod) string {
	if api.HasGangGate(p) {
		return "gang member held until the whole gang fits"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == v1.PodScheduled && c.Status == v1.ConditionFalse {
			msg := c.Message
			if len(msg) > 200 {
				msg = msg[:200] + "..."
			}
			return msg
		}
	}
	return "waiting for the scheduler"
}

// RenderOccupancy writes a per-node, per-GPU table.
func RenderOccupancy(w io.Writer, nodes []*NodeOccupancy, counts PodCounts) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tMACHINE\tGPU\tMODEL\tUSE\tMEMORY\tCOMPUTE\tPODS")
	for _, n := range nodes {
		if n.Err != "" {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t%s\t\t\t\n", n.Name, n.Profile, n.Err)
			continue
		}
		for i, g := range n.GPUs {
			name, prof := "", ""
			if i == 0 {
				name, prof = n.Name, n.Profile
			}
			model := strings.TrimPrefix(g.GPU.Model, "NVIDIA ")
			total := int64(g.GPU.MemoryMiB - g.ReserveMi)
			use, mem, cores, pods := "free", bar(0, total), "", ""
			switch {
			case !g.GPU.Healthy:
				use = "UNHEALTHY " + g.GPU.Reason
			case len(g.Whole) > 0:
				use, mem, cores, pods = "whole", bar(total, total), "100%", strings.Join(g.Whole, " ")
				if len(g.Shared) > 0 {
					use = "WHOLE+SHARED!"
				}
			case len(g.Shared) > 0:
				use, mem, cores, pods = "shared", bar(g.MemoryMiB, total), fmt.Sprintf("%d%%", g.Cores), strings.Join(g.Shared, " ")
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", name, prof, g.GPU.Index, model, use, mem, cores, pods)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\npods: %d Running, %d Pending, %d Failed\n", counts.Running, len(counts.Pending), counts.Failed)
	for _, p := range counts.Pending {
		fmt.Fprintf(w, "  pending %s\n", p)
	}
}

func bar(used, total int64) string {
	const width = 10
	if total <= 0 {
		return ""
	}
	k := int(used * width / total)
	if used > 0 && k == 0 {
		k = 1
	}
	if k > width {
		k = width
	}
	return fmt.Sprintf("[%s%s] %5.1f/%.0fGi", strings.Repeat("#", k), strings.Repeat(".", width-k), float64(used)/1024, float64(total)/1024)
}
