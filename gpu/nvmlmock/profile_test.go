package nvmlmock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBuiltinProfilesAreValid(t *testing.T) {
	want := []string{DGX1VName, DGXA100Name, DGXA100MIGName, DGXH100MIGName, PCIe2NUMAName}
	if diff := cmp.Diff(want, ProfileNames()); diff != "" {
		t.Fatalf("ProfileNames() mismatch (-want +got):\n%s", diff)
	}
	for _, name := range ProfileNames() {
		t.Run(name, func(t *testing.T) {
			p, err := Load(name)
			if err != nil {
				t.Fatalf("Load(%q): %v", name, err)
			}
			if p.Name != name {
				t.Errorf("profile %q is named %q", name, p.Name)
			}
			if _, err := New(p); err != nil {
				t.Fatalf("New: %v", err)
			}
		})
	}
}

// validProfile is a small machine each malformed case below breaks once.
const validProfile = `
apiVersion: tessera.dev/v1alpha1
kind: MockMachine
name: two
numaNodes:
  - {id: 0, cpus: "0-3"}
gpus:
  - {model: M, memoryMiB: 1024, numaNode: 0, pciBusID: "0000:01:00.0"}
  - {model: M, memoryMiB: 1024, numaNode: 0, pciBusID: "0000:02:00.0"}
nvlinks:
  - [0, 2]
  - [2, 0]
pcie:
  - [X, PIX]
  - [PIX, X]
`

func TestParseRejectsMalformedProfiles(t *testing.T) {
	if _, err := Parse([]byte(validProfile), "valid"); err != nil {
		t.Fatalf("the base profile must be valid: %v", err)
	}
	tests := []struct {
		name    string
		old     string
		new     string
		wantErr string
	}{
		{"unknown field", "memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:01", "memory: 1024, numaNode: 0, pciBusID: \"0000:01", `unknown field "memory"`},
		{"zero memory", "memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:02", "memoryMiB: 0, numaNode: 0, pciBusID: \"0000:02", "gpus[1].memoryMiB: must be greater than 0"},
		{"memory not a number", "memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:02", "memoryMiB: lots, numaNode: 0, pciBusID: \"0000:02", "memoryMiB"},
		{"unknown NUMA node", "numaNode: 0, pciBusID: \"0000:02", "numaNode: 3, pciBusID: \"0000:02", "gpus[1].numaNode: 3 is not one of numaNodes"},
		{"bad PCI address", `"0000:02:00.0"`, `"02:00"`, `gpus[1].pciBusID: "02:00" is not a PCI address`},
		{"duplicate PCI address", `"0000:02:00.0"`, `"0000:01:00.0"`, "gpus[1].pciBusID"},
		{"missing model", "{model: M, memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:02", "{memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:02", "gpus[1].model: must not be empty"},
		{"asymmetric NVLinks", "[2, 0]\npcie", "[1, 0]\npcie", "nvlinks[0][1]: must equal nvlinks[1][0] (2 != 1)"},
		{"NVLink to itself", "[0, 2]\n  - [2, 0]", "[1, 2]\n  - [2, 0]", "nvlinks[0][0]: a GPU has no NVLink to itself"},
		// Found reading validateNVLinks for FuzzParse: the row's total
		// overflowed and passed, and New then made 2^63 links.
		{"NVLink count overflows", "nvlinks:\n  - [0, 2]\n  - [2, 0]", "nvswitch: {switches: 1, linksPerGPU: 18}\nnvlinks:\n  - [0, 9223372036854775800]\n  - [9223372036854775800, 0]", "nvlinks[0][1]: 9223372036854775800 NVLinks, more than the 18 a GPU has"},
		{"short NVLink row", "[0, 2]\n  - [2, 0]", "[0, 2]\n  - [2]", "nvlinks[1]: must have 2 columns, got 1"},
		{"bad PCIe level", "[X, PIX]\n  - [PIX, X]", "[X, PCI]\n  - [PCI, X]", `pcie[0][1]: "PCI" is not one of`},
		{"PCIe diagonal", "[X, PIX]\n  - [PIX, X]", "[PIX, PIX]\n  - [PIX, X]", "pcie[0][0]: the diagonal must be"},
		{"bad CPU list", `cpus: "0-3"`, `cpus: "3-0"`, `numaNodes[0].cpus: not a CPU list: "3-0"`},
		// cpuset expands a range CPU by CPU: this one took the memory of
		// the process.
		{"CPU range past the bound", `cpus: "0-3"`, `cpus: "0-4000000000"`, `numaNodes[0].cpus: CPU "4000000000" above 65535`},
		{"CPU number past the bound", `cpus: "0-3"`, `cpus: "0-3,65536"`, `numaNodes[0].cpus: CPU 65536 above 65535`},
		{"wrong apiVersion", "tessera.dev/v1alpha1", "tessera.dev/v9", `apiVersion: must be "tessera.dev/v1alpha1"`},
		{"wrong kind", "kind: MockMachine", "kind: Machine", `kind: must be "MockMachine"`},
		{"no GPUs", "gpus:\n", "gpuz:\n", `unknown field "gpuz"`},
		{"not YAML", "apiVersion:", "apiVersion: [", "mock machine bad"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(validProfile, tc.old) {
				t.Fatalf("test bug: %q is not in the base profile", tc.old)
			}
			data := strings.Replace(validProfile, tc.old, tc.new, 1)
			_, err := Parse([]byte(data), "bad")
			if err == nil {
				t.Fatalf("Parse accepted a profile with %s", tc.name)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Parse error = %q, want it to contain %q", err, tc.wantErr)
			}
			if !strings.HasPrefix(err.Error(), "mock machine bad") {
				t.Errorf("Parse error = %q, want it to name the source", err)
			}
		})
	}
	if _, err := Parse(nil, "empty"); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("Parse(empty) = %v, want an error saying the file is empty", err)
	}
}

func TestLoadFromFile(t *testing.T) {
	dir := t.TempDir()
	yamlFile := filepath.Join(dir, "two.yaml")
	if err := os.WriteFile(yamlFile, []byte(validProfile), 0o644); err != nil {
		t.Fatal(err)
	}
	jsonFile := filepath.Join(dir, "one.json")
	js := `{"apiVersion":"tessera.dev/v1alpha1","kind":"MockMachine","name":"one","numaNodes":[],` +
		`"gpus":[{"model":"M","memoryMiB":2048,"numaNode":-1,"pciBusID":"00000000:3B:00.0","uuid":"GPU-11111111-2222-3333-4444-555555555555"}]}`
	if err := os.WriteFile(jsonFile, []byte(js), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load(yamlFile)
	if err != nil {
		t.Fatalf("Load(yaml): %v", err)
	}
	if got := len(p.GPUs); got != 2 {
		t.Errorf("yaml profile has %d GPUs, want 2", got)
	}
	p, err = Load(jsonFile)
	if err != nil {
		t.Fatalf("Load(json): %v", err)
	}
	m, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := m.UUID(0), "GPU-11111111-2222-3333-4444-555555555555"; got != want {
		t.Errorf("UUID(0) = %q, want the profile's %q", got, want)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "not a built-in profile") {
		t.Errorf("Load(missing) = %v, want an error naming the built-in profiles", err)
	}
}

func TestDerivedUUIDsAreStableAndDistinct(t *testing.T) {
	a, b := DGXA100(), DGXA100()
	seen := map[string]bool{}
	for i := range a.Profile().GPUs {
		if a.UUID(i) != b.UUID(i) {
			t.Errorf("GPU %d: UUID differs between two builds: %q vs %q", i, a.UUID(i), b.UUID(i))
		}
		if seen[a.UUID(i)] {
			t.Errorf("GPU %d: UUID %q repeats", i, a.UUID(i))
		}
		seen[a.UUID(i)] = true
	}
	if DGX1V().UUID(0) == a.UUID(0) {
		t.Errorf("two machines share GPU 0's UUID %q", a.UUID(0))
	}
}
