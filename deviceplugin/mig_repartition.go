package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
)

// MIGDriver is what dynamic MIG needs of the GPU driver; gpu.Interface
// satisfies it.
type MIGDriver interface {
	MIG(index int) (gpu.MIGInfo, error)
	SetMIGLayout(index int, want []gpu.MIGSpec) error
	Processes(index int) ([]gpu.Process, error)
}

var _ MIGDriver = gpu.Interface(nil)

// MIGRepartitioner serves a node's MIG layout request (dynamic MIG,
// docs/mig.md): it repartitions a GPU to the wanted layout only when no
// container is allocated an instance of it (or the GPU itself) by the
// kubelet and no process runs on it. An allocation source it cannot read
// means no repartition (fail closed).
type MIGRepartitioner struct {
	Driver  MIGDriver
	Kubelet kubeletstate.Source
	// GPUs maps the node's GPU UUIDs to their NVML index.
	GPUs map[string]int
}

// MIGChange is one GPU of a request whose layout differs from the wanted.
type MIGChange struct {
	Index int
	UUID  string
	// Current are the GPU's instances now, Want the requested ones.
	Current []gpu.MIGInstance
	Want    []gpu.MIGSpec
}

// ErrMIGTenant is a refusal: a GPU to repartition has a tenant, or its
// tenants cannot be known.
var ErrMIGTenant = errors.New("GPU has a tenant or its allocations cannot be read")

// Changes lists the GPUs of req whose layout differs from the wanted one.
// A GPU that is not the node's, or not in MIG mode, is an error.
func (r *MIGRepartitioner) Changes(req *api.MIGLayoutRequest) ([]MIGChange, error) {
	var out []MIGChange
	for _, g := range req.GPUs {
		i, ok := r.GPUs[g.UUID]
		if !ok {
			return nil, fmt.Errorf("GPU %s is not this node's", g.UUID)
		}
		info, err := r.Driver.MIG(i)
		if err != nil {
			return nil, fmt.Errorf("reading the MIG layout of GPU %d: %w", i, err)
		}
		if !info.Enabled {
			return nil, fmt.Errorf("GPU %d (%s) is not in MIG mode", i, g.UUID)
		}
		want := make([]gpu.MIGSpec, 0, len(g.Instances))
		for _, in := range g.Instances {
			want = append(want, gpu.MIGSpec{Profile: in.Profile, Start: in.Start, Size: in.Size})
		}
		if sameLayout(info.Instances, want) {
			continue
		}
		out = append(out, MIGChange{Index: i, UUID: g.UUID, Current: info.Instances, Want: want})
	}
	return out, nil
}

func sameLayout(have []gpu.MIGInstance, want []gpu.MIGSpec) bool {
	if len(have) != len(want) {
		return false
	}
	key := func(p string, s, n int) string { return fmt.Sprintf("%s@%d+%d", p, s, n) }
	var a, b []string
	for _, in := range have {
		a = append(a, key(in.Profile, in.Start, in.Size))
	}
	for _, in := range want {
		b = append(b, key(in.Profile, in.Start, in.Size))
	}
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// CheckTenants returns an error matching ErrMIGTenant, naming the tenant,
// when a GPU of changes has one: a container the kubelet allocated one of
// its instances (or the GPU), or a process on it; when a container is
// allocated a MIG instance the node does not have (it cannot be mapped to
// a GPU); or when the kubelet's allocations or the GPU's processes cannot
// be read.
func (r *MIGRepartitioner) CheckTenants(ctx context.Context, changes []MIGChange) error {
	if r.Kubelet == nil {
		return fmt.Errorf("%w: no source of the kubelet's allocations", ErrMIGTenant)
	}
	allocs, err := r.Kubelet.Allocations(ctx)
	if err != nil {
		return fmt.Errorf("%w: reading the kubelet's allocations (%s): %w", ErrMIGTenant, r.Kubelet.Name(), err)
	}
	// An allocated MIG instance the node does not have (its layout changed
	// under the pod: destroyed out of band, a GPU reset) cannot be placed
	// on a GPU: any may be its, so none is repartitioned.
	known := map[string]bool{}
	for _, i := range r.GPUs {
		if info, err := r.Driver.MIG(i); err == nil && info.Enabled {
			for _, in := range info.Instances {
				known[in.UUID] = true
			}
		}
	}
	for _, a := range allocs {
		if _, ok := api.MIGProfileOf(a.Resource); !ok {
			continue
		}
		for _, id := range a.DeviceIDs {
			if !known[id] {
				who := a.Namespace + "/" + a.Name
				if a.Name == "" {
					who = "pod " + a.PodUID
				}
				return fmt.Errorf("%w: %s container %s holds %s (%s), a MIG instance this node does not have: it may be on any GPU", ErrMIGTenant, who, a.Container, id, a.Resource)
			}
		}
	}
	for _, c := range changes {
		ids := map[string]bool{c.UUID: true}
		for _, in := range c.Current {
			ids[in.UUID] = true
		}
		for _, a := range allocs {
			for _, id := range a.DeviceIDs {
				if ids[id] {
					who := a.Namespace + "/" + a.Name
					if a.Name == "" {
						who = "pod " + a.PodUID
					}
					return fmt.Errorf("%w: GPU %d: %s container %s holds %s (%s)", ErrMIGTenant, c.Index, who, a.Container, id, a.Resource)
				}
			}
		}
		procs, err := r.Driver.Processes(c.Index)
		if err != nil {
			return fmt.Errorf("%w: GPU %d: listing its processes: %w", ErrMIGTenant, c.Index, err)
		}
		if len(procs) > 0 {
			return fmt.Errorf("%w: GPU %d: %d processes run on it (PID %d first)", ErrMIGTenant, c.Index, len(procs), procs[0].PID)
		}
	}
	return nil
}

// Apply serves req: it checks that no GPU to change has a tenant and then
// repartitions each. The status says Applied when every GPU has its
// layout (nothing to change included), Refused when a GPU has a tenant
// (nothing is touched) or the request cannot be served on this node, and
// Failed when NVML failed; changed reports whether any GPU's layout was
// touched (the caller reads the layouts again and republishes).
func (r *MIGRepartitioner) Apply(ctx context.Context, req *api.MIGLayoutRequest) (status api.MIGLayoutStatus, changed bool) {
	logger := klog.FromContext(ctx)
	status = api.MIGLayoutStatus{APIVersion: api.Version, Kind: api.KindMIGLayoutStatus, Generation: req.Generation}
	changes, err := r.Changes(req)
	if err != nil {
		status.State, status.Message = api.MIGLayoutRefused, err.Error()
		return status, false
	}
	if len(changes) == 0 {
		status.State = api.MIGLayoutApplied
		return status, false
	}
	if err := r.CheckTenants(ctx, changes); err != nil {
		status.State, status.Message = api.MIGLayoutRefused, err.Error()
		return status, false
	}
	var failed []string
	for _, c := range changes {
		logger.Info("Repartitioning a GPU without a tenant (dynamic MIG)", "gpu", c.Index, "uuid", c.UUID, "from", c.Current, "to", c.Want, "generation", req.Generation)
		changed = true
		if err := r.Driver.SetMIGLayout(c.Index, c.Want); err != nil {
			logger.Error(err, "Repartitioning failed; the GPU's layout is read again as it is", "gpu", c.Index)
			failed = append(failed, fmt.Sprintf("GPU %d: %v", c.Index, err))
		}
	}
	if len(failed) > 0 {
		status.State, status.Message = api.MIGLayoutFailed, strings.Join(failed, "; ")
		return status, changed
	}
	status.State = api.MIGLayoutApplied
	return status, changed
}
