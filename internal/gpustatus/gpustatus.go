// Package gpustatus is the per-node, per-GPU occupancy view that `make
// demo`'s live table, `kubectl tessera status` and the extender's
// /status endpoints show: the model (JSON-tagged, the extender serves it),
// how it is built from Node and Pod objects, and its text table.
//
// FromObjects reads pods' assignment annotations as they are: callers pass
// pods that went through podtrust.Filter (the extender's informers, the
// kubectl plugin), so a tenant's annotation is never shown as Tessera's
// decision.
package gpustatus

import (
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Cluster is the occupancy of every node with a GPU inventory, and the
// pods by phase.
type Cluster struct {
	Nodes []*Node   `json:"nodes"`
	Pods  PodCounts `json:"pods"`
}

// Node is one node's GPUs.
type Node struct {
	Name string `json:"name"`
	// Machine is a free description of the node (the demo's mock machine
	// profile); may be empty.
	Machine string `json:"machine,omitempty"`
	GPUs    []*GPU `json:"gpus"`
	// Err says why the node's GPUs are unknown (no or a malformed
	// inventory).
	Err string `json:"error,omitempty"`
	// Cordoned: the node is unschedulable (kubectl cordon): its free GPUs
	// take no new pod.
	Cordoned bool `json:"cordoned,omitempty"`
	// Unrecorded are the pods holding whole GPUs of the node that the
	// node agent has not named yet ("namespace/name: N GPU(s)").
	Unrecorded []string `json:"unrecorded,omitempty"`
	// UnrecordedMIG are the pods holding MIG instances of the node that
	// the node agent has not named yet ("namespace/name: 1 MIG instance
	// 1g.5gb").
	UnrecordedMIG []string `json:"unrecordedMIG,omitempty"`
}

// GPU is what the pods on a node use of one GPU.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// MemoryMiB is the memory the GPU shares out (its memory units times
	// the unit size).
	MemoryMiB int64  `json:"memoryMiB"`
	Healthy   bool   `json:"healthy"`
	Reason    string `json:"reason,omitempty"`
	// Whole and Shared are the pods (namespace/name) holding the GPU whole
	// and those with a slice of it; MemoryUsedMiB and Cores sum the
	// pods' slices, each pod's at its peak (gpureq.AssignedSlicePeaks: an
	// init container's slice is not added to the app containers').
	Whole         []string `json:"whole,omitempty"`
	Shared        []string `json:"shared,omitempty"`
	MemoryUsedMiB int64    `json:"memoryUsedMiB,omitempty"`
	Cores         int64    `json:"cores,omitempty"`
	// MIG is set when the GPU is in MIG mode: it is then offered only as
	// its MIG instances, never whole or as slices (MemoryMiB 0).
	MIG *MIG `json:"mig,omitempty"`
}

// MIG is the use of a GPU in MIG mode: its instances as the node's
// inventory lists them, and the pods holding them.
type MIG struct {
	Instances []MIGInstance `json:"instances"`
}

// MIGInstance is one MIG instance of a GPU.
type MIGInstance struct {
	UUID    string `json:"uuid"`
	Profile string `json:"profile"`
	// Healthy is false when the instance or its GPU is unhealthy.
	Healthy bool `json:"healthy"`
	// Pod is the pod (namespace/name) holding the instance; empty when
	// it is free.
	Pod string `json:"pod,omitempty"`
}

// Used counts the instances a pod holds.
func (m *MIG) Used() int {
	n := 0
	for _, in := range m.Instances {
		if in.Pod != "" {
			n++
		}
	}
	return n
}

// Pods are the pods holding instances, once each, in instance order.
func (m *MIG) Pods() []string {
	var out []string
	for _, in := range m.Instances {
		if in.Pod != "" && !slices.Contains(out, in.Pod) {
			out = append(out, in.Pod)
		}
	}
	return out
}

// Use is how a GPU is used: "free", "whole", "shared", "mig" (in MIG
// mode: offered as MIG instances only, whether pods hold them or not),
// "unhealthy", or "whole+shared" (over-committed: two kinds on one GPU).
func (g *GPU) Use() string {
	switch {
	case !g.Healthy:
		return UseUnhealthy
	case g.MIG != nil:
		return UseMIG
	case len(g.Whole) > 0 && len(g.Shared) > 0:
		return UseOvercommitted
	case len(g.Whole) > 0:
		return UseWhole
	case len(g.Shared) > 0:
		return UseShared
	}
	return UseFree
}

// Values of GPU.Use.
const (
	UseFree          = "free"
	UseWhole         = "whole"
	UseShared        = "shared"
	UseMIG           = "mig"
	UseUnhealthy     = "unhealthy"
	UseOvercommitted = "whole+shared"
)

// PodCounts counts pods by phase; Pending lists the pending ones as
// "namespace/name: reason".
type PodCounts struct {
	Running int      `json:"running"`
	Failed  int      `json:"failed"`
	Pending []string `json:"pending,omitempty"`
}

// AddWhole records pod as holding g whole (once).
func (g *GPU) AddWhole(pod string) {
	if !slices.Contains(g.Whole, pod) {
		g.Whole = append(g.Whole, pod)
	}
}

// AddShared records pod's slices of g: what they take of it at once, at
// the pod's peak (gpureq.PeakAmount); call it once per pod and GPU.
func (g *GPU) AddShared(pod string, memMiB, cores int64) {
	if !slices.Contains(g.Shared, pod) {
		g.Shared = append(g.Shared, pod)
	}
	g.MemoryUsedMiB += memMiB
	g.Cores += cores
}

// AddMIG records pod as holding g's MIG instance uuid; false when g lists
// no such instance (it is not in MIG mode, or its layout changed).
func (g *GPU) AddMIG(pod, uuid string) bool {
	if g.MIG == nil {
		return false
	}
	for i := range g.MIG.Instances {
		if in := &g.MIG.Instances[i]; in.UUID == uuid {
			in.Pod = pod
			return true
		}
	}
	return false
}

// NewMIG is the use of a GPU in MIG mode with inventory layout m, no
// instance held; nil when m is nil (the GPU is not in MIG mode).
// gpuHealthy is the GPU's health, which its instances share.
func NewMIG(m *api.InventoryMIG, gpuHealthy bool) *MIG {
	if m == nil {
		return nil
	}
	out := &MIG{Instances: make([]MIGInstance, 0, len(m.Instances))}
	for _, in := range m.Instances {
		out.Instances = append(out.Instances, MIGInstance{UUID: in.UUID, Profile: in.Profile, Healthy: in.Healthy && gpuHealthy})
	}
	return out
}

// NodeFromInventory returns a node's GPUs, unused, from its inventory
// annotation; Err is set when there is none or it is malformed.
func NodeFromInventory(node *corev1.Node, machineLabel string) *Node {
	n := &Node{Name: node.Name, Cordoned: node.Spec.Unschedulable}
	if machineLabel != "" {
		n.Machine = node.Labels[machineLabel]
	}
	inv, ok, err := api.GetGPUInventory(node.Annotations)
	switch {
	case err != nil:
		n.Err = fmt.Sprintf("malformed GPU inventory: %v", err)
		return n
	case !ok:
		n.Err = "no GPU inventory"
		return n
	}
	for _, g := range inv.GPUs {
		n.GPUs = append(n.GPUs, &GPU{Index: g.Index, UUID: g.UUID, Model: g.Model,
			MemoryMiB: int64(g.MemoryUnits) * int64(inv.MemoryUnitMiB), Healthy: g.Healthy, Reason: g.Reason, MIG: NewMIG(g.MIG, g.Healthy)})
	}
	return n
}

// FromObjects builds the occupancy from nodes and pods: every node's
// inventory, and every unfinished bound pod's assignment. Pods must have
// been sanitized (podtrust.Filter): their assignments are taken as
// Tessera's. machineLabel names the node label shown as Machine ("" for
// none). Nodes come out sorted by name.
func FromObjects(nodes []corev1.Node, pods []corev1.Pod, machineLabel string) *Cluster {
	c := &Cluster{}
	byNode := map[string]map[string]*GPU{}
	nodeOf := map[string]*Node{}
	for i := range nodes {
		n := NodeFromInventory(&nodes[i], machineLabel)
		c.Nodes = append(c.Nodes, n)
		if n.Err != "" {
			continue
		}
		nodeOf[n.Name] = n
		byNode[n.Name] = map[string]*GPU{}
		for _, g := range n.GPUs {
			byNode[n.Name][g.UUID] = g
		}
	}
	sort.Slice(c.Nodes, func(i, j int) bool { return c.Nodes[i].Name < c.Nodes[j].Name })
	ptrs := make([]*corev1.Pod, len(pods))
	for i := range pods {
		ptrs[i] = &pods[i]
	}
	running := GangsRunning(ptrs)
	for i := range pods {
		p := &pods[i]
		who := p.Namespace + "/" + p.Name
		switch p.Status.Phase {
		case corev1.PodRunning:
			c.Pods.Running++
		case corev1.PodFailed:
			c.Pods.Failed++
			continue
		case corev1.PodSucceeded:
			continue
		default:
			if p.Spec.NodeName == "" {
				c.Pods.Pending = append(c.Pods.Pending, who+": "+PendingReason(p, running))
			} else {
				c.Pods.Pending = append(c.Pods.Pending, who+": starting on "+p.Spec.NodeName)
			}
		}
		gpus := byNode[p.Spec.NodeName]
		if p.Spec.NodeName == "" || gpus == nil {
			continue
		}
		a, ok, err := api.GetAssignment(p.Annotations)
		if err != nil {
			a, ok = nil, false
		}
		addUnrecorded(nodeOf[p.Spec.NodeName], who, p, a)
		if !ok {
			continue
		}
		// Every GPU and instance the pod holds, each once
		// (gpureq.Recorded): a regular init container's, recorded for it
		// and for the container the kubelet handed them on to, are held
		// until the pod ends.
		whole, mig := gpureq.Recorded(a)
		for _, g := range whole {
			if o := gpus[g.UUID]; o != nil {
				o.AddWhole(who)
			}
		}
		for _, m := range mig {
			if o := gpus[m.GPU.UUID]; o != nil {
				o.AddMIG(who, m.UUID)
			}
		}
		// A slice counts at the pod's peak (gpureq.AssignedSlicePeaks, as
		// the extender's fit counts it): an init container's slice is gone
		// once the containers after it run. A multi-GPU slice is on each
		// of its GPUs.
		for uuid, amount := range gpureq.AssignedSlicePeaks(p, a) {
			if o := gpus[uuid]; o != nil {
				o.AddShared(who, amount.MemMiB, amount.Cores)
			}
		}
	}
	sort.Strings(c.Pods.Pending)
	for _, n := range c.Nodes {
		sort.Strings(n.Unrecorded)
		sort.Strings(n.UnrecordedMIG)
	}
	return c
}

// addUnrecorded lists on n what pod p (who) holds that its assignment a
// (nil when it has none) does not name yet (gpureq.Unrecorded, the rule
// the extender's ledger counts by).
func addUnrecorded(n *Node, who string, p *corev1.Pod, a *api.Assignment) {
	if n == nil {
		return
	}
	d, err := gpureq.ParsePod(p)
	if err != nil {
		return
	}
	whole, mig := gpureq.Unrecorded(d.Holds(), a)
	if whole > 0 {
		n.Unrecorded = append(n.Unrecorded, UnrecordedLine(who, whole))
	}
	if len(mig) > 0 {
		n.UnrecordedMIG = append(n.UnrecordedMIG, who+": "+DescribeMIG(mig))
	}
}

// UnrecordedLine is Node.Unrecorded's line for a pod (who) holding n whole
// GPUs the node agent has not named yet.
func UnrecordedLine(who string, n int) string { return fmt.Sprintf("%s: %d GPU(s)", who, n) }

// DescribeMIG says how many MIG instances of each profile n counts, in
// profile name order: "2 MIG instances 1g.5gb, 1 MIG instance 3g.20gb".
func DescribeMIG(n map[string]int) string {
	profiles := make([]string, 0, len(n))
	for p := range n {
		profiles = append(profiles, p)
	}
	sort.Strings(profiles)
	var parts []string
	for _, p := range profiles {
		if n[p] == 1 {
			parts = append(parts, "1 MIG instance "+p)
		} else {
			parts = append(parts, fmt.Sprintf("%d MIG instances %s", n[p], p))
		}
	}
	return strings.Join(parts, ", ")
}

// GangsRunning counts, by gang key (api.Gang.Key), the members of each
// gang that are bound and have not ended.
func GangsRunning(pods []*corev1.Pod) map[string]int {
	out := map[string]int{}
	for _, p := range pods {
		if p.Spec.NodeName == "" || gpureq.Ended(p) {
			continue
		}
		if g, member, err := api.GangOf(p); member && err == nil {
			out[g.Key()]++
		}
	}
	return out
}

// PendingReason says in a line why an unbound pod waits: the room its
// plan holds, a Tessera gate, else the scheduler's PodScheduled
// condition. running counts the bound members of each gang
// (GangsRunning; nil when unknown): a gated member of a gang that runs
// waits as an extra member, not for its gang. p must have come through
// the trust filter (a plan its owner wrote is not Tessera's).
func PendingReason(p *corev1.Pod, running map[string]int) string {
	if plan, ok, err := api.GetGangPlan(p.Annotations); ok && err == nil {
		where := plan.Where()
		until := plan.Expires.UTC().Format(time.RFC3339)
		if _, member, _ := api.GangOf(p); member {
			return fmt.Sprintf("planned with its gang on %s, binding (the plan holds until %s)", where, until)
		}
		return fmt.Sprintf("the room freed for it (by preemption or quota reclaim) is held on %s until %s", where, until)
	}
	if api.HasGangGate(p) {
		if _, member, _ := api.GangOf(p); !member {
			if api.HasQueueGate(p) {
				return "held by its queue until admitted"
			}
			return "gang gate on a pod that declares no gang: Tessera lifts it"
		}
		if g, _, err := api.GangOf(p); err == nil && running[g.Key()] > 0 {
			n := running[g.Key()]
			return fmt.Sprintf("gang %s has %d member%s running; this one joins when room for it is free (an elastic gang's extra member, or held by its max-member cap)", g.Key(), n, plural(n))
		}
		return "gang member held until the whole gang fits"
	}
	if api.HasQueueGate(p) {
		return "held by its queue until admitted"
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return Truncate(c.Message, 200)
		}
	}
	return "waiting for the scheduler"
}

// ReservationLines describes the planner's reservation records at now, one
// line each, sorted: the workloads holding nodes and since when, and those
// whose reservation ran out and that may not reserve again yet (the
// records of workloads free to reserve again say nothing).
func ReservationLines(recs []api.ReservationRecord, now time.Time) []string {
	var lines []string
	for _, r := range recs {
		who := api.WorkloadName(r.Workload)
		switch {
		case r.Since != nil:
			lines = append(lines, fmt.Sprintf("%s: nodes %s reserved for it since %s (%s ago)", who, strings.Join(r.Nodes, ", "),
				r.Since.UTC().Format(time.RFC3339), now.Sub(*r.Since).Round(time.Second)))
		case r.NotBefore != nil && r.NotBefore.After(now):
			lines = append(lines, fmt.Sprintf("%s: its reservation ran out; it may reserve again after %s", who, r.NotBefore.UTC().Format(time.RFC3339)))
		}
	}
	sort.Strings(lines)
	return lines
}

// Truncate cuts s to at most n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Render writes the per-node, per-GPU table and the pod counts.
func Render(w io.Writer, c *Cluster) error {
	machine := false
	for _, n := range c.Nodes {
		machine = machine || n.Machine != ""
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	row := func(cols ...string) {
		if !machine {
			cols = append(cols[:1], cols[2:]...)
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	row("NODE", "MACHINE", "GPU", "MODEL", "USE", "MEMORY", "COMPUTE", "PODS")
	for _, n := range c.Nodes {
		nodeName := n.Name
		if n.Cordoned {
			nodeName += " (cordoned)"
		}
		if n.Err != "" {
			row(nodeName, n.Machine, "-", "-", n.Err, "", "", "")
			continue
		}
		for i, g := range n.GPUs {
			name, mach := "", ""
			if i == 0 {
				name, mach = nodeName, n.Machine
			}
			use, mem, cores, pods := g.Use(), Bar(0, g.MemoryMiB), "", ""
			switch use {
			case UseFree:
				if n.Cordoned {
					use = "free, cordoned"
				}
			case UseUnhealthy:
				use = strings.TrimSpace("UNHEALTHY " + g.Reason)
			case UseWhole, UseOvercommitted:
				mem, cores, pods = Bar(g.MemoryMiB, g.MemoryMiB), "100%", strings.Join(g.Whole, " ")
				if use == UseOvercommitted {
					use = "WHOLE+SHARED!"
					pods += " " + strings.Join(g.Shared, " ")
				}
			case UseShared:
				mem, cores, pods = Bar(g.MemoryUsedMiB, g.MemoryMiB), fmt.Sprintf("%d%%", g.Cores), strings.Join(g.Shared, " ")
			case UseMIG:
				mem, pods = g.MIG.Summary(), g.MIG.Holders()
			}
			row(name, mach, fmt.Sprint(g.Index), ShortModel(g.Model), use, mem, cores, pods)
		}
		for _, u := range n.Unrecorded {
			row("", "", "?", "", "whole", "", "", u+", GPUs not recorded yet")
		}
		for _, u := range n.UnrecordedMIG {
			row("", "", "?", "", UseMIG, "", "", u+", instances not recorded yet")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\npods: %d Running, %d Pending, %d Failed\n", c.Pods.Running, len(c.Pods.Pending), c.Pods.Failed)
	for _, p := range c.Pods.Pending {
		if _, err := fmt.Fprintf(w, "  pending %s\n", p); err != nil {
			return err
		}
	}
	return nil
}

// Summary says how many of the instances pods hold: "2/3 instances
// used", and how many are unhealthy.
func (m *MIG) Summary() string {
	s := fmt.Sprintf("%d/%d instances used", m.Used(), len(m.Instances))
	bad := 0
	for _, in := range m.Instances {
		if !in.Healthy {
			bad++
		}
	}
	if bad > 0 {
		s += fmt.Sprintf(", %d unhealthy", bad)
	}
	return s
}

// Holders lists the pods holding instances with their profiles:
// "ns/a (1g.5gb) ns/b (3g.20gb, 1g.5gb)".
func (m *MIG) Holders() string {
	var parts []string
	for _, pod := range m.Pods() {
		var profiles []string
		for _, in := range m.Instances {
			if in.Pod == pod {
				profiles = append(profiles, in.Profile)
			}
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", pod, strings.Join(profiles, ", ")))
	}
	return strings.Join(parts, " ")
}

// ShortModel drops the vendor prefix of an NVML product name.
func ShortModel(model string) string { return strings.TrimPrefix(model, "NVIDIA ") }

// BarWidth is the number of cells of a Bar.
const BarWidth = 10

// Cells is how many of BarWidth cells used of total fills (at least one
// when anything is used).
func Cells(used, total int64) int {
	if total <= 0 {
		return 0
	}
	k := int(used * BarWidth / total)
	if used > 0 && k == 0 {
		k = 1
	}
	return min(k, BarWidth)
}

// Bar draws used of total MiB as "[###.......]  12.0/40Gi".
func Bar(used, total int64) string {
	if total <= 0 {
		return ""
	}
	k := Cells(used, total)
	return fmt.Sprintf("[%s%s] %5.1f/%.0fGi", strings.Repeat("#", k), strings.Repeat(".", BarWidth-k), float64(used)/1024, float64(total)/1024)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
