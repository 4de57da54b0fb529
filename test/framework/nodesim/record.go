package nodesim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// PodRecord is what a simulated node did with one pod: the kubelet's
// device allocation per container and what the NRI plugin adjusted. The
// node writes it to <state-dir>/pods/<uid>.json when the pod is running or
// failed, and removes it when the pod is gone.
type PodRecord struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	Node      string `json:"node"`
	// Phase is Running, Failed or Succeeded (a pod whose sleeps ended: PodRunsFor).
	Phase   string `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Containers in start order (init containers first).
	Containers []ContainerRecord `json:"containers,omitempty"`
}

// ContainerRecord is one container of a PodRecord.
type ContainerRecord struct {
	Name string `json:"name"`
	Init bool   `json:"init,omitempty"`
	ID   string `json:"id"`
	// Allocated maps each device-plugin resource to the device IDs the
	// kubelet's device manager allocated to the container.
	Allocated map[string][]string `json:"allocated,omitempty"`
	// Env is the container's final environment: the pod spec's, then the
	// device plugin's Allocate answer, then the NRI adjustment.
	Env map[string]string `json:"env,omitempty"`
	// CDIDevices are the CDI device names of the Allocate answer and the
	// NRI adjustment.
	CDIDevices []string `json:"cdiDevices,omitempty"`
	// Devices are the device nodes the NRI adjustment added ("path").
	Devices []string `json:"devices,omitempty"`
	// RemovedDevices are device nodes the NRI adjustment removed.
	RemovedDevices []string `json:"removedDevices,omitempty"`
	// CgroupRules are the device cgroup rules of the adjustment
	// ("allow c 195:0 rw").
	CgroupRules []string `json:"cgroupRules,omitempty"`
	// Mounts are the adjustment's mounts ("source -> destination").
	Mounts []string `json:"mounts,omitempty"`
	// CPUs and Mems are the container's cpuset after the adjustment; the
	// runtime gave the node's shared pool (every CPU and memory node).
	CPUs string `json:"cpus,omitempty"`
	Mems string `json:"mems,omitempty"`
	// Adjusted is false when the NRI plugin left the container alone.
	Adjusted bool `json:"adjusted"`
}

// RecordDir is where a node's PodRecords are, below its state directory.
func RecordDir(stateDir string) string { return filepath.Join(stateDir, "pods") }

func writeRecord(stateDir string, r *PodRecord) error {
	dir := RecordDir(stateDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+r.UID+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, r.UID+".json"))
}

func removeRecord(stateDir, uid string) error {
	err := os.Remove(filepath.Join(RecordDir(stateDir), uid+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// ReadRecords returns the PodRecords of the node whose state directory is
// stateDir, by pod UID.
func ReadRecords(stateDir string) (map[string]*PodRecord, error) {
	entries, err := os.ReadDir(RecordDir(stateDir))
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]*PodRecord{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]*PodRecord{}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(RecordDir(stateDir), e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		var r PodRecord
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), err)
		}
		out[r.UID] = &r
	}
	return out, nil
}

// ReadRecord returns the record of one pod, or nil when there is none.
func ReadRecord(stateDir, uid string) (*PodRecord, error) {
	b, err := os.ReadFile(filepath.Join(RecordDir(stateDir), uid+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r PodRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", uid, err)
	}
	return &r, nil
}

// Container returns the record of container name, or nil.
func (r *PodRecord) Container(name string) *ContainerRecord {
	for i := range r.Containers {
		if r.Containers[i].Name == name {
			return &r.Containers[i]
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
