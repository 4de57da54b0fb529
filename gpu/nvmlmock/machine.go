package nvmlmock

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/tessera-gpu/tessera/api"
)

// Machine is a mock GPU machine. Its NVML method returns the nvml.Interface;
// its other methods change what that interface reports, as a running machine
// would. All methods are safe for concurrent use.
type Machine struct {
	profile *api.MockMachine
	lib     *mock.Interface

	mu        sync.Mutex
	gpus      []*gpuState
	eventSets map[*eventSet]struct{}
	// migFile keeps the MIG layouts across restarts (PersistMIG); empty
	// when they live in memory only.
	migFile string
}

type gpuState struct {
	index   int
	dev     *mock.Device
	uuid    string
	busID   string // NVML form: 8-digit domain
	links   []mockLink
	lost    bool
	baseUse uint64 // bytes in use that no listed process accounts for
	procs   []nvml.ProcessInfo
	mode    nvml.ComputeMode
	smUtil  map[uint32]uint32 // PID -> SM utilisation percent
	mig     []*migState       // the MIG instances, in profile order; nil without MIG
	migGen  int               // instances created through NVML so far (their UUIDs differ from the ones before)
	migFail int               // CreateGpuInstanceWithPlacement calls left to fail (FailMIGCreates)
}

type mockLink struct {
	remoteBusID string // NVML form
	remote      nvml.IntNvLinkDeviceType
}

type eventSet struct {
	set        *mock.EventSet
	ch         chan nvml.EventData
	registered map[int]uint64 // GPU index -> event mask
}

// New builds a Machine from a validated profile.
func New(p *api.MockMachine) (*Machine, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("mock machine %s: %w", p.Name, err)
	}
	m := &Machine{profile: p, eventSets: map[*eventSet]struct{}{}}
	used := map[string]bool{}
	for i, g := range p.GPUs {
		st := &gpuState{index: i, uuid: g.UUID, busID: nvmlBusID(g.PCIBusID)}
		if st.uuid == "" {
			st.uuid = derivedUUID(p.Name, i)
		}
		mig, err := newMIGStates(g, st.uuid)
		if err != nil {
			return nil, fmt.Errorf("mock machine %s: gpus[%d].mig.%w", p.Name, i, err)
		}
		st.mig = mig
		used[st.busID] = true
		m.gpus = append(m.gpus, st)
	}
	for i, row := range p.NVLinks {
		for j, count := range row {
			for k := 0; k < count; k++ {
				m.gpus[i].links = append(m.gpus[i].links, mockLink{remoteBusID: m.gpus[j].busID, remote: nvml.NVLINK_DEVICE_TYPE_GPU})
			}
		}
	}
	if s := p.NVSwitch; s != nil {
		switches := switchBusIDs(s.Switches, used)
		if len(switches) < s.Switches {
			return nil, fmt.Errorf("mock machine %s: nvswitch.switches: no free PCI bus numbers for %d switches", p.Name, s.Switches)
		}
		for i := range m.gpus {
			if !s.Covers(i) {
				continue
			}
			for k := 0; k < s.LinksPerGPU; k++ {
				m.gpus[i].links = append(m.gpus[i].links, mockLink{remoteBusID: switches[k%s.Switches], remote: nvml.NVLINK_DEVICE_TYPE_SWITCH})
			}
		}
	}
	m.lib = m.newInterface()
	for _, g := range m.gpus {
		g.dev = m.newDevice(g)
	}
	return m, nil
}

// Profile returns the profile the machine was built from.
func (m *Machine) Profile() *api.MockMachine { return m.profile }

// NVML returns the machine's NVML interface.
func (m *Machine) NVML() nvml.Interface { return m.lib }

// UUID returns GPU i's UUID.
func (m *Machine) UUID(i int) string { return m.gpus[i].uuid }

// SetLost makes GPU i fall off the bus (lost) or come back.
func (m *Machine) SetLost(i int, lost bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus[i].lost = lost
}

// SetMemoryUsed sets the memory in use on GPU i that no process accounts for.
func (m *Machine) SetMemoryUsed(i int, bytes uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus[i].baseUse = bytes
}

// SetProcesses replaces the compute processes running on GPU i; their memory
// counts as used.
func (m *Machine) SetProcesses(i int, procs []nvml.ProcessInfo) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.gpus[i].procs = append([]nvml.ProcessInfo(nil), procs...)
}

// SetProcessUtilization sets the SM utilisation (percent) NVML reports for
// process pid on GPU i.
func (m *Machine) SetProcessUtilization(i int, pid uint32, smPercent uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.gpus[i].smUtil == nil {
		m.gpus[i].smUtil = map[uint32]uint32{}
	}
	m.gpus[i].smUtil[pid] = smPercent
}

// ComputeMode returns GPU i's compute mode, as last set through NVML.
func (m *Machine) ComputeMode(i int) nvml.ComputeMode {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gpus[i].mode
}

// InjectXID raises XID error xid on GPU i: every event set that registered GPU
// i for XID events receives it. It reports how many event sets did.
func (m *Machine) InjectXID(i int, xid uint64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	delivered := 0
	for es := range m.eventSets {
		if es.registered[i]&nvml.EventTypeXidCriticalError == 0 {
			continue
		}
		select {
		case es.ch <- nvml.EventData{Device: m.gpus[i].dev, EventType: nvml.EventTypeXidCriticalError, EventData: xid}:
			delivered++
		default:
			// A full queue drops the event, as the driver's ring does.
		}
	}
	return delivered
}

// WriteSysfs writes the sysfs files the topology model reads, for this
// machine, under root: bus/pci/devices/<addr>/numa_node for each GPU and
// devices/system/node/node<N>/cpulist for each NUMA node.
func (m *Machine) WriteSysfs(root string) error {
	for _, g := range m.profile.GPUs {
		dir := filepath.Join(root, "bus", "pci", "devices", api.NormalizePCIBusID(g.PCIBusID))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("writing mock sysfs: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(fmt.Sprintf("%d\n", g.NUMANode)), 0o644); err != nil {
			return fmt.Errorf("writing mock sysfs: %w", err)
		}
	}
	for _, n := range m.profile.NUMANodes {
		dir := filepath.Join(root, "devices", "system", "node", fmt.Sprintf("node%d", n.ID))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("writing mock sysfs: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cpulist"), []byte(n.CPUs+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing mock sysfs: %w", err)
		}
	}
	return nil
}

func (m *Machine) state(i int) (gpuState, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g := *m.gpus[i]
	g.procs = append([]nvml.ProcessInfo(nil), g.procs...)
	if g.smUtil != nil {
		util := make(map[uint32]uint32, len(g.smUtil))
		for pid, v := range g.smUtil {
			util[pid] = v
		}
		g.smUtil = util
	}
	return g, g.lost
}

func (m *Machine) newInterface() *mock.Interface {
	p := m.profile
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			return p.DriverVersion, nvml.SUCCESS
		},
		SystemGetNVMLVersionFunc: func() (string, nvml.Return) {
			return "12." + p.DriverVersion, nvml.SUCCESS
		},
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) {
			return p.CUDADriverVersion, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(m.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(m.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			if _, lost := m.state(i); lost {
				return nil, nvml.ERROR_GPU_IS_LOST
			}
			return m.gpus[i].dev, nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for i, g := range m.gpus {
				if g.uuid == uuid {
					if _, lost := m.state(i); lost {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return g.dev, nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) {
			return m.newEventSet(), nvml.SUCCESS
		},
		ErrorStringFunc: func(r nvml.Return) string { return r.Error() },
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return nil }}
		},
	}
}

func (m *Machine) newEventSet() *eventSet {
	es := &eventSet{ch: make(chan nvml.EventData, 64), registered: map[int]uint64{}}
	es.set = &mock.EventSet{
		WaitFunc: func(timeoutMillis uint32) (nvml.EventData, nvml.Return) {
			t := time.NewTimer(time.Duration(timeoutMillis) * time.Millisecond)
			defer t.Stop()
			select {
			case e := <-es.ch:
				return e, nvml.SUCCESS
			case <-t.C:
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return {
			m.mu.Lock()
			defer m.mu.Unlock()
			delete(m.eventSets, es)
			return nvml.SUCCESS
		},
	}
	m.mu.Lock()
	m.eventSets[es] = struct{}{}
	m.mu.Unlock()
	return es
}

// eventSetOf finds the mock event set behind an nvml.EventSet.
func (m *Machine) eventSetOf(set nvml.EventSet) *eventSet {
	for es := range m.eventSets {
		if nvml.EventSet(es) == set {
			return es
		}
	}
	return nil
}

// eventSet implements nvml.EventSet by delegating to its mock.
func (es *eventSet) Wait(timeout uint32) (nvml.EventData, nvml.Return) { return es.set.Wait(timeout) }
func (es *eventSet) Free() nvml.Return                                 { return es.set.Free() }

var _ nvml.EventSet = (*eventSet)(nil)

// live returns a function that returns GPU i's current state, or
// ERROR_GPU_IS_LOST.
func (m *Machine) live(i int) func() (gpuState, nvml.Return) {
	return func() (gpuState, nvml.Return) {
		st, lost := m.state(i)
		if lost {
			return st, nvml.ERROR_GPU_IS_LOST
		}
		return st, nvml.SUCCESS
	}
}

func (m *Machine) newDevice(g *gpuState) *mock.Device {
	p := m.profile.GPUs[g.index]
	i := g.index
	total := p.MemoryMiB << 20
	live := m.live(i)
	d := &mock.Device{}
	d.GetIndexFunc = func() (int, nvml.Return) { _, r := live(); return i, r }
	d.GetMinorNumberFunc = func() (int, nvml.Return) { _, r := live(); return i, r }
	d.GetUUIDFunc = func() (string, nvml.Return) { _, r := live(); return g.uuid, r }
	d.GetNameFunc = func() (string, nvml.Return) { _, r := live(); return p.Model, r }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { _, r := live(); return nvml.BRAND_NVIDIA, r }
	d.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { _, r := live(); return pciInfo(g.busID), r }
	d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
		st, r := live()
		used := st.baseUse
		for _, proc := range st.procs {
			used += proc.UsedGpuMemory
		}
		if used > total {
			used = total
		}
		return nvml.Memory{Total: total, Used: used, Free: total - used}, r
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		st, r := live()
		if r != nvml.SUCCESS {
			return nil, r
		}
		return append([]nvml.ProcessInfo(nil), st.procs...), r
	}
	d.GetComputeModeFunc = func() (nvml.ComputeMode, nvml.Return) {
		st, r := live()
		return st.mode, r
	}
	d.SetComputeModeFunc = func(mode nvml.ComputeMode) nvml.Return {
		if _, r := live(); r != nvml.SUCCESS {
			return r
		}
		switch mode {
		case nvml.COMPUTEMODE_DEFAULT, nvml.COMPUTEMODE_EXCLUSIVE_THREAD, nvml.COMPUTEMODE_PROHIBITED, nvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		default:
			return nvml.ERROR_INVALID_ARGUMENT
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		m.gpus[i].mode = mode
		return nvml.SUCCESS
	}
	d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		st, r := live()
		if r != nvml.SUCCESS {
			return nil, r
		}
		now := uint64(time.Now().UnixMicro())
		var out []nvml.ProcessUtilizationSample
		for _, p := range st.procs {
			out = append(out, nvml.ProcessUtilizationSample{Pid: p.Pid, TimeStamp: now, SmUtil: st.smUtil[p.Pid]})
		}
		if len(out) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return out, nvml.SUCCESS
	}
	d.GetNvLinkStateFunc = func(link int) (nvml.EnableState, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.FEATURE_DISABLED, r
		}
		if link < 0 || link >= nvml.NVLINK_MAX_LINKS {
			return nvml.FEATURE_DISABLED, nvml.ERROR_INVALID_ARGUMENT
		}
		if link >= len(g.links) {
			return nvml.FEATURE_DISABLED, nvml.ERROR_NOT_SUPPORTED
		}
		return nvml.FEATURE_ENABLED, nvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (nvml.PciInfo, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.PciInfo{}, r
		}
		if link < 0 || link >= len(g.links) {
			return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return pciInfo(g.links[link].remoteBusID), nvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (nvml.IntNvLinkDeviceType, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, r
		}
		if link < 0 || link >= len(g.links) {
			return nvml.NVLINK_DEVICE_TYPE_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		return g.links[link].remote, nvml.SUCCESS
	}
	d.GetTopologyCommonAncestorFunc = func(other nvml.Device) (nvml.GpuTopologyLevel, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return 0, r
		}
		j, ok := m.indexOf(other)
		if !ok {
			return 0, nvml.ERROR_INVALID_ARGUMENT
		}
		if _, lost := m.state(j); lost {
			return 0, nvml.ERROR_GPU_IS_LOST
		}
		return m.commonAncestor(i, j), nvml.SUCCESS
	}
	d.GetP2PStatusFunc = func(other nvml.Device, capIndex nvml.GpuP2PCapsIndex) (nvml.GpuP2PStatus, nvml.Return) {
		if _, r := live(); r != nvml.SUCCESS {
			return nvml.P2P_STATUS_UNKNOWN, r
		}
		j, ok := m.indexOf(other)
		if !ok {
			return nvml.P2P_STATUS_UNKNOWN, nvml.ERROR_INVALID_ARGUMENT
		}
		nvlinked := m.nvlinked(i, j)
		if capIndex == nvml.P2P_CAPS_INDEX_NVLINK {
			if nvlinked {
				return nvml.P2P_STATUS_OK, nvml.SUCCESS
			}
			return nvml.P2P_STATUS_NOT_SUPPORTED, nvml.SUCCESS
		}
		if nvlinked || m.commonAncestor(i, j) <= nvml.TOPOLOGY_HOSTBRIDGE {
			return nvml.P2P_STATUS_OK, nvml.SUCCESS
		}
		return nvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, nvml.SUCCESS
	}
	d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
		_, r := live()
		return nvml.EventTypeXidCriticalError, r
	}
	d.RegisterEventsFunc = func(mask uint64, set nvml.EventSet) nvml.Return {
		if _, r := live(); r != nvml.SUCCESS {
			return r
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		es := m.eventSetOf(set)
		if es == nil {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		es.registered[i] |= mask
		return nvml.SUCCESS
	}
	m.addMIG(d, g, live)
	return d
}

// indexOf finds the GPU behind a device handle. Libraries wrap handles (go-nvlib
// embeds nvml.Device in its own type), so the handle is matched by UUID.
func (m *Machine) indexOf(d nvml.Device) (int, bool) {
	if d == nil {
		return 0, false
	}
	uuid, ret := d.GetUUID()
	if ret != nvml.SUCCESS {
		return 0, false
	}
	for i, g := range m.gpus {
		if g.uuid == uuid {
			return i, true
		}
	}
	return 0, false
}

func (m *Machine) nvlinked(i, j int) bool {
	if m.profile.NVLinks != nil && m.profile.NVLinks[i][j] > 0 {
		return true
	}
	s := m.profile.NVSwitch
	return s.Covers(i) && s.Covers(j)
}

func (m *Machine) commonAncestor(i, j int) nvml.GpuTopologyLevel {
	if i == j {
		return nvml.TOPOLOGY_INTERNAL
	}
	if m.profile.PCIe != nil {
		switch m.profile.PCIe[i][j] {
		case api.PCIeSingleSwitch:
			return nvml.TOPOLOGY_SINGLE
		case api.PCIeMultiSwitch:
			return nvml.TOPOLOGY_MULTIPLE
		case api.PCIeHostBridge:
			return nvml.TOPOLOGY_HOSTBRIDGE
		case api.PCIeNUMANode:
			return nvml.TOPOLOGY_NODE
		}
		return nvml.TOPOLOGY_SYSTEM
	}
	a, b := m.profile.GPUs[i].NUMANode, m.profile.GPUs[j].NUMANode
	if a >= 0 && a == b {
		return nvml.TOPOLOGY_NODE
	}
	return nvml.TOPOLOGY_SYSTEM
}

// nvmlBusID returns a PCI address in NVML's form, with an 8-digit domain.
func nvmlBusID(addr string) string {
	return "0000" + api.NormalizePCIBusID(addr)
}

func pciInfo(nvmlAddr string) nvml.PciInfo {
	var p nvml.PciInfo
	copy(p.BusId[:], nvmlAddr)
	copy(p.BusIdLegacy[:], api.NormalizePCIBusID(nvmlAddr))
	var domain, bus, dev, fn uint32
	if _, err := fmt.Sscanf(nvmlAddr, "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err == nil {
		p.Domain, p.Bus, p.Device = domain, bus, dev
	}
	return p
}

// switchBusIDs picks PCI addresses for n NVSwitches that no GPU uses, from
// bus 0xff down.
func switchBusIDs(n int, used map[string]bool) []string {
	var out []string
	for bus := 0xff; bus > 0 && len(out) < n; bus-- {
		id := fmt.Sprintf("00000000:%02x:00.0", bus)
		if !used[id] {
			out = append(out, id)
		}
	}
	return out
}

// derivedUUID is a stable UUID for GPU i of the named machine.
func derivedUUID(machine string, i int) string {
	sum := sha256.Sum256([]byte(fmt.Sprintf("tessera-mock/%s/%d", machine, i)))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}
