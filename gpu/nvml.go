package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/api"
)

// nvmlLib adapts a go-nvml nvml.Interface (the real library or a mock) to
// Interface.
type nvmlLib struct {
	lib nvml.Interface

	mu          sync.Mutex
	initialized bool
}

var _ Interface = (*nvmlLib)(nil)

// NewNVML adapts lib. Use nvml.New() for the real driver.
func NewNVML(lib nvml.Interface) Interface {
	return &nvmlLib{lib: lib}
}

// Error is an NVML call that failed.
type Error struct {
	// Op is the NVML call, e.g. "GetUUID".
	Op string
	// Index is the GPU's index, or -1 when the call concerns no one GPU.
	Index int
	// Return is NVML's return code.
	Return nvml.Return
}

func (e *Error) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("nvml %s: %s", e.Op, e.Return.Error())
	}
	return fmt.Sprintf("nvml %s on GPU %d: %s", e.Op, e.Index, e.Return.Error())
}

// Is maps NVML return codes to the package's sentinel errors.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrGPULost:
		return e.Return == nvml.ERROR_GPU_IS_LOST
	case ErrNotSupported:
		return e.Return == nvml.ERROR_NOT_SUPPORTED
	case ErrLibraryNotFound:
		return e.Return == nvml.ERROR_LIBRARY_NOT_FOUND
	case ErrNoDevice:
		return e.Return == nvml.ERROR_INVALID_ARGUMENT || e.Return == nvml.ERROR_NOT_FOUND
	case ErrNotInitialized:
		return e.Return == nvml.ERROR_UNINITIALIZED
	}
	return false
}

func fail(op string, index int, ret nvml.Return) error {
	if ret == nvml.SUCCESS {
		return nil
	}
	return &Error{Op: op, Index: index, Return: ret}
}

func (l *nvmlLib) Init() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.initialized {
		return nil
	}
	ret := l.lib.Init()
	switch ret {
	case nvml.SUCCESS:
		l.initialized = true
		return nil
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%w: %w", ErrLibraryNotFound, fail("Init", -1, ret))
	case nvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("libnvidia-ml.so.1 loaded but the NVIDIA kernel driver is not: %w", fail("Init", -1, ret))
	}
	return fail("Init", -1, ret)
}

func (l *nvmlLib) Shutdown() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.initialized {
		return nil
	}
	l.initialized = false
	return fail("Shutdown", -1, l.lib.Shutdown())
}

// ready guards every call: go-nvml's real library has no symbols to call
// before a successful Init.
func (l *nvmlLib) ready() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.initialized {
		return ErrNotInitialized
	}
	return nil
}

func (l *nvmlLib) DriverVersion() (string, error) {
	if err := l.ready(); err != nil {
		return "", err
	}
	v, ret := l.lib.SystemGetDriverVersion()
	return v, fail("SystemGetDriverVersion", -1, ret)
}

func (l *nvmlLib) DeviceCount() (int, error) {
	if err := l.ready(); err != nil {
		return 0, err
	}
	n, ret := l.lib.DeviceGetCount()
	return n, fail("DeviceGetCount", -1, ret)
}

func (l *nvmlLib) handle(index int) (nvml.Device, error) {
	if err := l.ready(); err != nil {
		return nil, err
	}
	d, ret := l.lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return nil, fail("DeviceGetHandleByIndex", index, ret)
	}
	return d, nil
}

func (l *nvmlLib) Device(index int) (DeviceInfo, error) {
	d, err := l.handle(index)
	if err != nil {
		return DeviceInfo{}, err
	}
	info := DeviceInfo{Index: index}
	var ret nvml.Return
	if info.UUID, ret = d.GetUUID(); ret != nvml.SUCCESS {
		return DeviceInfo{}, fail("GetUUID", index, ret)
	}
	if info.Model, ret = d.GetName(); ret != nvml.SUCCESS {
		return DeviceInfo{}, fail("GetName", index, ret)
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return DeviceInfo{}, fail("GetMemoryInfo", index, ret)
	}
	info.MemoryMiB = mem.Total / (1 << 20)
	pci, ret := d.GetPciInfo()
	if ret != nvml.SUCCESS {
		return DeviceInfo{}, fail("GetPciInfo", index, ret)
	}
	info.PCIBusID = busID(pci)
	if info.Minor, ret = d.GetMinorNumber(); ret != nvml.SUCCESS {
		return DeviceInfo{}, fail("GetMinorNumber", index, ret)
	}
	return info, nil
}

// busID decodes NVML's NUL-terminated bus id into sysfs form.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return api.NormalizePCIBusID(string(b))
}

func (l *nvmlLib) NVLinks(index int) ([]NVLink, error) {
	d, err := l.handle(index)
	if err != nil {
		return nil, err
	}
	var links []NVLink
	for i := 0; i < nvml.NVLINK_MAX_LINKS; i++ {
		state, ret := d.GetNvLinkState(i)
		if ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fail(fmt.Sprintf("GetNvLinkState(%d)", i), index, ret)
		}
		if state != nvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := d.GetNvLinkRemotePciInfo(i)
		if ret != nvml.SUCCESS {
			return nil, fail(fmt.Sprintf("GetNvLinkRemotePciInfo(%d)", i), index, ret)
		}
		link := NVLink{Link: i, RemotePCIBusID: busID(pci)}
		kind, ret := d.GetNvLinkRemoteDeviceType(i)
		switch {
		case ret == nvml.ERROR_NOT_SUPPORTED:
			// Older drivers cannot say; a link to a GPU is the common case.
			link.Remote = RemoteGPU
		case ret != nvml.SUCCESS:
			return nil, fail(fmt.Sprintf("GetNvLinkRemoteDeviceType(%d)", i), index, ret)
		default:
			link.Remote = remoteOf(kind)
		}
		links = append(links, link)
	}
	return links, nil
}

func remoteOf(t nvml.IntNvLinkDeviceType) NVLinkRemote {
	switch t {
	case nvml.NVLINK_DEVICE_TYPE_GPU:
		return RemoteGPU
	case nvml.NVLINK_DEVICE_TYPE_SWITCH:
		return RemoteSwitch
	case nvml.NVLINK_DEVICE_TYPE_IBMNPU:
		return RemoteCPU
	}
	return RemoteUnknown
}

func (l *nvmlLib) CommonAncestor(a, b int) (PCIeLevel, error) {
	da, err := l.handle(a)
	if err != nil {
		return 0, err
	}
	db, err := l.handle(b)
	if err != nil {
		return 0, err
	}
	level, ret := da.GetTopologyCommonAncestor(db)
	if ret != nvml.SUCCESS {
		return 0, fail(fmt.Sprintf("GetTopologyCommonAncestor(%d)", b), a, ret)
	}
	switch level {
	case nvml.TOPOLOGY_INTERNAL:
		return LevelInternal, nil
	case nvml.TOPOLOGY_SINGLE:
		return LevelSingleSwitch, nil
	case nvml.TOPOLOGY_MULTIPLE:
		return LevelMultiSwitch, nil
	case nvml.TOPOLOGY_HOSTBRIDGE:
		return LevelHostBridge, nil
	case nvml.TOPOLOGY_NODE:
		return LevelNUMANode, nil
	case nvml.TOPOLOGY_SYSTEM:
		return LevelSystem, nil
	}
	return 0, fmt.Errorf("nvml GetTopologyCommonAncestor(%d) on GPU %d: unknown topology level %d", b, a, level)
}

func (l *nvmlLib) P2PReadSupported(a, b int) (bool, error) {
	da, err := l.handle(a)
	if err != nil {
		return false, err
	}
	db, err := l.handle(b)
	if err != nil {
		return false, err
	}
	status, ret := da.GetP2PStatus(db, nvml.P2P_CAPS_INDEX_READ)
	if ret != nvml.SUCCESS {
		return false, fail(fmt.Sprintf("GetP2PStatus(%d)", b), a, ret)
	}
	return status == nvml.P2P_STATUS_OK, nil
}

func (l *nvmlLib) MemoryInfo(index int) (Memory, error) {
	d, err := l.handle(index)
	if err != nil {
		return Memory{}, err
	}
	m, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Memory{}, fail("GetMemoryInfo", index, ret)
	}
	return Memory{Total: m.Total, Used: m.Used, Free: m.Free}, nil
}

func (l *nvmlLib) Processes(index int) ([]Process, error) {
	d, err := l.handle(index)
	if err != nil {
		return nil, err
	}
	ps, ret := d.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS {
		return nil, fail("GetComputeRunningProcesses", index, ret)
	}
	out := make([]Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, Process{PID: p.Pid, UsedMemory: p.UsedGpuMemory})
	}
	return out, nil
}

func (l *nvmlLib) CheckHealth(index int) error {
	d, err := l.handle(index)
	if err != nil {
		return err
	}
	// GetUUID and GetMemoryInfo are the cheapest calls that reach the GPU
	// itself; a GPU off the bus fails them with ERROR_GPU_IS_LOST.
	if _, ret := d.GetUUID(); ret != nvml.SUCCESS {
		return fail("GetUUID", index, ret)
	}
	if _, ret := d.GetMemoryInfo(); ret != nvml.SUCCESS {
		return fail("GetMemoryInfo", index, ret)
	}
	return nil
}

// xidWaitMillis bounds one EventSet.Wait so WatchXIDs notices ctx ending.
const xidWaitMillis = 1000

func (l *nvmlLib) WatchXIDs(ctx context.Context, out chan<- XIDEvent) error {
	if err := l.ready(); err != nil {
		return err
	}
	set, ret := l.lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fail("EventSetCreate", -1, ret)
	}
	defer set.Free()

	n, err := l.DeviceCount()
	if err != nil {
		return err
	}
	uuidOf := map[string]int{}
	registered := 0
	var errs []error
	for i := 0; i < n; i++ {
		d, err := l.handle(i)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		uuid, ret := d.GetUUID()
		if ret != nvml.SUCCESS {
			errs = append(errs, fail("GetUUID", i, ret))
			continue
		}
		uuidOf[uuid] = i
		if ret := d.RegisterEvents(nvml.EventTypeXidCriticalError, set); ret != nvml.SUCCESS {
			// One GPU that cannot report events must not blind us to the
			// others; the health checker still polls it.
			errs = append(errs, fail("RegisterEvents", i, ret))
			continue
		}
		registered++
	}
	if registered == 0 && n > 0 {
		return fmt.Errorf("no GPU accepted XID event registration: %w", errors.Join(errs...))
	}

	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		e, ret := set.Wait(xidWaitMillis)
		if ret == nvml.ERROR_TIMEOUT {
			continue
		}
		if ret != nvml.SUCCESS {
			if ret == nvml.ERROR_GPU_IS_LOST {
				// A GPU fell off the bus; the periodic health check
				// (CheckHealth) reports which one.
				continue
			}
			return fail("EventSetWait", -1, ret)
		}
		if e.EventType != nvml.EventTypeXidCriticalError {
			continue
		}
		ev := XIDEvent{Index: -1, XID: e.EventData}
		if e.Device != nil {
			if uuid, ret := e.Device.GetUUID(); ret == nvml.SUCCESS {
				if i, ok := uuidOf[uuid]; ok {
					ev.Index, ev.UUID = i, uuid
				}
			}
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
