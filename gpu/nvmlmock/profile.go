// Package nvmlmock provides mock GPU machines for the NVML backend. A Machine
// is built on go-nvml's mock package from an api.MockMachine profile and
// implements nvml.Interface, so everything above it (package gpu, topology,
// go-gpuallocator) runs the same code as on a real node. Beyond the static
// machine it simulates memory in use, running processes, XID events and GPUs
// that fall off the bus.
package nvmlmock

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
)

//go:embed profiles/*.yaml
var builtin embed.FS

// Names of the built-in machine profiles.
const (
	DGXA100Name   = "dgx-a100"
	DGX1VName     = "dgx-1v"
	PCIe2NUMAName = "pcie-2numa"
	// DGXA100MIGName is dgx-a100 with GPUs 0-3 in MIG mode.
	DGXA100MIGName = "dgx-a100-mig"
	// DGXH100MIGName is a DGX H100 with GPUs 0-3 in MIG mode.
	DGXH100MIGName = "dgx-h100-mig"
)

// ProfileNames lists the built-in profiles, sorted.
func ProfileNames() []string {
	entries, err := fs.ReadDir(builtin, "profiles")
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	sort.Strings(names)
	return names
}

// ErrUnknownProfile: the spec is neither a built-in profile nor a file.
var ErrUnknownProfile = errors.New("unknown mock machine")

// Load returns the profile a `--nvml=mock:SPEC` names: a built-in profile
// name, or the path of a YAML or JSON file.
func Load(spec string) (*api.MockMachine, error) {
	if data, err := builtin.ReadFile(path.Join("profiles", spec+".yaml")); err == nil {
		return Parse(data, spec)
	}
	data, err := os.ReadFile(spec)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w %q: not a built-in profile (%s) and no such file", ErrUnknownProfile, spec, strings.Join(ProfileNames(), ", "))
		}
		return nil, fmt.Errorf("reading mock machine: %w", err)
	}
	return Parse(data, spec)
}

// Parse decodes and validates a profile. Unknown fields are errors; every
// error names the source and the offending field.
func Parse(data []byte, source string) (*api.MockMachine, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("mock machine %s: empty file", source)
	}
	var m api.MockMachine
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return nil, fmt.Errorf("mock machine %s: %w", source, err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("mock machine %s: %w", source, err)
	}
	return &m, nil
}

// Builtin returns a new Machine of a built-in profile. It panics when the
// profile does not exist or is invalid, a programming error the package's
// tests rule out; use Load and New for anything read at run time.
func Builtin(name string) *Machine {
	data, err := builtin.ReadFile(path.Join("profiles", name+".yaml"))
	if err != nil {
		panic(fmt.Sprintf("nvmlmock: no built-in profile %q", name))
	}
	p, err := Parse(data, name)
	if err != nil {
		panic(fmt.Sprintf("nvmlmock: built-in profile %q: %v", name, err))
	}
	m, err := New(p)
	if err != nil {
		panic(fmt.Sprintf("nvmlmock: built-in profile %q: %v", name, err))
	}
	return m
}

// DGXA100 is 8 x A100-SXM4-40GB on NVSwitch, NUMA 0/1 split 4/4.
func DGXA100() *Machine { return Builtin(DGXA100Name) }

// DGX1V is 8 x V100-SXM2-32GB in the DGX-1 hybrid cube-mesh.
func DGX1V() *Machine { return Builtin(DGX1VName) }

// PCIe2NUMA is 4 x L40S-48GB on PCIe, two per switch, a switch per NUMA node.
func PCIe2NUMA() *Machine { return Builtin(PCIe2NUMAName) }

// DGXA100MIG is dgx-a100 with GPUs 0-1 in 7 x 1g.5gb and GPUs 2-3 in
// 3g.20gb + 2g.10gb + 1g.5gb; GPUs 4-7 whole.
func DGXA100MIG() *Machine { return Builtin(DGXA100MIGName) }

// DGXH100MIG is 8 x H100 80GB on NVSwitch with GPUs 0-1 in 7 x 1g.10gb and
// GPUs 2-3 in 2 x 3g.40gb; GPUs 4-7 whole.
func DGXH100MIG() *Machine { return Builtin(DGXH100MIGName) }
