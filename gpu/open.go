package gpu

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

// Backend is an opened GPU backend.
type Backend struct {
	Interface
	// NVML is the library Interface adapts, for the few callers that need
	// NVML calls beyond Interface (compute mode, process utilisation).
	NVML nvml.Interface
	// Mock is the machine behind a mock backend; nil for the real driver.
	Mock *nvmlmock.Machine
}

// SpecReal selects the real driver in Open.
const SpecReal = "real"

// specMockPrefix starts a mock backend spec: mock:NAME or mock:PATH.
const specMockPrefix = "mock:"

// Open returns the backend a `--nvml` flag names: "real" (or empty) for the
// driver's libnvidia-ml.so.1, "mock:NAME" for a built-in mock machine, or
// "mock:PATH" for a machine described in a YAML or JSON file. It does not call
// Init.
func Open(spec string) (*Backend, error) {
	switch {
	case spec == "" || spec == SpecReal:
		lib := nvml.New()
		return &Backend{Interface: NewNVML(lib), NVML: lib}, nil
	case strings.HasPrefix(spec, specMockPrefix):
		profile, err := nvmlmock.Load(strings.TrimPrefix(spec, specMockPrefix))
		if err != nil {
			return nil, err
		}
		m, err := nvmlmock.New(profile)
		if err != nil {
			return nil, err
		}
		return &Backend{Interface: NewNVML(m.NVML()), NVML: m.NVML(), Mock: m}, nil
	}
	return nil, fmt.Errorf("--nvml=%q: want %q, %sNAME (one of %s) or %sPATH", spec, SpecReal, specMockPrefix, strings.Join(nvmlmock.ProfileNames(), ", "), specMockPrefix)
}
