package nvmlmock

import (
	"strings"
	"testing"
)

const migProfile = `
apiVersion: tessera.dev/v1alpha1
kind: MockMachine
name: lab
numaNodes:
  - {id: 0, cpus: "0-3"}
gpus:
  - {model: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 0, pciBusID: "0000:01:00.0",
     mig: {instances: [{profile: 3g.40gb, start: 0, size: 4}, {profile: 1g.10gb, start: 4, size: 1, uuid: MIG-11111111-2222-3333-4444-555555555555}]}}
  - {model: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 0, pciBusID: "0000:02:00.0", mig: {instances: []}}
  - {model: NVIDIA A100-SXM4-40GB, memoryMiB: 40960, numaNode: 0, pciBusID: "0000:03:00.0"}
`

func TestMIGProfiles(t *testing.T) {
	p, err := Parse([]byte(migProfile), "lab")
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	uuids := m.MIGUUIDs(0)
	if len(uuids) != 2 || uuids[1] != "MIG-11111111-2222-3333-4444-555555555555" || !strings.HasPrefix(uuids[0], "MIG-") || uuids[0] == uuids[1] {
		t.Errorf("GPU 0 MIG UUIDs %v: want a derived one, then the given one", uuids)
	}
	if again, _ := New(p); again.MIGUUIDs(0)[0] != uuids[0] {
		t.Error("derived MIG UUIDs differ between two builds")
	}
	if n := len(m.MIGUUIDs(1)); n != 0 {
		t.Errorf("GPU 1 (MIG on, no instance) has %d instances", n)
	}
	for _, tc := range []struct {
		name, old, new, want string
	}{
		{"a name the GPU's memory does not give", "profile: 1g.10gb", "profile: 1g.5gb", "mock machine lab: gpus[0].mig.instances[1].profile: 1g.5gb: an instance of 1 memory slices on a GPU of 81559 MiB is named 1g.10gb"},
		{"overlapping placements", "start: 4, size: 1", "start: 3, size: 1", "gpus[0].mig.instances[1]: slices 3-3 overlap gpus[0].mig.instances[0]"},
		{"misaligned placement", "start: 0, size: 4", "start: 2, size: 4", "gpus[0].mig.instances[0].start: 2 is not a placement of a 4-slice instance"},
		{"profile a resource cannot hold", "profile: 3g.40gb", "profile: 3g.40gb+me", "gpus[0].mig.instances[0].profile"},
		{"not a MIG UUID", "uuid: MIG-11111111", "uuid: GPU-11111111", "gpus[0].mig.instances[1].uuid"},
		{"compute slices", "profile: 3g.40gb", "profile: 9g.40gb", "gpus[0].mig.instances[0].profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(migProfile, tc.old) {
				t.Fatalf("test bug: %q is not in the profile", tc.old)
			}
			p, err := Parse([]byte(strings.Replace(migProfile, tc.old, tc.new, 1)), "lab")
			if err == nil {
				_, err = New(p)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
