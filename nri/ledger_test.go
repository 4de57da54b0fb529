package nri

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
)

func TestLedgerCheckpointAndRebuild(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenLedger(dir)
	if err != nil {
		t.Fatal(err)
	}
	a := Entry{PodUID: "u1", Namespace: "ns", Pod: "a", Container: "c", ContainerID: "id1", GPUs: []api.GPURef{{UUID: uuid0, Index: 0}}}
	b := Entry{PodUID: "u2", Namespace: "ns", Pod: "b", Container: "c", ContainerID: "id2", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 2048, Cores: 20}}
	b2 := Entry{PodUID: "u2", Namespace: "ns", Pod: "b", Container: "d", ContainerID: "id3", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, MemoryMiB: 1024}}
	for _, e := range []Entry{a, b, b2} {
		if err := l.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	reopen := func() []Entry {
		t.Helper()
		l2, err := OpenLedger(dir)
		if err != nil {
			t.Fatal(err)
		}
		return l2.Snapshot()
	}
	if diff := cmp.Diff([]Entry{a, b, b2}, reopen()); diff != "" {
		t.Fatalf("rebuilt ledger (-want +got):\n%s", diff)
	}

	// A restarted container replaces its entry; removing the old ID then
	// frees nothing.
	restarted := a
	restarted.ContainerID = "id1-new"
	if err := l.Put(restarted); err != nil {
		t.Fatal(err)
	}
	if err := l.RemoveContainer("u1", "c", "id1"); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Entry{restarted, b, b2}, reopen()); diff != "" {
		t.Fatalf("after a stale removal (-want +got):\n%s", diff)
	}
	if err := l.RemoveContainer("u1", "c", "id1-new"); err != nil {
		t.Fatal(err)
	}
	if err := l.RemovePod("u2"); err != nil {
		t.Fatal(err)
	}
	if got := reopen(); len(got) != 0 {
		t.Fatalf("after removals the checkpoint still holds %v", got)
	}
	// No temporary files are left behind.
	files, _ := os.ReadDir(dir)
	if len(files) != 1 || files[0].Name() != LedgerFile {
		t.Errorf("state directory holds %v, want only %s", files, LedgerFile)
	}
}

// GPUsInUse names the GPUs of every recorded container (a multi-GPU
// slice's every GPU), and each change, not a no-op, calls OnChange.
func TestLedgerGPUsInUseAndOnChange(t *testing.T) {
	l, err := OpenLedger(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	changes := 0
	l.OnChange(func() { changes++ })
	ref := func(i int) api.GPURef { return api.GPURef{UUID: fmt.Sprintf("GPU-%d", i), Index: i} }
	for _, e := range []Entry{
		{PodUID: "w", Container: "c", GPUs: []api.GPURef{ref(0), ref(1)}},
		{PodUID: "s", Container: "c", Shared: &api.SharedGPU{GPU: ref(2), MemoryMiB: 1024, Cores: 10}},
		{PodUID: "m", Container: "c", Shared: &api.SharedGPU{GPU: ref(3), Spread: []api.GPURef{ref(4)}, MemoryMiB: 1024, Cores: 10}},
	} {
		if err := l.Put(e); err != nil {
			t.Fatal(err)
		}
	}
	whole, shared := l.GPUsInUse()
	if d := cmp.Diff(map[string]bool{"GPU-0": true, "GPU-1": true}, whole); d != "" {
		t.Errorf("whole (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]bool{"GPU-2": true, "GPU-3": true, "GPU-4": true}, shared); d != "" {
		t.Errorf("shared (-want +got):\n%s", d)
	}
	if err := l.RemoveContainer("nobody", "c", ""); err != nil {
		t.Fatal(err)
	}
	if err := l.RemovePod("s"); err != nil {
		t.Fatal(err)
	}
	if changes != 4 {
		t.Errorf("OnChange called %d times, want 4 (three entries, one removal; not the no-op)", changes)
	}
	if _, shared := l.GPUsInUse(); shared["GPU-2"] {
		t.Error("GPU-2 still in use after its pod was removed")
	}
}

func TestLedgerRefusesUnreadableCheckpoint(t *testing.T) {
	for name, content := range map[string]string{
		"corrupt":       "{",
		"wrong kind":    `{"apiVersion":"tessera.dev/v1alpha1","kind":"Other","entries":[]}`,
		"wrong version": `{"apiVersion":"v0","kind":"NodeGPULedger","entries":[]}`,
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, LedgerFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenLedger(dir); err == nil {
			t.Errorf("%s: OpenLedger succeeded; it must not start from an empty ledger", name)
		}
	}
}

func TestLedgerKeepsStateWhenCheckpointFails(t *testing.T) {
	dir := t.TempDir()
	l, err := OpenLedger(dir)
	if err != nil {
		t.Fatal(err)
	}
	// A directory where the checkpoint file should be makes the rename fail.
	if err := os.Mkdir(filepath.Join(dir, LedgerFile), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, LedgerFile, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Put(Entry{PodUID: "u", Container: "c"}); err == nil {
		t.Fatal("Put succeeded although the checkpoint could not be written")
	}
	if got := l.Snapshot(); len(got) != 0 {
		t.Errorf("an entry that was not checkpointed is in the ledger: %v", got)
	}
}

func TestUVMMajor(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		if err := os.WriteFile(filepath.Join(dir, "devices"), []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("Character devices:\n  1 mem\n195 nvidia-frontend\n195 nvidia\n508 nvidia-uvm\n\nBlock devices:\n  8 sd\n508 nvidia-uvm\n")
	if m, err := UVMMajor(dir); err != nil || m != 508 {
		t.Errorf("UVMMajor = %d, %v; want 508", m, err)
	}
	write("Character devices:\n  1 mem\n\nBlock devices:\n509 nvidia-uvm\n")
	if m, err := UVMMajor(dir); err != nil || m != -1 {
		t.Errorf("UVMMajor without the module = %d, %v; want -1", m, err)
	}
	if _, err := UVMMajor(filepath.Join(dir, "missing")); err == nil {
		t.Error("UVMMajor of a missing /proc succeeded")
	}
}

func TestCPUManagerState(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "cpu_manager_state")
	s := CPUManagerState{Path: path}
	if excl, err := s.HasExclusiveCPUs("u", "c"); err != nil || excl {
		t.Errorf("without a checkpoint: %v, %v; want false", excl, err)
	}
	if err := os.WriteFile(path, []byte(`{"policyName":"static","defaultCpuSet":"0-3","entries":{"u":{"c":"4-5"}},"checksum":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pod, ctr string
		want     bool
	}{{"u", "c", true}, {"u", "other", false}, {"v", "c", false}} {
		if excl, err := s.HasExclusiveCPUs(tc.pod, tc.ctr); err != nil || excl != tc.want {
			t.Errorf("HasExclusiveCPUs(%s, %s) = %v, %v; want %v", tc.pod, tc.ctr, excl, err, tc.want)
		}
	}
	if err := os.WriteFile(path, []byte(`{"policyName":"none","defaultCpuSet":""}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if excl, err := s.HasExclusiveCPUs("u", "c"); err != nil || excl {
		t.Errorf("policy none: %v, %v; want false", excl, err)
	}
	if err := os.WriteFile(path, []byte(`{`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.HasExclusiveCPUs("u", "c"); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("corrupt checkpoint: error %v, want one naming %s", err, path)
	}
}

type staticSource []kubeletstate.ContainerDevices

func (s staticSource) Allocations(context.Context) ([]kubeletstate.ContainerDevices, error) {
	return s, nil
}
func (staticSource) Name() string { return "static" }

func TestKubeletAllocations(t *testing.T) {
	src := staticSource{
		{Namespace: "ns", Name: "p", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{uuid0, uuid1}},
		{Namespace: "ns", Name: "p", Container: "c", Resource: api.ResourceGPUMemory, DeviceIDs: []string{"a", "b", "c"}},
		{Namespace: "ns", Name: "p", Container: "d", Resource: api.ResourceGPUCore, DeviceIDs: []string{"x"}},
		{Namespace: "other", Name: "p", Container: "c", Resource: api.ResourceGPU, DeviceIDs: []string{uuid3}},
		{PodUID: "uid-q", Container: "c", Resource: api.ResourceGPUCore, DeviceIDs: []string{"y", "z"}},
		{Namespace: "ns", Name: "p", Container: "c", Resource: corev1.ResourceName("example.com/x"), DeviceIDs: []string{"q"}},
	}
	k := KubeletAllocations{Source: src}
	for _, tc := range []struct {
		pod  Pod
		ctr  string
		want Devices
	}{
		{Pod{Namespace: "ns", Name: "p", UID: "uid-p"}, "c", Devices{Whole: []string{uuid0, uuid1}, MemoryUnits: 3}},
		{Pod{Namespace: "ns", Name: "p", UID: "uid-p"}, "d", Devices{CoreUnits: 1}},
		{Pod{Namespace: "ns", Name: "q", UID: "uid-q"}, "c", Devices{CoreUnits: 2}},
		{Pod{Namespace: "ns", Name: "p", UID: "uid-p"}, "none", Devices{}},
	} {
		got, err := k.ContainerDevices(context.Background(), tc.pod, tc.ctr)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s", tc.pod, tc.ctr, diff)
		}
	}
}

// A regular init container is missing from PodResources; the device
// manager's checkpoint (by pod UID) has its devices.
func TestKubeletAllocationsInitContainers(t *testing.T) {
	podResources := staticSource{{Namespace: "ns", Name: "p", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{uuid1}}}
	checkpoint := staticSource{
		{PodUID: "uid-p", Container: "main", Resource: api.ResourceGPU, DeviceIDs: []string{uuid1}},
		{PodUID: "uid-p", Container: "init", Resource: api.ResourceGPU, DeviceIDs: []string{uuid0}},
		{PodUID: "uid-other", Container: "sidecar", Resource: api.ResourceGPU, DeviceIDs: []string{uuid3}},
	}
	k := KubeletAllocations{Source: podResources, InitContainers: checkpoint}
	p := Pod{Namespace: "ns", Name: "p", UID: "uid-p"}
	for ctr, want := range map[string]Devices{"main": {Whole: []string{uuid1}}, "init": {Whole: []string{uuid0}}, "sidecar": {}} {
		got, err := k.ContainerDevices(context.Background(), p, ctr)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", ctr, diff)
		}
	}
	if _, err := (KubeletAllocations{Source: podResources, InitContainers: failing{}}).ContainerDevices(context.Background(), p, "init"); err == nil {
		t.Error("an unreadable checkpoint for a container PodResources does not list gave no error")
	}
}

type failing struct{}

func (failing) Allocations(context.Context) ([]kubeletstate.ContainerDevices, error) {
	return nil, errors.New("unreadable")
}
func (failing) Name() string { return "failing" }
