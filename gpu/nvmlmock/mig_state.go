package nvmlmock

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/api"
)

// migStateKind is the kind of a MIG state file.
const migStateKind = "MockMIGState"

// migStateFile is what PersistMIG keeps: per GPU in MIG mode, by UUID, its
// instances and how many were created through NVML (so that new UUIDs stay
// new after a restart).
type migStateFile struct {
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	GPUs       []migStateGPU `json:"gpus"`
}

type migStateGPU struct {
	UUID      string             `json:"uuid"`
	Created   int                `json:"created"`
	Instances []migStateInstance `json:"instances"`
}

type migStateInstance struct {
	UUID          string `json:"uuid"`
	Profile       string `json:"profile"`
	Start         int    `json:"start"`
	Size          int    `json:"size"`
	GPUInstanceID int    `json:"gpuInstanceID"`
	// Compute is false for a GPU instance without its compute instance
	// (a repartition stopped half way).
	Compute bool `json:"compute"`
}

// PersistMIG keeps the machine's MIG layouts in the file at path, as the
// driver keeps them while the processes using NVML come and go: when the
// file exists, the layouts of the GPUs in MIG mode are read from it (GPUs
// matched by UUID; a GPU the file does not name keeps its profile's
// layout); from then on every change made through NVML (a GPU or compute
// instance created or destroyed) is written to it. The file is written at
// once. A node simulator gives each node's agent its own file, so a
// restarted agent finds the layouts a repartition left.
//
// A change that cannot be written makes its NVML call return ERROR_UNKNOWN
// (the change stays in memory).
func (m *Machine) PersistMIG(path string) error {
	if path == "" {
		return errors.New("mock MIG state: no file")
	}
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("mock MIG state: %w", err)
	default:
		if err := m.restoreMIG(b); err != nil {
			return fmt.Errorf("mock MIG state %s: %w", path, err)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.migFile = path
	if err := m.saveMIGLocked(); err != nil {
		m.migFile = ""
		return err
	}
	return nil
}

// restoreMIG replaces the layouts of the GPUs in MIG mode with the file's.
func (m *Machine) restoreMIG(b []byte) error {
	var f migStateFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&f); err != nil {
		return err
	}
	if f.APIVersion != api.Version || f.Kind != migStateKind {
		return fmt.Errorf("apiVersion and kind: want %s %s, got %q %q", api.Version, migStateKind, f.APIVersion, f.Kind)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	byUUID := map[string]*gpuState{}
	for _, g := range m.gpus {
		byUUID[g.uuid] = g
	}
	type restored struct {
		g       *gpuState
		created int
		mig     []*migState
	}
	var out []restored
	for i, sg := range f.GPUs {
		g, ok := byUUID[sg.UUID]
		if !ok || m.profile.GPUs[g.index].MIG == nil {
			continue // not this machine's, or not in MIG mode: the profile rules
		}
		gpuMiB := m.profile.GPUs[g.index].MemoryMiB
		var places []api.MIGPlacement
		ids := map[int]bool{}
		var mig []*migState
		for k, in := range sg.Instances {
			field := fmt.Sprintf("gpus[%d].instances[%d]", i, k)
			var slices, gb uint64
			if _, err := fmt.Sscanf(in.Profile, "%dg.%dgb", &slices, &gb); err != nil || slices == 0 || slices > api.MIGSlices {
				return fmt.Errorf("%s.profile: %q", field, in.Profile)
			}
			if !api.ValidMIGUUID(in.UUID) {
				return fmt.Errorf("%s.uuid: %q", field, in.UUID)
			}
			if in.GPUInstanceID <= 0 || ids[in.GPUInstanceID] {
				return fmt.Errorf("%s.gpuInstanceID: %d", field, in.GPUInstanceID)
			}
			ids[in.GPUInstanceID] = true
			places = append(places, api.MIGPlacement{Start: in.Start, Size: in.Size})
			mig = append(mig, &migState{
				uuid: in.UUID, profile: in.Profile, start: in.Start, size: in.Size,
				gpuInstanceID: in.GPUInstanceID, slices: uint32(slices),
				memoryMiB: migMemoryMiB(in.Size, gpuMiB), compute: in.Compute,
			})
		}
		if len(mig) > maxMIGDevices {
			return fmt.Errorf("gpus[%d].instances: at most %d, got %d", i, maxMIGDevices, len(mig))
		}
		if err := api.CheckMIGPlacements(fmt.Sprintf("gpus[%d].instances", i), places); err != nil {
			return err
		}
		out = append(out, restored{g: g, created: sg.Created, mig: mig})
	}
	for _, r := range out {
		live := m.live(r.g.index)
		for _, s := range r.mig {
			s.dev = m.migDevice(r.g.dev, s, live)
		}
		r.g.mig, r.g.migGen = r.mig, max(r.g.migGen, r.created)
	}
	return nil
}

// saveMIGLocked writes the layouts to m.migFile (when set), replacing it
// whole. m.mu is held.
func (m *Machine) saveMIGLocked() error {
	if m.migFile == "" {
		return nil
	}
	f := migStateFile{APIVersion: api.Version, Kind: migStateKind, GPUs: []migStateGPU{}}
	for i, g := range m.gpus {
		if m.profile.GPUs[i].MIG == nil {
			continue
		}
		sg := migStateGPU{UUID: g.uuid, Created: g.migGen, Instances: []migStateInstance{}}
		for _, s := range g.mig {
			sg.Instances = append(sg.Instances, migStateInstance{UUID: s.uuid, Profile: s.profile, Start: s.start, Size: s.size, GPUInstanceID: s.gpuInstanceID, Compute: s.compute})
		}
		f.GPUs = append(f.GPUs, sg)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("mock MIG state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(m.migFile), filepath.Base(m.migFile)+".tmp-*")
	if err != nil {
		return fmt.Errorf("mock MIG state: %w", err)
	}
	_, err = tmp.Write(append(b, '\n'))
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), m.migFile)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("mock MIG state: %w", err)
	}
	return nil
}

// migChangedLocked saves a change made through NVML; r is the call's
// result, ERROR_UNKNOWN when the change could not be saved. m.mu is held.
func (m *Machine) migChangedLocked(r nvml.Return) nvml.Return {
	if r != nvml.SUCCESS {
		return r
	}
	if m.saveMIGLocked() != nil {
		return nvml.ERROR_UNKNOWN
	}
	return r
}
