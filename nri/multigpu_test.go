package nri

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/gpureq"
)

// A multi-GPU slice at container creation: the split comes from the
// sealed assignment's GPUs (or, placed here, from the pod's
// tessera.dev/gpu-count), each GPU is checked, the group rule holds
// against the ledger, and the container gets its GPUs with one memory
// limit per device ordinal and the set's pipe directory.
func TestDecideMultiGPUSlice(t *testing.T) {
	g0, g1, g2 := api.GPURef{UUID: uuid0, Index: 0}, api.GPURef{UUID: uuid1, Index: 1}, api.GPURef{UUID: uuid2, Index: 2}
	spread := func(mem, cores int64, gpus ...api.GPURef) map[string]string {
		return annotate(t, api.ContainerAssignment{Name: "c", Shared: &api.SharedGPU{GPU: gpus[0], Spread: gpus[1:], MemoryMiB: mem, Cores: cores}})
	}
	entry := func(name string, mem, cores int64, gpus ...api.GPURef) Entry {
		return Entry{PodUID: "uid-" + name, Namespace: "ns", Pod: name, Container: "c", ContainerID: "id-" + name,
			Shared: &api.SharedGPU{GPU: gpus[0], Spread: gpus[1:], MemoryMiB: mem, Cores: cores}}
	}
	counted := func(n string) map[string]string { return map[string]string{api.AnnotationGPUCount: n} }
	for _, tc := range []struct {
		name       string
		ann        map[string]string
		mem, cores int // what the kubelet allocated
		ledger     []Entry
		want       []int // the slice's GPU indices
		code       gpureq.Code
		msg        string // part of the refusal
	}{
		{name: "the assignment's two GPUs", ann: spread(4096, 20, g0, g1), mem: 8, cores: 40, want: []int{0, 1}},
		{name: "joins its set", ann: spread(4096, 20, g0, g1), mem: 8, cores: 40, ledger: []Entry{entry("q", 2048, 10, g0, g1)}, want: []int{0, 1}},
		{name: "more memory per GPU than the kubelet's units split", ann: spread(8192, 20, g0, g1), mem: 8, cores: 40,
			code: gpureq.CodeAssignmentDisagrees, msg: "on each of its 2 GPUs"},
		{name: "more cores per GPU than the kubelet's units split", ann: spread(4096, 30, g0, g1), mem: 8, cores: 40,
			code: gpureq.CodeAssignmentDisagrees},
		{name: "units the assignment's GPUs do not split", ann: spread(1024, 10, g0, g1), mem: 3, cores: 20, code: gpureq.CodeGPUCountUneven},
		{name: "101 cores on each GPU", ann: spread(1024, 100, g0, g1), mem: 2, cores: 202, code: gpureq.CodeCoresAboveGPU, msg: "over 2 GPUs, 101 on each"},
		{name: "a GPU of the set over-committed", ann: spread(8192, 20, g0, g1), mem: 16, cores: 40, ledger: []Entry{entry("q", 8192, 10, g1)},
			code: gpureq.CodeMemoryOvercommitted, msg: uuid1},
		{name: "a GPU under a single slice's daemon", ann: spread(1024, 10, g0, g1), mem: 2, cores: 20, ledger: []Entry{entry("q", 1024, 10, g1)},
			code: gpureq.CodeMPSGroup},
		{name: "over a bigger set", ann: spread(1024, 10, g0, g1), mem: 2, cores: 20, ledger: []Entry{entry("q", 1024, 10, g0, g1, g2)},
			code: gpureq.CodeMPSGroup},
		{name: "a single slice on a GPU of a set", ann: spread(1024, 10, g1), mem: 1, cores: 10, ledger: []Entry{entry("q", 1024, 10, g0, g1)},
			code: gpureq.CodeMPSGroup},
		{name: "placed here from the pod's count", ann: counted("2"), mem: 4, cores: 20, want: []int{0, 1}},
		{name: "placed here beside a full set and a single slice", ann: counted("2"), mem: 4, cores: 20,
			ledger: []Entry{entry("q", 15360, 10, g0, g1), entry("r", 1024, 10, g2)}, code: "", msg: "no 2 GPUs"},
		{name: "placed here into its set", ann: counted("2"), mem: 4, cores: 20,
			ledger: []Entry{entry("q", 1024, 10, g2), entry("r", 1024, 10, g0, g1)}, want: []int{0, 1}},
		{name: "placed here: a single slice avoids the set", ann: nil, mem: 1, cores: 10,
			ledger: []Entry{entry("q", 1024, 10, g0, g1)}, want: []int{2}},
		{name: "placed here: more GPUs than the node", ann: counted("8"), mem: 8, cores: 8, code: gpureq.CodeGPUCountAboveNode},
		{name: "placed here: a count that does not parse", ann: counted("2 "), mem: 4, cores: 20, code: gpureq.CodeInvalidGPUCount},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := testNode()
			node.Ledger = tc.ledger
			req := Request{Pod: pod(tc.ann), Container: Container{ID: "id", Name: "c"}, Devices: Devices{MemoryUnits: tc.mem, CoreUnits: tc.cores}}
			d, err := Decide(testOptions(t), node, req)
			if tc.want == nil {
				var de *DecisionError
				if !errors.As(err, &de) || de.Code != tc.code || !strings.Contains(err.Error(), tc.msg) {
					t.Fatalf("Decide: %v, want a refusal %q saying %q", err, tc.code, tc.msg)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decide: %v", err)
			}
			s := d.Entry.Shared
			var got []int
			for _, g := range s.GPUs() {
				got = append(got, g.Index)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("slice on GPUs %v, want %v", got, tc.want)
			}
			per := int64(tc.mem) * 1024 / int64(len(tc.want))
			if s.MemoryMiB != per || s.Cores != int64(tc.cores/len(tc.want)) {
				t.Errorf("slice %d MiB, %d%% per GPU, want %d MiB, %d%%", s.MemoryMiB, s.Cores, per, tc.cores/len(tc.want))
			}
			env := map[string]string{}
			for _, e := range d.Adjustment.Env {
				env[e.Name] = e.Value
			}
			var limits, visible []string
			for i, g := range s.GPUs() {
				limits = append(limits, fmt.Sprintf("%d=%dM", i, per))
				visible = append(visible, g.UUID)
			}
			if env[api.EnvMPSPinnedDeviceMemLimit] != strings.Join(limits, ",") || env[api.EnvNVIDIAVisibleDevices] != strings.Join(visible, ",") {
				t.Errorf("env %v: want limits %v on %v", env, limits, visible)
			}
			if m := d.Adjustment.Mounts; len(m) != 1 || m[0].Source != "/run/tessera/mps/"+gpureq.GroupKey(s.UUIDs())+"/pipe" {
				t.Errorf("mounts %+v, want the pipe directory of the group %s", m, gpureq.GroupKey(s.UUIDs()))
			}
			allowed := 0
			for _, r := range d.Adjustment.CgroupRules {
				if r.Allow && r.Major != nil && *r.Major == NVIDIAMajor && r.Minor != nil && *r.Minor != NVIDIACtlMinor {
					allowed++
				}
			}
			if allowed != len(tc.want) {
				t.Errorf("the device cgroup allows %d GPUs, want %d", allowed, len(tc.want))
			}
		})
	}
}
