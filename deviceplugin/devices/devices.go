// Package devices is the node agent's device model: which kubelet devices
// exist for each Tessera resource, their IDs, and which of them are healthy
// given the GPUs' health and what is in use. It is plain data and pure
// functions; the gRPC side (package deviceplugin) asks it and never decides
// on its own.
//
// Devices of one GPU:
//
//   - tessera.dev/gpu: one device, ID = the GPU's UUID.
//   - tessera.dev/gpu-memory: one device per memory unit after the reserve,
//     ID = <uuid>::mem::<n>.
//   - tessera.dev/gpu-core: api.CoresPerGPU devices, ID = <uuid>::core::<n>.
//
// Shared units (memory and core) carry no GPU choice of their own: the GPU in
// their ID is nominal. Which GPU a shared container is served from is decided
// by the scheduler extender's assignment and the NRI plugin; Allocation's
// SharedGPU carries that decision when it is known.
//
// Whole and shared use of one GPU exclude each other: a GPU with shared units
// in use is withheld from tessera.dev/gpu, and the units of a GPU allocated
// whole are withheld. Withheld devices are reported unhealthy to the kubelet,
// so its allocatable counts drop while the devices stay known.
package devices

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// MaxDeviceIDLength is the kubelet's limit on a device ID.
const MaxDeviceIDLength = 63

// Separators in shared-unit device IDs.
const (
	memorySep = "::mem::"
	coreSep   = "::core::"
)

// scheme is how the devices of one resource are numbered on a GPU (the
// device plugin's per-resource side is deviceplugin.Kind).
type scheme struct {
	// whole: one device per GPU whose ID is the GPU's UUID; otherwise
	// shared units with IDs <uuid><sep><n>.
	whole bool
	sep   string
	// units is the number of devices GPU g provides.
	units func(g GPU, o Options) int
}

var schemes = map[corev1.ResourceName]scheme{
	api.ResourceGPU: {whole: true, units: func(GPU, Options) int { return 1 }},
	api.ResourceGPUMemory: {sep: memorySep, units: func(g GPU, o Options) int {
		return int(gpureq.MemoryUnits(g.MemoryMiB, o.MemoryReserveMiB, o.MemoryUnitMiB))
	}},
	api.ResourceGPUCore: {sep: coreSep, units: func(GPU, Options) int { return api.CoresPerGPU }},
}

// GPU is what the model knows of one GPU.
type GPU struct {
	Index int
	UUID  string
	// NUMANode is -1 when the platform does not report one.
	NUMANode  int
	MemoryMiB uint64
	// MIGMode is true when the GPU is in MIG mode: it then provides no
	// tessera.dev/gpu, gpu-memory or gpu-core device, only one device per
	// MIG instance (MIG) of the instance's profile resource.
	MIGMode bool
	// MIG are the GPU's MIG instances (MIGMode only), by placement.
	MIG []MIGInstance
}

// Options shape the model.
type Options struct {
	// Resources lists the advertised resources.
	Resources []corev1.ResourceName
	// MemoryUnitMiB is the size of one memory unit.
	MemoryUnitMiB uint64
	// MemoryReserveMiB is kept back on every GPU.
	MemoryReserveMiB uint64
}

// Model is the immutable set of devices of a node.
type Model struct {
	gpus   []GPU
	byUUID map[string]int
	opts   Options
	ids    map[corev1.ResourceName][][]string // resource -> GPU position -> device IDs
	migs   map[string]migRef                  // MIG UUID -> its GPU and instance
}

// New builds the model of gpus (in index order after sorting).
func New(gpus []GPU, opts Options) (*Model, error) {
	if opts.MemoryUnitMiB == 0 {
		return nil, fmt.Errorf("memory unit must be greater than 0 MiB")
	}
	for _, r := range opts.Resources {
		if !api.IsTesseraResource(r) {
			return nil, fmt.Errorf("resource %q is not a Tessera resource", r)
		}
	}
	m := &Model{gpus: append([]GPU(nil), gpus...), byUUID: map[string]int{}, opts: opts, ids: map[corev1.ResourceName][][]string{}, migs: map[string]migRef{}}
	m.opts.Resources = append([]corev1.ResourceName(nil), opts.Resources...)
	sort.Slice(m.gpus, func(i, j int) bool { return m.gpus[i].Index < m.gpus[j].Index })
	for p, g := range m.gpus {
		if g.UUID == "" || strings.Contains(g.UUID, "::") || strings.ContainsAny(g.UUID, ", ") {
			return nil, fmt.Errorf("GPU %d: %q cannot be a device ID", g.Index, g.UUID)
		}
		if _, dup := m.byUUID[g.UUID]; dup {
			return nil, fmt.Errorf("GPU %d: UUID %s is also another GPU's", g.Index, g.UUID)
		}
		if p > 0 && m.gpus[p-1].Index == g.Index {
			return nil, fmt.Errorf("GPU index %d is listed twice", g.Index)
		}
		m.byUUID[g.UUID] = p
		if err := m.addMIG(p); err != nil {
			return nil, err
		}
		if m.enabled(api.ResourceGPUMemory) && !g.MIGMode && g.MemoryMiB <= opts.MemoryReserveMiB {
			return nil, fmt.Errorf("GPU %d (%s): the memory reserve of %d MiB leaves nothing of its %d MiB", g.Index, g.UUID, opts.MemoryReserveMiB, g.MemoryMiB)
		}
		for _, r := range m.opts.Resources {
			ids := make([]string, m.Units(r, g))
			for n := range ids {
				ids[n] = DeviceID(r, g.UUID, n)
			}
			if api.IsMIGResource(r) {
				ids = migIDs(r, g)
			}
			if n := len(ids); n > 0 && len(ids[n-1]) > MaxDeviceIDLength {
				return nil, fmt.Errorf("GPU %d: device ID %q is longer than the kubelet's %d characters", g.Index, ids[n-1], MaxDeviceIDLength)
			}
			m.ids[r] = append(m.ids[r], ids)
		}
	}
	return m, nil
}

func (m *Model) enabled(r corev1.ResourceName) bool {
	for _, x := range m.opts.Resources {
		if x == r {
			return true
		}
	}
	return false
}

// Resources returns the advertised resources.
func (m *Model) Resources() []corev1.ResourceName {
	return append([]corev1.ResourceName(nil), m.opts.Resources...)
}

// Options returns the options the model was built with.
func (m *Model) Options() Options { return m.opts }

// GPUs returns the GPUs in index order.
func (m *Model) GPUs() []GPU { return append([]GPU(nil), m.gpus...) }

// GPU returns the GPU with the given UUID.
func (m *Model) GPU(uuid string) (GPU, bool) {
	p, ok := m.byUUID[uuid]
	if !ok {
		return GPU{}, false
	}
	return m.gpus[p], true
}

// Units is the number of devices of resource r that GPU g provides.
func (m *Model) Units(r corev1.ResourceName, g GPU) int {
	if api.IsMIGResource(r) {
		return len(migIDs(r, g))
	}
	if g.MIGMode {
		return 0
	}
	s, ok := schemes[r]
	if !ok {
		return 0
	}
	return s.units(g, m.opts)
}

// maxUnits is the most devices of resource r one GPU of the node provides.
func (m *Model) maxUnits(r corev1.ResourceName) int {
	n := 0
	for _, g := range m.gpus {
		n = max(n, m.Units(r, g))
	}
	return n
}

// sharing counts the GPUs that can serve slices (not in MIG mode): the
// most GPUs a multi-GPU slice of this node spans.
func (m *Model) sharing() int {
	n := 0
	for _, g := range m.gpus {
		if !g.MIGMode {
			n++
		}
	}
	return n
}

// DeviceID is the ID of the n-th device of resource r on the GPU with the
// given UUID.
func DeviceID(r corev1.ResourceName, uuid string, n int) string {
	if s, ok := schemes[r]; ok && !s.whole {
		return uuid + s.sep + strconv.Itoa(n)
	}
	return uuid
}

// ParseDeviceID splits a device ID of resource r into the GPU UUID and unit
// number (0 for a whole GPU). It checks the form only; Model.Lookup also
// checks that the device exists.
func ParseDeviceID(r corev1.ResourceName, id string) (uuid string, n int, err error) {
	s, ok := schemes[r]
	if !ok {
		return "", 0, fmt.Errorf("%q is not a Tessera resource", r)
	}
	if s.whole {
		if id == "" || strings.Contains(id, "::") {
			return "", 0, fmt.Errorf("%s device ID %q: want a GPU UUID", r, id)
		}
		return id, 0, nil
	}
	sep := s.sep
	uuid, num, ok := strings.Cut(id, sep)
	if !ok || uuid == "" || strings.Contains(uuid, "::") {
		return "", 0, fmt.Errorf("%s device ID %q: want <uuid>%s<n>", r, id, sep)
	}
	n, err = strconv.Atoi(num)
	if err != nil || n < 0 || strconv.Itoa(n) != num {
		return "", 0, fmt.Errorf("%s device ID %q: unit %q is not a number", r, id, num)
	}
	return uuid, n, nil
}

// Lookup returns the GPU of a device of resource r, or an error when no such
// device exists on this node.
func (m *Model) Lookup(r corev1.ResourceName, id string) (GPU, error) {
	if !m.enabled(r) {
		return GPU{}, fmt.Errorf("resource %s is not advertised on this node", r)
	}
	if api.IsMIGResource(r) {
		g, _, err := m.lookupMIG(r, id)
		return g, err
	}
	uuid, n, err := ParseDeviceID(r, id)
	if err != nil {
		return GPU{}, err
	}
	g, ok := m.GPU(uuid)
	if !ok {
		return GPU{}, fmt.Errorf("%s device %q: no GPU %s on this node", r, id, uuid)
	}
	if g.MIGMode {
		return GPU{}, fmt.Errorf("%s device %q: GPU %d is in MIG mode; it is offered only as its MIG instances", r, id, g.Index)
	}
	if n >= m.Units(r, g) {
		return GPU{}, fmt.Errorf("%s device %q: GPU %d has only %d units", r, id, g.Index, m.Units(r, g))
	}
	return g, nil
}

// Health is the health of one GPU.
type Health struct {
	Healthy bool
	// Reason says why an unhealthy GPU is unhealthy, e.g. "XID 79".
	Reason string
}

// HealthMap is the health of the GPUs by UUID; a GPU that is absent is
// healthy.
type HealthMap map[string]Health

// Of returns the health of a GPU.
func (h HealthMap) Of(uuid string) Health {
	if s, ok := h[uuid]; ok {
		return s
	}
	return Health{Healthy: true}
}

// Usage says which GPUs are in use, by UUID.
type Usage struct {
	// Whole GPUs are allocated as tessera.dev/gpu.
	Whole map[string]bool
	// Shared GPUs serve tessera.dev/gpu-memory or tessera.dev/gpu-core
	// units.
	Shared map[string]bool
	// MIG instances are allocated, by MIG UUID.
	MIG map[string]bool
	// Assigned GPUs are named by the shared part of the assignment of a
	// pod on this node that has not ended: the scheduler extender chose
	// them for a slice, and the kubelet may not have admitted that pod
	// yet. They cannot be allocated whole either.
	Assigned map[string]bool
	// Unstarted GPUs are those of Assigned named for a pod the kubelet has
	// not started yet (gpureq.Unstarted): the slice whose units the
	// kubelet allocates now is among them. Only a preferred allocation
	// reads it.
	Unstarted map[string]bool
	// Admitting are the GPUs of the slice whose units the kubelet is
	// allocating now, as far as the agent can tell (package preferred,
	// Admitting): one GPU, or a multi-GPU slice's GPUs in index order;
	// none when it cannot tell. Only a preferred allocation reads it.
	Admitting []string
}

// Assignments are the GPUs the shared parts of the assignments of a
// node's pods that have not ended name (Usage.Assigned), and among them
// those of pods the kubelet has not started (Usage.Unstarted); Slices are
// those unstarted pods themselves.
type Assignments struct {
	GPUs, Unstarted map[string]bool
	Slices          []SlicePod
}

// SlicePod is a pod of the node that has not ended and that the kubelet has
// not started, with containers that ask for shared units: one the kubelet
// may be admitting.
type SlicePod struct {
	Namespace, Name, UID string
	// Created is the pod's creation timestamp: the kubelet admits a batch
	// of pods in this order.
	Created time.Time
	// Containers are the pod's containers that ask for shared units, in
	// the order the kubelet allocates devices: init containers, then the
	// others, each in spec order.
	Containers []SliceContainer
}

// SliceContainer is a container of a SlicePod that asks for shared units.
type SliceContainer struct {
	Name string
	// Init is set for an init container that is not restartable: the
	// kubelet allocates its devices first and hands them on to the pod's
	// later containers, and its PodResources API does not list it.
	Init bool
	// Units are the container's limits of the shared resources.
	Units map[corev1.ResourceName]int64
	// GPUs are the UUIDs of the GPUs the shared part of the container's
	// assignment names, in index order (none without one).
	GPUs []string
}

// WithAssigned returns u with the GPUs in more assigned too; u is not
// changed.
func (u Usage) WithAssigned(more map[string]bool) Usage {
	if len(more) == 0 {
		return u
	}
	assigned := make(map[string]bool, len(u.Assigned)+len(more))
	for _, m := range []map[string]bool{u.Assigned, more} {
		for uuid, ok := range m {
			if ok {
				assigned[uuid] = true
			}
		}
	}
	u.Assigned = assigned
	return u
}

// Device is one kubelet device with its reported health.
type Device struct {
	ID       string
	GPU      string
	NUMANode int
	Healthy  bool
	// Reason says why an unhealthy device is reported unhealthy: the GPU's
	// own reason, or why it is withheld.
	Reason string
}

// Reasons for withholding a healthy GPU's devices.
const (
	ReasonSharedInUse = "withheld: the GPU serves shared units"
	ReasonAssigned    = "withheld: a pod on this node is assigned shared units of the GPU"
	ReasonWholeInUse  = "withheld: the GPU is allocated whole"
)

// Devices lists the devices of resource r in a stable order (GPU index,
// then unit) with the health the kubelet is to see.
func (m *Model) Devices(r corev1.ResourceName, health HealthMap, usage Usage) []Device {
	if !m.enabled(r) {
		return nil
	}
	var out []Device
	for p, g := range m.gpus {
		healthy, reason := m.DeviceHealth(r, g.UUID, health, usage)
		numa := g.NUMANode
		if schemes[r].sep != "" {
			// Shared units carry no NUMA node. With one, the kubelet's
			// topology manager picked the lowest NUMA node whose GPUs had
			// units enough (the units of all its GPUs together) and
			// offered the plugin only that node's units: a slice the
			// extender had put on a GPU of NUMA node 1 was charged units
			// of NUMA node 0's GPUs (seen on make demo's pcie-2numa node),
			// which withheld those GPUs from whole use, and the exclusive
			// CPUs followed the units. Without one the plugin is offered
			// every unit and takes the slice's own GPU's (preferred), and
			// the kubelet aligns only the pod's CPUs, which the extender
			// models (allocator/numa Fit).
			numa = -1
		}
		for _, id := range m.ids[r][p] {
			out = append(out, Device{ID: id, GPU: g.UUID, NUMANode: numa, Healthy: healthy, Reason: reason})
		}
	}
	return out
}

// DeviceHealth is the health of resource r's devices of the GPU with the
// given UUID, and why they are unhealthy when they are.
func (m *Model) DeviceHealth(r corev1.ResourceName, uuid string, health HealthMap, usage Usage) (bool, string) {
	if h := health.Of(uuid); !h.Healthy {
		return false, h.Reason
	}
	if api.IsMIGResource(r) {
		// A GPU in MIG mode is never whole nor shared: its instances are
		// the kubelet's to hand out one by one.
		return true, ""
	}
	if schemes[r].whole {
		if gpureq.CheckWhole(gpureq.GPUUse{Shared: usage.Shared[uuid]}) != nil {
			return false, ReasonSharedInUse
		}
		if gpureq.CheckWhole(gpureq.GPUUse{Shared: usage.Assigned[uuid]}) != nil {
			return false, ReasonAssigned
		}
		return true, ""
	}
	if gpureq.CheckShared(gpureq.GPUUse{Whole: usage.Whole[uuid]}) != nil {
		return false, ReasonWholeInUse
	}
	return true, ""
}

// Allocation is what the kubelet allocated to one container for one
// resource.
type Allocation struct {
	Resource  corev1.ResourceName
	DeviceIDs []string
	// SharedGPU names the GPU(s) the container's shared units are served
	// from, when known (from the assignment annotation), as the slice's
	// MPS group key (gpureq.GroupKey): a GPU's UUID, or for a multi-GPU
	// slice its GPUs' UUIDs joined by ",". Without it, the GPUs named in
	// the unit IDs count.
	SharedGPU string
}

// UsageOf computes which GPUs the allocations use. Devices that do not exist
// on this node are reported as errors and otherwise ignored.
func (m *Model) UsageOf(allocs []Allocation) (Usage, []error) {
	u := Usage{Whole: map[string]bool{}, Shared: map[string]bool{}}
	var errs []error
	for _, a := range allocs {
		if !api.IsTesseraResource(a.Resource) {
			continue
		}
		if api.IsMIGResource(a.Resource) {
			for _, id := range a.DeviceIDs {
				if _, _, err := m.lookupMIG(a.Resource, id); err != nil {
					errs = append(errs, err)
					continue
				}
				if u.MIG == nil {
					u.MIG = map[string]bool{}
				}
				u.MIG[id] = true
			}
			continue
		}
		whole := schemes[a.Resource].whole
		if !whole && a.SharedGPU != "" {
			known := true
			for _, uuid := range gpureq.GroupGPUs(a.SharedGPU) {
				if _, ok := m.GPU(uuid); !ok {
					known = false
					errs = append(errs, fmt.Errorf("shared GPU %s of an allocation is not on this node", uuid))
				}
			}
			if known {
				for _, uuid := range gpureq.GroupGPUs(a.SharedGPU) {
					u.Shared[uuid] = true
				}
				continue
			}
		}
		for _, id := range a.DeviceIDs {
			uuid, _, err := ParseDeviceID(a.Resource, id)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if _, ok := m.GPU(uuid); !ok {
				errs = append(errs, fmt.Errorf("%s device %q: no GPU %s on this node", a.Resource, id, uuid))
				continue
			}
			if whole {
				u.Whole[uuid] = true
			} else {
				u.Shared[uuid] = true
			}
		}
	}
	return u, errs
}

// CheckWhole checks an Allocate request for whole GPUs and returns the GPUs
// in index order. It fails when a device does not exist, is listed twice, its
// GPU is unhealthy, or its GPU serves shared units.
func (m *Model) CheckWhole(ids []string, health HealthMap, usage Usage) ([]GPU, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("no %s devices requested", api.ResourceGPU)
	}
	seen := map[string]bool{}
	var gpus []GPU
	for _, id := range ids {
		g, err := m.Lookup(api.ResourceGPU, id)
		if err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, fmt.Errorf("%s device %q is requested twice", api.ResourceGPU, id)
		}
		seen[id] = true
		if h := health.Of(g.UUID); !h.Healthy {
			return nil, fmt.Errorf("GPU %d (%s) is unhealthy: %s", g.Index, g.UUID, h.Reason)
		}
		if r := gpureq.CheckWhole(gpureq.GPUUse{Shared: usage.Shared[g.UUID]}); r != nil {
			return nil, fmt.Errorf("GPU %d (%s) %w", g.Index, g.UUID, r)
		}
		if r := gpureq.CheckWhole(gpureq.GPUUse{Shared: usage.Assigned[g.UUID]}); r != nil {
			return nil, fmt.Errorf("GPU %d (%s), assigned to shared units of a pod on this node, %w", g.Index, g.UUID, r)
		}
		gpus = append(gpus, g)
	}
	sort.Slice(gpus, func(i, j int) bool { return gpus[i].Index < gpus[j].Index })
	return gpus, nil
}

// CheckShared checks an Allocate request for shared units of resource r: the
// devices exist, none is listed twice, and the container's slice could be
// served (gpureq.CheckDevices: no more cores or memory than the node's
// GPUs could serve together, a multi-GPU slice being possible). The error wraps the *gpureq.Refusal when
// there is one.
func (m *Model) CheckShared(r corev1.ResourceName, ids []string) error {
	if schemes[r].whole {
		return fmt.Errorf("%s is not a shared resource", r)
	}
	if len(ids) == 0 {
		return fmt.Errorf("no %s devices requested", r)
	}
	if ref := gpureq.CheckDevices(r, int64(len(ids)), int64(m.maxUnits(api.ResourceGPUMemory)), int64(m.sharing())); ref != nil {
		return fmt.Errorf("refusing %d %s devices for one container: %w", len(ids), r, ref)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if _, err := m.Lookup(r, id); err != nil {
			return err
		}
		if seen[id] {
			return fmt.Errorf("%s device %q is requested twice", r, id)
		}
		seen[id] = true
	}
	return nil
}
