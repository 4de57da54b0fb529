package gpu_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// migSummary is what a test compares of an instance: the IDs are NVML's.
type migSummary struct {
	Profile     string
	Start, Size int
}

func summarize(info gpu.MIGInfo) []migSummary {
	var out []migSummary
	for _, in := range info.Instances {
		out = append(out, migSummary{in.Profile, in.Start, in.Size})
	}
	return out
}

func TestMIGFromMock(t *testing.T) {
	seven := func(profile string) []migSummary {
		var out []migSummary
		for s := 0; s < 7; s++ {
			out = append(out, migSummary{profile, s, 1})
		}
		return out
	}
	tests := []struct {
		machine     string
		gpu         int
		wantEnabled bool
		want        []migSummary
	}{
		{machine: nvmlmock.DGXA100MIGName, gpu: 0, wantEnabled: true, want: seven("1g.5gb")},
		{machine: nvmlmock.DGXA100MIGName, gpu: 1, wantEnabled: true, want: seven("1g.5gb")},
		{machine: nvmlmock.DGXA100MIGName, gpu: 2, wantEnabled: true, want: []migSummary{{"3g.20gb", 0, 4}, {"2g.10gb", 4, 2}, {"1g.5gb", 6, 1}}},
		{machine: nvmlmock.DGXA100MIGName, gpu: 3, wantEnabled: true, want: []migSummary{{"3g.20gb", 0, 4}, {"2g.10gb", 4, 2}, {"1g.5gb", 6, 1}}},
		{machine: nvmlmock.DGXA100MIGName, gpu: 4}, // MIG-capable, mode off
		{machine: nvmlmock.DGXA100Name, gpu: 0},
		{machine: nvmlmock.DGX1VName, gpu: 0}, // V100: MIG not supported
		{machine: nvmlmock.PCIe2NUMAName, gpu: 3},
		{machine: nvmlmock.DGXH100MIGName, gpu: 0, wantEnabled: true, want: seven("1g.10gb")},
		{machine: nvmlmock.DGXH100MIGName, gpu: 3, wantEnabled: true, want: []migSummary{{"3g.40gb", 0, 4}, {"3g.40gb", 4, 4}}},
		{machine: nvmlmock.DGXH100MIGName, gpu: 7},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			m := nvmlmock.Builtin(tc.machine)
			lib := openMock(t, m)
			info, err := lib.MIG(tc.gpu)
			if err != nil {
				t.Fatalf("MIG(%d): %v", tc.gpu, err)
			}
			if info.Enabled != tc.wantEnabled {
				t.Errorf("MIG(%d).Enabled = %v, want %v", tc.gpu, info.Enabled, tc.wantEnabled)
			}
			if diff := cmp.Diff(tc.want, summarize(info)); diff != "" {
				t.Errorf("MIG(%d) instances (-want +got):\n%s", tc.gpu, diff)
			}
			var uuids []string
			for _, in := range info.Instances {
				uuids = append(uuids, in.UUID)
			}
			if diff := cmp.Diff(m.MIGUUIDs(tc.gpu), uuids, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("MIG(%d) UUIDs differ from the machine's (-machine +got):\n%s", tc.gpu, diff)
			}
		})
	}
}

// Every built-in profile's MIG layout reads back through the adapter with
// the profile names it declares: the mock's memory sizes name the
// profiles as NVIDIA does.
func TestBuiltinMIGProfilesReadBack(t *testing.T) {
	for _, name := range nvmlmock.ProfileNames() {
		m := nvmlmock.Builtin(name)
		lib := openMock(t, m)
		for i, g := range m.Profile().GPUs {
			info, err := lib.MIG(i)
			if err != nil {
				t.Fatalf("%s: MIG(%d): %v", name, i, err)
			}
			if (g.MIG != nil) != info.Enabled {
				t.Errorf("%s: MIG(%d).Enabled = %v, profile sets MIG: %v", name, i, info.Enabled, g.MIG != nil)
			}
			if g.MIG == nil {
				continue
			}
			var want []migSummary
			for _, in := range g.MIG.Instances {
				want = append(want, migSummary{in.Profile, in.Start, in.Size})
			}
			if diff := cmp.Diff(want, summarize(info)); diff != "" {
				t.Errorf("%s: MIG(%d) (-profile +read):\n%s", name, i, diff)
			}
		}
	}
}

func TestMIGOfLostGPU(t *testing.T) {
	m := nvmlmock.DGXA100MIG()
	lib := openMock(t, m)
	m.SetLost(2, true)
	if _, err := lib.MIG(2); !errors.Is(err, gpu.ErrGPULost) {
		t.Errorf("MIG(2) on a lost GPU = %v, want ErrGPULost", err)
	}
	if info, err := lib.MIG(0); err != nil || len(info.Instances) != 7 {
		t.Errorf("MIG(0) beside a lost GPU = %d instances, %v; want 7, nil", len(info.Instances), err)
	}
}

func TestMIGProfileName(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		g, c     uint32
		memMiB   uint64
		gpuBytes uint64
		want     string
	}{
		// Sizes NVML reports on an A100-SXM4-40GB.
		{1, 1, 4864, 40960 * mib, "1g.5gb"},
		{2, 2, 9856, 40960 * mib, "2g.10gb"},
		{3, 3, 19968, 40960 * mib, "3g.20gb"},
		{4, 4, 19968, 40960 * mib, "4g.20gb"},
		{7, 7, 40192, 40960 * mib, "7g.40gb"},
		// A100 80GB and H100 80GB.
		{1, 1, 9728, 81920 * mib, "1g.10gb"},
		{1, 1, 9856, 81559 * mib, "1g.10gb"},
		{1, 1, 19968, 81559 * mib, "1g.20gb"},
		{3, 3, 40192, 81559 * mib, "3g.40gb"},
		// A compute instance smaller than its GPU instance.
		{3, 1, 19968, 40960 * mib, "1c.3g.20gb"},
		{1, 1, 4864, 0, "1g.0gb"},
	}
	for _, tc := range tests {
		if got := gpu.MIGProfileName(tc.g, tc.c, tc.memMiB, tc.gpuBytes); got != tc.want {
			t.Errorf("MIGProfileName(%d, %d, %d, %d) = %q, want %q", tc.g, tc.c, tc.memMiB, tc.gpuBytes, got, tc.want)
		}
	}
}
