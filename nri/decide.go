package nri

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// Device numbers of the NVIDIA driver's character devices.
const (
	// NVIDIAMajor is the major number of /dev/nvidia<N> and /dev/nvidiactl.
	NVIDIAMajor = 195
	// NVIDIACtlMinor is the minor number of /dev/nvidiactl.
	NVIDIACtlMinor = 255
	// UVMMinor and UVMToolsMinor are the minors of /dev/nvidia-uvm and
	// /dev/nvidia-uvm-tools (whose major the kernel assigns at load time).
	UVMMinor      = 0
	UVMToolsMinor = 1
)

// Options are the static inputs of Decide.
type Options struct {
	// MemoryUnitMiB is the size of one tessera.dev/gpu-memory device.
	MemoryUnitMiB uint64
	// MemoryReserveMiB is kept back on every GPU: shared containers may
	// use the rest.
	MemoryReserveMiB uint64
	// CDI makes Decide add the container's GPUs as CDI devices (kind
	// CDIKind, named by CDIDeviceName) rather than as device nodes.
	CDI           bool
	CDIKind       string
	CDIDeviceName string
	// UVMMajor is the major number of /dev/nvidia-uvm (see UVMMajor in
	// /proc/devices); negative when unknown, then the UVM nodes are
	// neither added nor ruled.
	UVMMajor int64
	// NonGPU says what to do with containers that hold no Tessera
	// resource; the zero value hides every GPU from them.
	NonGPU NonGPU
	// MPSPipeDir returns the host directory of the MPS pipes of the control
	// daemon of an MPS group (gpureq.GroupKey: a GPU's UUID alone, or the
	// UUIDs of a multi-GPU slice's GPUs).
	MPSPipeDir func(group string) string
	// Policy places the shared slice of a pod that bypassed the scheduler
	// extender (no assignment for the container).
	Policy allocator.Policy
	// MIGCaps are the nvidia-caps devices of MIG instances, added as
	// device nodes when CDI is off (ReadMIGCaps); unknown: none.
	MIGCaps MIGCaps
}

// usage is what the other containers of the ledger use.
type usage struct {
	whole       map[string]Entry
	mig         map[string]Entry // MIG UUID -> its user
	sharedBy    map[string][]Entry
	sharedMem   map[string]int64
	sharedCores map[string]int64
	// groups are the GPUs' MPS groups (gpureq.Groups).
	groups gpureq.Groups
}

func ledgerUsage(entries []Entry, except Key) usage {
	u := usage{whole: map[string]Entry{}, mig: map[string]Entry{}, sharedBy: map[string][]Entry{}, sharedMem: map[string]int64{}, sharedCores: map[string]int64{}}
	for _, e := range entries {
		if e.Key() == except {
			continue
		}
		for _, g := range e.GPUs {
			u.whole[g.UUID] = e
		}
		for _, m := range e.MIG {
			u.mig[m.UUID] = e
		}
		if s := e.Shared; s != nil {
			for _, g := range s.GPUs() {
				u.sharedBy[g.UUID] = append(u.sharedBy[g.UUID], e)
				u.sharedMem[g.UUID] += s.MemoryMiB
				u.sharedCores[g.UUID] += s.Cores
			}
			u.groups.Add(s.UUIDs())
		}
	}
	return u
}

// Decide decides how the container of req is created on node: a Decision
// (ActionIsolate for a container that holds Tessera resources, ActionVoid or
// ActionLeave for one that holds none, see decideNonGPU), or a
// *DecisionError when the container must not be created (fail closed).
func Decide(opts Options, node *Node, req Request) (*Decision, error) {
	if req.Devices.Empty() {
		return decideNonGPU(opts, req), nil
	}
	pod, ctr := req.Pod, req.Container
	refuse := func(code gpureq.Code, gpu, format string, args ...any) error {
		return &DecisionError{Pod: pod.String(), Container: ctr.Name, GPU: gpu, Reason: fmt.Sprintf(format, args...), Code: code}
	}
	fail := func(gpu, format string, args ...any) error { return refuse("", gpu, format, args...) }
	assignment, found, err := api.GetAssignment(pod.Annotations)
	if err != nil {
		return nil, fail("", "%v", err)
	}
	var ca *api.ContainerAssignment
	if found {
		ca = assignment.Container(ctr.Name)
	}
	u := ledgerUsage(node.Ledger, Key{PodUID: pod.UID, Container: ctr.Name})

	// The container's request, as the kubelet allocated it (gpureq's
	// rules), split over its GPU count: its assignment's GPUs (Tessera's
	// sealed decision), or for a slice placed here the pod's
	// api.AnnotationGPUCount.
	held := gpureq.Container{Name: ctr.Name, Whole: int64(len(req.Devices.Whole)), MemUnits: int64(req.Devices.MemoryUnits), Cores: int64(req.Devices.CoreUnits)}
	count := 1
	if held.Shared() {
		if ca != nil && ca.Shared != nil {
			count = 1 + len(ca.Shared.Spread)
		} else if count, _, err = api.GetGPUCount(pod.Annotations); err != nil {
			return nil, refuse(gpureq.CodeInvalidGPUCount, "", "%v", err)
		}
	}
	per, r := held.PerGPU(count)
	if r != nil {
		return nil, refuse(r.Code, "", "the container holds %d %s and %d %s units, which its %d GPUs do not split evenly", held.MemUnits, api.ResourceGPUMemory, held.Cores, api.ResourceGPUCore, count)
	}
	if r := per.Check(); r != nil {
		switch r.Code {
		case gpureq.CodeWholeAndShared:
			return nil, refuse(r.Code, "", "the container holds whole GPUs (%s) and shared units (%s, %s) at once; an MPS client sees only its MPS server's GPUs, so the two cannot be isolated together: put them in separate containers", api.ResourceGPU, api.ResourceGPUMemory, api.ResourceGPUCore)
		case gpureq.CodeCoresAboveGPU:
			if count > 1 {
				return nil, refuse(r.Code, "", "the container holds %d %s units over %d GPUs, %d on each, more than one GPU's %d", held.Cores, api.ResourceGPUCore, count, per.Cores, api.CoresPerGPU)
			}
			return nil, refuse(r.Code, "", "the container holds %d %s units, more than one GPU's %d", held.Cores, api.ResourceGPUCore, api.CoresPerGPU)
		default:
			return nil, refuse(r.Code, "", "%v", r)
		}
	}
	if len(req.Devices.MIG) > 0 && (held.Whole > 0 || held.Shared()) {
		return nil, refuse(gpureq.CodeMIGAndOther, "", "the container holds MIG instances (%s) and whole GPUs or shared units at once: use one kind of GPU resource per container", api.ResourceMIGPrefix+"<profile>")
	}
	mig, migGPUs, err := decideMIG(node, u, pod, req.Devices.MIG, ca)
	if err != nil {
		de := err.(*DecisionError)
		de.Pod, de.Container = pod.String(), ctr.Name
		return nil, de
	}

	// Whole GPUs: the kubelet's allocation is what the container gets.
	var whole []GPU
	seen := map[string]bool{}
	for _, id := range req.Devices.Whole {
		g, ok := node.GPU(id)
		if !ok {
			return nil, fail(id, "the kubelet allocated it but it is not a GPU of this node")
		}
		if seen[id] {
			return nil, fail(id, "allocated twice to the container")
		}
		seen[id] = true
		if g.MIGMode {
			return nil, fail(id, "in MIG mode: it serves only as its MIG instances, never whole")
		}
		if reason, bad := node.Unhealthy[id]; bad {
			return nil, fail(id, "unhealthy: %s", reason)
		}
		// The kubelet reuses an init container's devices for the app
		// containers of its pod.
		if e, used := u.whole[id]; used && e.PodUID != pod.UID {
			return nil, fail(id, "already allocated whole to %s", e)
		}
		if es := u.sharedBy[id]; gpureq.CheckWhole(gpureq.GPUUse{Shared: len(es) > 0}) != nil {
			return nil, refuse(gpureq.CodeGPUServesShared, id, "serves %d shared container(s) (%s) and cannot also be used whole", len(es), es[0])
		}
		whole = append(whole, g)
	}
	sort.Slice(whole, func(i, j int) bool { return whole[i].Index < whole[j].Index })
	if ca != nil && len(ca.GPUs) > 0 {
		if err := sameGPUs(node, ca.GPUs, whole); err != nil {
			return nil, fail("", "the assignment annotation and the kubelet disagree on the container's whole GPUs: %v", err)
		}
	}
	if err := checkVisibleDevicesEnv(node, ctr.Env, whole, mig); err != nil {
		return nil, fail("", "%v", err)
	}
	if err := checkCDIDevices(opts, node, ctr.CDIDevices, whole, mig); err != nil {
		return nil, fail("", "%v", err)
	}
	if err := checkVolumeMountList(node, ctr.MountDestinations, whole, mig); err != nil {
		return nil, fail("", "%v", err)
	}

	// Shared slice: the extender's assignment, or a local placement. What
	// the container holds on each of its GPUs is its share of one GPU
	// resolved on this node (gpureq.Resolve): a core-only slice gets cores%
	// of the node's slice base as its memory limit, as the extender sized
	// it.
	var shared *api.SharedGPU
	placed := false
	if held.Shared() {
		entitled := gpureq.Resolve(per, int64(opts.MemoryUnitMiB), sliceBaseMiB(opts, node))
		var s api.SharedGPU
		if ca != nil && ca.Shared != nil {
			for _, ref := range ca.Shared.GPUs() {
				g, ok := node.GPU(ref.UUID)
				if !ok {
					return nil, fail(ref.UUID, "assigned by the annotation but not a GPU of this node")
				}
				if g.Index != ref.Index {
					return nil, fail(ref.UUID, "the assignment says index %d but it is GPU %d on this node", ref.Index, g.Index)
				}
			}
			var r *gpureq.Refusal
			if s, r = gpureq.GrantSlice(*ca.Shared, entitled); r != nil {
				each := ""
				if count > 1 {
					each = fmt.Sprintf(" on each of its %d GPUs", count)
				}
				switch {
				case ca.Shared.MemoryMiB > entitled.MemMiB && held.MemUnits > 0:
					return nil, refuse(r.Code, s.GPU.UUID, "the assignment gives %d MiB of GPU memory%s but the kubelet allocated only %d %s units (%d MiB%s)", r.Asked, each, held.MemUnits, api.ResourceGPUMemory, r.Capacity, each)
				case ca.Shared.MemoryMiB > entitled.MemMiB:
					return nil, refuse(r.Code, s.GPU.UUID, "the assignment gives %d MiB of GPU memory%s but the container's %d %s units without %s entitle it to %d MiB%s", r.Asked, each, held.Cores, api.ResourceGPUCore, api.ResourceGPUMemory, r.Capacity, each)
				default:
					return nil, refuse(r.Code, s.GPU.UUID, "the assignment gives %d%% of the GPU's compute%s but the kubelet allocated only %d %s units%s", r.Asked, each, held.Cores, api.ResourceGPUCore, strings.Replace(each, " on each of", ", "+strconv.FormatInt(r.Capacity, 10)+" on each of", 1))
				}
			}
		} else {
			if most := largestCapacityMiB(opts, node); entitled.MemMiB > most {
				return nil, refuse(gpureq.CodeSliceTooLarge, "", "the container's slice of %d MiB is more than any GPU of this node shares (%d MiB)", entitled.MemMiB, most)
			}
			refs, err := placeShared(opts, node, u, entitled, count)
			if err != nil {
				var r *gpureq.Refusal
				if errors.As(err, &r) {
					return nil, refuse(r.Code, "", "%v", r)
				}
				return nil, fail("", "the pod carries no assignment for the container's shared units and none of this node's GPUs can take them: %v", err)
			}
			s = api.SharedGPU{GPU: refs[0], MemoryMiB: entitled.MemMiB, Cores: entitled.Cores}
			if len(refs) > 1 {
				s.Spread = refs[1:]
			}
			placed = true
		}
		for _, ref := range s.GPUs() {
			id := ref.UUID
			g, _ := node.GPU(id)
			if g.MIGMode {
				return nil, fail(id, "in MIG mode: it serves only as its MIG instances, never shared units")
			}
			if reason, bad := node.Unhealthy[id]; bad {
				return nil, fail(id, "unhealthy: %s", reason)
			}
			if e, used := u.whole[id]; gpureq.CheckShared(gpureq.GPUUse{Whole: used}) != nil {
				return nil, refuse(gpureq.CodeGPUUsedWhole, id, "allocated whole to %s and cannot serve shared units", e)
			}
			used := gpureq.Amount{MemMiB: u.sharedMem[id], Cores: u.sharedCores[id]}
			if r := gpureq.FitSlice(sharedCapacity(opts, g), used, gpureq.Amount{MemMiB: s.MemoryMiB, Cores: s.Cores}); r != nil {
				if r.Code == gpureq.CodeMemoryOvercommitted {
					return nil, refuse(r.Code, id, "over-committed: %d MiB of its %d shared MiB are in use by %d container(s) and the container asks for %d MiB", r.Used, r.Capacity, len(u.sharedBy[id]), r.Asked)
				}
				return nil, refuse(r.Code, id, "over-committed: %d%% of its compute is in use by %d container(s) and the container asks for %d%%", r.Used, len(u.sharedBy[id]), r.Asked)
			}
		}
		if r := u.groups.Check(s.UUIDs()); r != nil {
			return nil, refuse(r.Code, s.GPU.UUID, "%v", r)
		}
		shared = &s
	}

	d := &Decision{
		Action: ActionIsolate,
		Entry: Entry{
			PodUID: pod.UID, Namespace: pod.Namespace, Pod: pod.Name,
			Container: ctr.Name, ContainerID: ctr.ID, Shared: shared, MIG: mig,
		},
		PlacedLocally: placed,
	}
	gpus := append([]GPU(nil), whole...)
	for _, g := range whole {
		d.Entry.GPUs = append(d.Entry.GPUs, api.GPURef{UUID: g.UUID, Index: g.Index})
	}
	if shared != nil {
		for _, ref := range shared.GPUs() {
			g, _ := node.GPU(ref.UUID)
			gpus = append(gpus, g)
		}
	}
	var caps []DeviceNode
	if !opts.CDI && len(mig) > 0 {
		uuids := make([]string, len(mig))
		for i, m := range mig {
			uuids[i] = m.UUID
		}
		if caps, err = migCapNodes(opts.MIGCaps, node, uuids); err != nil {
			return nil, fail("", "%v", err)
		}
	}
	d.Adjustment = adjustment(opts, node, pod, ctr, gpus, shared, mig, migGPUs)
	addCapNodes(&d.Adjustment, opts.MIGCaps, ctr, caps)
	if slices.Contains(ctr.MountDestinations, api.NRISentinelPath) {
		// Seen and isolated: the container may be created.
		d.Adjustment.RemoveMounts = append(d.Adjustment.RemoveMounts, api.NRISentinelPath)
	}
	return d, nil
}

// sharedCapacity is what shared containers of g may use
// (gpureq.GPUCapacity: memory less the reserve, in whole units, as the
// device plugin advertises it).
func sharedCapacity(opts Options, g GPU) gpureq.Amount {
	return gpureq.GPUCapacity(g.MemoryMiB, opts.MemoryReserveMiB, opts.MemoryUnitMiB)
}

// sliceBaseMiB is the memory a core-only slice takes its percentage of on
// node (gpureq.CoreOnlyBaseMiB over every GPU of the node).
func sliceBaseMiB(opts Options, node *Node) int64 {
	caps := make([]int64, 0, len(node.GPUs))
	for _, g := range node.GPUs {
		if !g.MIGMode { // a GPU in MIG mode shares nothing
			caps = append(caps, sharedCapacity(opts, g).MemMiB)
		}
	}
	return gpureq.CoreOnlyBaseMiB(caps...)
}

// largestCapacityMiB is the most memory one GPU of node shares.
func largestCapacityMiB(opts Options, node *Node) int64 {
	var most int64
	for _, g := range node.GPUs {
		if !g.MIGMode {
			most = max(most, sharedCapacity(opts, g).MemMiB)
		}
	}
	return most
}

// placeShared places a shared slice of count GPUs, slice on each, on the
// node the way the scheduler extender would have: a slice of one GPU with
// opts.Policy, a multi-GPU slice with gpureq.ChooseGPUs (the node agent
// knows no NVLink cliques here: lowest indices first); both under the
// group rule (gpureq.Groups). It returns the GPUs by index. A refusal of
// the request model is a *gpureq.Refusal.
func placeShared(opts Options, node *Node, u usage, slice gpureq.Amount, count int) ([]api.GPURef, error) {
	n := &allocator.Node{Name: "local"}
	var cands []gpureq.Candidate
	sharing := 0
	for _, g := range node.GPUs {
		capacity := sharedCapacity(opts, g).MemMiB
		ag := allocator.GPU{Index: g.Index, MemTotalMiB: capacity}
		_, unhealthy := node.Unhealthy[g.UUID]
		_, whole := u.whole[g.UUID]
		if !unhealthy && !g.MIGMode {
			sharing++
		}
		c := gpureq.Candidate{UUID: g.UUID, Index: g.Index}
		if !unhealthy && !g.MIGMode && gpureq.CheckShared(gpureq.GPUUse{Whole: whole}) == nil {
			ag.MemFreeMiB = max(0, capacity-u.sharedMem[g.UUID])
			ag.MilliFree = max(0, allocator.MilliPerGPU-gpureq.UsedCoresToMilli(u.sharedCores[g.UUID]))
			used := gpureq.Amount{MemMiB: u.sharedMem[g.UUID], Cores: u.sharedCores[g.UUID]}
			c.Room = gpureq.FitSlice(sharedCapacity(opts, g), used, slice) == nil
			c.FreeMiB = ag.MemFreeMiB
		}
		c.Group, _ = u.groups.Of(g.UUID)
		cands = append(cands, c)
		if u.groups.InSet(g.UUID) {
			ag.MemFreeMiB, ag.MilliFree = 0, 0 // a slice of one GPU cannot join a set's daemon
		}
		n.GPUs = append(n.GPUs, ag)
	}
	if count > 1 {
		if r := gpureq.CheckCount(count, sharing); r != nil {
			return nil, r
		}
		pos, ok := gpureq.ChooseGPUs(cands, count, nil, false)
		if !ok {
			return nil, fmt.Errorf("no %d GPUs have %d MiB and %d%% free each and serve no slices of other GPU sets", count, slice.MemMiB, slice.Cores)
		}
		out := make([]api.GPURef, len(pos))
		for i, p := range pos {
			out[i] = api.GPURef{UUID: node.GPUs[p].UUID, Index: node.GPUs[p].Index}
		}
		return out, nil
	}
	if opts.Policy == nil {
		return nil, fmt.Errorf("no local placement policy is configured")
	}
	r := allocator.Request{GPUMemMiB: slice.MemMiB, GPUMilli: gpureq.CoresToMilli(slice.Cores)}
	set, err := allocator.Place(opts.Policy, n, r)
	if err != nil {
		return nil, err
	}
	pos := set.Positions()
	if len(pos) != 1 {
		return nil, fmt.Errorf("policy %s chose %d GPUs for one slice", opts.Policy.Name(), len(pos))
	}
	g := node.GPUs[pos[0]]
	return []api.GPURef{{UUID: g.UUID, Index: g.Index}}, nil
}

// sameGPUs checks that the assignment's GPUs are the allocated ones.
func sameGPUs(node *Node, refs []api.GPURef, gpus []GPU) error {
	want := map[string]bool{}
	for _, g := range gpus {
		want[g.UUID] = true
	}
	for _, r := range refs {
		g, ok := node.GPU(r.UUID)
		if !ok {
			return fmt.Errorf("GPU %s of the annotation is not a GPU of this node", r.UUID)
		}
		if g.Index != r.Index {
			return fmt.Errorf("the annotation says GPU %s has index %d, this node says %d", r.UUID, r.Index, g.Index)
		}
		if !want[r.UUID] {
			return fmt.Errorf("annotation %s, kubelet %s", refList(refs), gpuList(gpus))
		}
	}
	if len(refs) != len(gpus) {
		return fmt.Errorf("annotation %s, kubelet %s", refList(refs), gpuList(gpus))
	}
	return nil
}

func refList(refs []api.GPURef) string {
	s := make([]string, len(refs))
	for i, r := range refs {
		s[i] = r.UUID
	}
	return "[" + strings.Join(s, ",") + "]"
}

func gpuList(gpus []GPU) string {
	s := make([]string, len(gpus))
	for i, g := range gpus {
		s[i] = g.UUID
	}
	return "[" + strings.Join(s, ",") + "]"
}

// visibleDevicesNoList are NVIDIA_VISIBLE_DEVICES values that name no GPU
// list: the device plugin's "void" (CDI or shared), the volume-mounts
// directory, and what images set.
func visibleDevicesIsList(v string) bool {
	switch v {
	case "", api.VisibleDevicesVoid, "none", "all":
		return false
	}
	return !strings.HasPrefix(v, "/")
}

// checkVisibleDevicesEnv cross-checks a device list the device plugin's
// Allocate put in NVIDIA_VISIBLE_DEVICES with the container's whole GPUs
// and MIG instances.
func checkVisibleDevicesEnv(node *Node, env map[string]string, whole []GPU, mig []api.MIGRef) error {
	v := env[api.EnvNVIDIAVisibleDevices]
	if !visibleDevicesIsList(v) {
		return nil
	}
	listed := map[string]bool{}
	for _, tok := range strings.Split(v, ",") {
		tok = strings.TrimSpace(tok)
		id, ok := resolveDevice(node, tok)
		if !ok {
			return fmt.Errorf("%s=%s names %q, which is not a GPU or MIG instance of this node", api.EnvNVIDIAVisibleDevices, v, tok)
		}
		listed[id] = true
	}
	own := ownDevices(whole, mig)
	same := len(listed) == len(own)
	for id := range own {
		same = same && listed[id]
	}
	if !same {
		return fmt.Errorf("%s=%s from the device plugin does not match the container's %s %s", api.EnvNVIDIAVisibleDevices, v, devicesNoun(mig), deviceList(whole, mig))
	}
	return nil
}

// ownDevices is the set of the container's device UUIDs: its whole GPUs'
// and its MIG instances'.
func ownDevices(whole []GPU, mig []api.MIGRef) map[string]bool {
	own := map[string]bool{}
	for _, g := range whole {
		own[g.UUID] = true
	}
	for _, m := range mig {
		own[m.UUID] = true
	}
	return own
}

// deviceList renders the container's devices for messages.
func deviceList(whole []GPU, mig []api.MIGRef) string {
	if len(mig) == 0 {
		return gpuList(whole)
	}
	if len(whole) == 0 {
		return migList(mig)
	}
	return gpuList(whole) + " " + migList(mig)
}

// devicesNoun names what a container holds in messages: GPUs, or devices
// when it holds MIG instances.
func devicesNoun(mig []api.MIGRef) string {
	if len(mig) > 0 {
		return "devices"
	}
	return "GPUs"
}

// deviceNoun names a device of the node by UUID in messages.
func deviceNoun(node *Node, uuid string) string {
	if _, _, ok := node.MIGInstance(uuid); ok {
		return "MIG instance " + uuid
	}
	return "GPU " + uuid
}

// resolveDevice finds a GPU by UUID or NVML index, or a MIG instance by
// UUID, and returns its UUID.
func resolveDevice(node *Node, s string) (string, bool) {
	if _, _, ok := node.MIGInstance(s); ok {
		return s, true
	}
	g, ok := resolveGPU(node, s)
	return g.UUID, ok
}

// checkCDIDevices checks that every CDI device of kind opts.CDIKind the
// container already requests is one of its whole GPUs or MIG instances.
func checkCDIDevices(opts Options, node *Node, names []string, whole []GPU, mig []api.MIGRef) error {
	if opts.CDIKind == "" {
		return nil
	}
	own := ownDevices(whole, mig)
	for _, n := range names {
		name, isOurs := strings.CutPrefix(n, opts.CDIKind+"=")
		if !isOurs {
			continue
		}
		id, known := resolveDevice(node, name)
		if !known {
			return fmt.Errorf("CDI device %s is not a GPU or MIG instance of this node", n)
		}
		if !own[id] {
			return fmt.Errorf("CDI device %s is %s, which is not one of the container's %s %s", n, deviceNoun(node, id), devicesNoun(mig), deviceList(whole, mig))
		}
	}
	return nil
}

// checkVolumeMountList checks that every device the device plugin listed
// as a volume mount under api.NVIDIAVolumeMountsDir is one of the
// container's whole GPUs or MIG instances.
func checkVolumeMountList(node *Node, destinations []string, whole []GPU, mig []api.MIGRef) error {
	own := ownDevices(whole, mig)
	for _, d := range destinations {
		name, listed := strings.CutPrefix(d, api.NVIDIAVolumeMountsDir+"/")
		if !listed {
			continue
		}
		id, known := resolveDevice(node, name)
		if !known {
			return fmt.Errorf("the device list mount %s names %q, which is not a GPU or MIG instance of this node", d, name)
		}
		if !own[id] {
			return fmt.Errorf("the device list mount %s names %s, which is not one of the container's %s %s", d, deviceNoun(node, id), devicesNoun(mig), deviceList(whole, mig))
		}
	}
	return nil
}

// resolveGPU finds a GPU by UUID or NVML index.
func resolveGPU(node *Node, s string) (GPU, bool) {
	if g, ok := node.GPU(s); ok {
		return g, true
	}
	if i, err := strconv.Atoi(s); err == nil {
		for _, g := range node.GPUs {
			if g.Index == i {
				return g, true
			}
		}
	}
	return GPU{}, false
}

func i64(v int64) *int64 { return &v }

// adjustment builds the container's adjustment for gpus (ordered: whole by
// index, then the shared one) and MIG instances mig (of migGPUs).
func adjustment(opts Options, node *Node, pod Pod, ctr Container, gpus []GPU, shared *api.SharedGPU, mig []api.MIGRef, migGPUs []GPU) Adjustment {
	var a Adjustment
	// The device nodes, cgroup rules and NUMA node of a MIG instance are
	// its GPU's: /dev/nvidia<minor> of the parent (with the nvidia-caps
	// nodes the CDI spec of the MIG device adds).
	visible := gpus
	gpus = append(append([]GPU(nil), gpus...), migGPUs...)
	allowed := map[int64]bool{NVIDIACtlMinor: true}
	for _, g := range gpus {
		allowed[int64(g.Minor)] = true
	}

	// Devices: exactly the container's GPUs and MIG instances.
	if opts.CDI {
		have := map[string]bool{}
		for _, n := range ctr.CDIDevices {
			have[n] = true
		}
		var names []string
		for _, g := range visible {
			names = append(names, api.CDIName(opts.CDIKind, opts.CDIDeviceName, g.UUID, g.Index))
		}
		for _, m := range mig {
			// A MIG device's CDI name is its UUID (docs/deviceplugin.md).
			names = append(names, opts.CDIKind+"="+m.UUID)
		}
		for _, name := range names {
			if !have[name] {
				a.CDIDevices = append(a.CDIDevices, name)
			}
		}
	} else {
		for _, g := range gpus {
			a.AddDeviceNodes = append(a.AddDeviceNodes, DeviceNode{Path: "/dev/nvidia" + strconv.Itoa(g.Minor), Type: "c", Major: NVIDIAMajor, Minor: int64(g.Minor)})
		}
		a.AddDeviceNodes = append(a.AddDeviceNodes, DeviceNode{Path: "/dev/nvidiactl", Type: "c", Major: NVIDIAMajor, Minor: NVIDIACtlMinor})
		if opts.UVMMajor >= 0 {
			a.AddDeviceNodes = append(a.AddDeviceNodes,
				DeviceNode{Path: "/dev/nvidia-uvm", Type: "c", Major: opts.UVMMajor, Minor: UVMMinor},
				DeviceNode{Path: "/dev/nvidia-uvm-tools", Type: "c", Major: opts.UVMMajor, Minor: UVMToolsMinor})
		}
	}
	for _, dn := range ctr.DeviceNodes {
		if dn.Type == "c" && dn.Major == NVIDIAMajor && !allowed[dn.Minor] {
			a.RemoveDeviceNodes = append(a.RemoveDeviceNodes, dn.Path)
		}
	}
	sort.Strings(a.RemoveDeviceNodes)

	// Device cgroup: deny every NVIDIA device, then allow the container's.
	a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: "c", Major: i64(NVIDIAMajor), Access: "rwm"})
	if opts.UVMMajor >= 0 {
		a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: "c", Major: i64(opts.UVMMajor), Access: "rwm"})
	}
	for _, g := range gpus {
		a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: true, Type: "c", Major: i64(NVIDIAMajor), Minor: i64(int64(g.Minor)), Access: "rw"})
	}
	a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: true, Type: "c", Major: i64(NVIDIAMajor), Minor: i64(NVIDIACtlMinor), Access: "rw"})
	if opts.UVMMajor >= 0 {
		a.CgroupRules = append(a.CgroupRules,
			CgroupRule{Allow: true, Type: "c", Major: i64(opts.UVMMajor), Minor: i64(UVMMinor), Access: "rw"},
			CgroupRule{Allow: true, Type: "c", Major: i64(opts.UVMMajor), Minor: i64(UVMToolsMinor), Access: "rw"})
	}

	// Environment: the runtime sees the whole GPUs and MIG instances;
	// TESSERA_GPU_* name the GPUs (a MIG instance's parent).
	uuids := make([]string, len(gpus))
	indices := make([]string, len(gpus))
	for i, g := range gpus {
		uuids[i] = g.UUID
		indices[i] = strconv.Itoa(g.Index)
	}
	var devices []string
	for _, g := range visible {
		devices = append(devices, g.UUID)
	}
	for _, m := range mig {
		devices = append(devices, m.UUID)
	}
	a.Env = append(a.Env,
		EnvVar{api.EnvNVIDIAVisibleDevices, strings.Join(devices, ",")},
		EnvVar{api.EnvGPUUUIDs, strings.Join(uuids, ",")},
		EnvVar{api.EnvGPUIndices, strings.Join(indices, ",")},
		EnvVar{api.EnvGPUShared, strconv.FormatBool(shared != nil)},
	)
	// The other variables by which the spec asks the runtime for devices
	// name nothing beyond the container's own (nvidiaRequestEnv).
	for _, name := range nvidiaRequestEnv {
		if _, ok := ctr.Env[name]; !ok {
			continue
		}
		v := ""
		if name == api.EnvDockerResourceGPU {
			v = strings.Join(devices, ",")
		}
		a.Env = append(a.Env, EnvVar{name, v})
	}
	if shared != nil {
		// The container sees its slice's GPUs (one, or a multi-GPU
		// slice's N) as device ordinals 0..N-1, each with the same memory
		// limit; the thread percentage is per client, the same on each.
		limits := make([]string, 1+len(shared.Spread))
		for i := range limits {
			limits[i] = fmt.Sprintf("%d=%dM", i, shared.MemoryMiB)
		}
		a.Env = append(a.Env,
			EnvVar{api.EnvMPSPipeDirectory, api.MPSPipeMountPath},
			EnvVar{api.EnvMPSPinnedDeviceMemLimit, strings.Join(limits, ",")},
			EnvVar{api.EnvGPUMemoryLimitMiB, strconv.FormatInt(shared.MemoryMiB, 10)},
		)
		if shared.Cores > 0 {
			a.Env = append(a.Env,
				EnvVar{api.EnvMPSActiveThreadPercentage, strconv.FormatInt(shared.Cores, 10)},
				EnvVar{api.EnvGPUCores, strconv.FormatInt(shared.Cores, 10)},
			)
		}
		a.Mounts = append(a.Mounts, Mount{Source: opts.MPSPipeDir(gpureq.GroupKey(shared.UUIDs())), Destination: api.MPSPipeMountPath, Options: []string{"rbind", "rw"}})
	}

	// NUMA alignment.
	if !ctr.ExclusiveCPUs && !api.NUMAAlignmentDisabled(pod.Annotations) {
		a.CPUSetCPUs, a.CPUSetMems = numaCPUSet(node, gpus, ctr.CPUs)
	}
	return a
}

// Realign returns the cpuset to give a container of the ledger whose CPUs
// the runtime is asked to change to cpus (the kubelet's CPU manager
// reconciles the shared pool): cpus narrowed to its GPUs' NUMA node(s), or
// empty strings when nothing is to change.
func Realign(node *Node, e Entry, cpus string) (alignedCPUs, mems string) {
	var gpus []GPU
	refs := append([]api.GPURef(nil), e.GPUs...)
	if e.Shared != nil {
		refs = append(refs, e.Shared.GPUs()...)
	}
	for _, m := range e.MIG {
		refs = append(refs, m.GPU)
	}
	for _, r := range refs {
		if g, ok := node.GPU(r.UUID); ok {
			gpus = append(gpus, g)
		}
	}
	if cpus == "" || len(gpus) == 0 {
		return "", ""
	}
	c, m := numaCPUSet(node, gpus, cpus)
	if c == cpus {
		return "", ""
	}
	return c, m
}

// numaCPUSet returns the CPUs and memory nodes of the NUMA node(s) of gpus,
// within the container's current cpuset when it has one. It returns empty
// strings when the GPUs' NUMA nodes are unknown or the intersection is
// empty (the kubelet's cpuset is then kept).
func numaCPUSet(node *Node, gpus []GPU, current string) (cpus, mems string) {
	ids := map[int]bool{}
	for _, g := range gpus {
		if g.NUMANode >= 0 {
			ids[g.NUMANode] = true
		}
	}
	set := cpuset.New()
	var nodes []int
	for _, n := range node.NUMANodes {
		if !ids[n.ID] {
			continue
		}
		c, err := cpuset.Parse(n.CPUs)
		if err != nil {
			continue
		}
		set = set.Union(c)
		nodes = append(nodes, n.ID)
	}
	if set.IsEmpty() {
		return "", ""
	}
	if current != "" {
		if cur, err := cpuset.Parse(current); err == nil {
			set = set.Intersection(cur)
		}
	}
	if set.IsEmpty() {
		return "", ""
	}
	sort.Ints(nodes)
	return set.String(), cpuset.New(nodes...).String()
}

// NonGPU says what Decide does with a container the kubelet allocated no
// Tessera resource to (api.NRIConfig.NonGPUContainers).
type NonGPU struct {
	// Leave leaves such containers as the runtime creates them; false
	// (the zero value) hides every GPU from them.
	Leave bool
	// ExemptNamespaces are namespaces whose containers are left alone even
	// when Leave is false (node-wide GPU monitoring).
	ExemptNamespaces []string
}

// NonGPUFromConfig derives NonGPU from the node agent's configuration.
func NonGPUFromConfig(cfg *api.NodeAgentConfig) NonGPU {
	return NonGPU{
		Leave:            cfg.NRI.NonGPUContainers == api.NonGPUContainersLeave,
		ExemptNamespaces: append([]string(nil), cfg.NRI.NonGPUExemptNamespaces...),
	}
}

// nvidiaRequestEnv are the environment variables other than
// NVIDIA_VISIBLE_DEVICES by which a container asks the NVIDIA container
// runtime (toolkit) for NVIDIA devices: MIG configuration and monitoring
// devices, IMEX channels, and the swarm-resource variable its configuration
// documents (DOCKER_RESOURCE_GPU, which takes precedence over
// NVIDIA_VISIBLE_DEVICES where configured). A container without a Tessera
// GPU that sets one gets it emptied, which the toolkit reads as no device:
// NRI's adaptation (v0.12) drops the removal of a variable the container
// already has, but applies an override. A GPU container that sets one gets
// it overridden too (adjustment): the swarm-resource variable with the
// container's own devices, the others emptied (Tessera gives no IMEX
// channel and no MIG configuration or monitoring capability).
var nvidiaRequestEnv = []string{
	api.EnvDockerResourceGPU,
	api.EnvNVIDIAIMEXChannels,
	api.EnvNVIDIAMIGConfigDevices,
	api.EnvNVIDIAMIGMonitorDevices,
}

// decideNonGPU decides on a container that holds no Tessera resource. Unless
// the operator leaves such containers alone (opts.NonGPU), the container gets
// no GPU whatever its spec asks for, so that a pod without a GPU request and
// NVIDIA_VISIBLE_DEVICES=all (or an image whose CUDA_VERSION makes an unset
// variable mean all) does not get every GPU of the node from the NVIDIA
// container runtime:
//
//   - NVIDIA_VISIBLE_DEVICES=void, and the other variables that request
//     NVIDIA devices (nvidiaRequestEnv) emptied;
//   - every device node of the NVIDIA driver (/dev/nvidia*, major 195, the
//     UVM major when known) removed, including those CDI injected (NRI's
//     adaptation v0.12 drops such removals of nodes the container already
//     has: the device cgroup rules are what denies them);
//   - the device cgroup denies major 195, the UVM major when known, and each
//     other removed node;
//   - mounts under api.NVIDIAVolumeMountsDir (the runtime's device list as volume
//     mounts, GPUs and IMEX channels) removed;
//   - devices of kind opts.CDIKind removed from cdi.k8s.io/ annotations (the
//     runtime's CDI mode prefers them to the environment).
//
// CDI devices requested through the CRI cannot be withdrawn by NRI; the
// device nodes they injected are removed and denied. A sidecar without GPU
// requests in a GPU pod is such a container too.
func decideNonGPU(opts Options, req Request) *Decision {
	pod, ctr := req.Pod, req.Container
	if opts.NonGPU.Leave || slices.Contains(opts.NonGPU.ExemptNamespaces, pod.Namespace) {
		return &Decision{Action: ActionLeave}
	}
	d := &Decision{Action: ActionVoid}
	a := &d.Adjustment

	if v, ok := ctr.Env[api.EnvNVIDIAVisibleDevices]; ok && v != api.VisibleDevicesVoid {
		d.Voided = append(d.Voided, api.EnvNVIDIAVisibleDevices+"="+v)
	}
	a.Env = append(a.Env, EnvVar{api.EnvNVIDIAVisibleDevices, api.VisibleDevicesVoid})
	for _, name := range nvidiaRequestEnv {
		if v, ok := ctr.Env[name]; ok {
			a.Env = append(a.Env, EnvVar{name, ""})
			if v != "" {
				d.Voided = append(d.Voided, name+"="+v)
			}
		}
	}

	nodes := slices.Clone(ctr.DeviceNodes)
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Path < nodes[j].Path })
	a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: "c", Major: i64(NVIDIAMajor), Access: "rwm"})
	if opts.UVMMajor >= 0 {
		a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: "c", Major: i64(opts.UVMMajor), Access: "rwm"})
	}
	denied := map[DeviceNode]bool{}
	for _, dn := range nodes {
		driverMajor := dn.Type == "c" && (dn.Major == NVIDIAMajor || (opts.UVMMajor >= 0 && dn.Major == opts.UVMMajor))
		if !driverMajor && !strings.HasPrefix(dn.Path, "/dev/nvidia") {
			continue
		}
		a.RemoveDeviceNodes = append(a.RemoveDeviceNodes, dn.Path)
		d.Voided = append(d.Voided, fmt.Sprintf("device %s (%s %d:%d)", dn.Path, dn.Type, dn.Major, dn.Minor))
		// Nodes of the driver's other majors (nvidia-caps, nvswitch,
		// IMEX channels: assigned at load time) are denied one by one.
		if k := (DeviceNode{Type: dn.Type, Major: dn.Major, Minor: dn.Minor}); !driverMajor && !denied[k] {
			denied[k] = true
			a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: dn.Type, Major: i64(dn.Major), Minor: i64(dn.Minor), Access: "rwm"})
		}
	}

	for _, dst := range slices.Sorted(slices.Values(ctr.MountDestinations)) {
		if dst == api.NVIDIAVolumeMountsDir || strings.HasPrefix(dst, api.NVIDIAVolumeMountsDir+"/") {
			a.RemoveMounts = append(a.RemoveMounts, dst)
			d.Voided = append(d.Voided, "mount "+dst)
		}
	}

	kind := opts.CDIKind
	if kind == "" {
		kind = api.DefaultCDIKind
	}
	isOurs := func(name string) bool { return strings.HasPrefix(strings.TrimSpace(name), kind+"=") }
	for _, key := range slices.Sorted(maps.Keys(ctr.Annotations)) {
		if !strings.HasPrefix(key, api.CDIAnnotationPrefix) {
			continue
		}
		var kept []string
		removed := false
		for _, name := range strings.Split(ctr.Annotations[key], ",") {
			if isOurs(name) {
				removed = true
				continue
			}
			if strings.TrimSpace(name) != "" {
				kept = append(kept, name)
			}
		}
		if !removed {
			continue
		}
		d.Voided = append(d.Voided, "annotation "+key+"="+ctr.Annotations[key])
		if len(kept) == 0 {
			a.RemoveAnnotations = append(a.RemoveAnnotations, key)
		} else {
			a.SetAnnotations = append(a.SetAnnotations, Annotation{Key: key, Value: strings.Join(kept, ",")})
		}
	}
	for _, name := range ctr.CDIDevices {
		if isOurs(name) {
			d.Voided = append(d.Voided, "CDI device "+name+" (its device nodes are removed)")
		}
	}
	return d
}

// addCapNodes gives a container without CDI the nvidia-caps nodes of its
// MIG instances (caps) and no other: when the nvidia-caps major is known,
// its other nodes in the container are removed and the device cgroup
// denies the major but for the container's minors. With CDI (caps nil, no
// MIG, or the major unknown) nothing changes: a MIG device's CDI spec
// brings its own.
func addCapNodes(a *Adjustment, caps MIGCaps, ctr Container, nodes []DeviceNode) {
	if caps.Major <= 0 || len(nodes) == 0 {
		return
	}
	allowed := map[int64]bool{}
	for _, n := range nodes {
		allowed[n.Minor] = true
	}
	a.AddDeviceNodes = append(a.AddDeviceNodes, nodes...)
	for _, dn := range ctr.DeviceNodes {
		if dn.Type == "c" && dn.Major == caps.Major && !allowed[dn.Minor] {
			a.RemoveDeviceNodes = append(a.RemoveDeviceNodes, dn.Path)
		}
	}
	sort.Strings(a.RemoveDeviceNodes)
	a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: false, Type: "c", Major: i64(caps.Major), Access: "rwm"})
	for _, n := range nodes {
		a.CgroupRules = append(a.CgroupRules, CgroupRule{Allow: true, Type: "c", Major: i64(caps.Major), Minor: i64(n.Minor), Access: "rw"})
	}
}
