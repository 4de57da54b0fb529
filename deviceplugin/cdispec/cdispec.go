// Package cdispec checks that the node's CDI specs name the GPUs the device
// plugin hands out by CDI name (deviceListStrategy cdi-cri or
// cdi-annotations). On a node without such a spec (the NVIDIA Container
// Toolkit's, `nvidia-ctk cdi generate`) the runtime cannot resolve the
// names, and every GPU container would fail to be created and be retried
// for ever. Checker makes such a GPU unhealthy instead, with the reason:
// its devices are not offered, the extender places nothing on it, and it is
// healthy again at the next check after the spec appears.
package cdispec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"sigs.k8s.io/yaml"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/tessera-gpu/tessera/deviceplugin/health"
)

// DefaultDirs are where runtimes read CDI specs by default.
var DefaultDirs = []string{"/etc/cdi", "/var/run/cdi"}

// Missing returns which of names (fully qualified: vendor/class=name) no
// CDI spec in dirs defines, reading the specs (*.yaml, *.json) now. A spec
// that cannot be read or parsed defines nothing; the error names it.
// (CDI's own cache, pkg/cdi, would drag in runtime-tools, which does not
// build against the runtime-spec this module uses: the spec types and the
// name parser are CDI's.)
func Missing(dirs []string, names []string) ([]string, error) {
	defined := map[string]bool{}
	var errs []error
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || (ext != ".yaml" && ext != ".json") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			b, err := os.ReadFile(path)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			var spec cdispecs.Spec
			if err := yaml.Unmarshal(b, &spec); err != nil {
				errs = append(errs, fmt.Errorf("CDI spec %s: %w", path, err))
				continue
			}
			for _, d := range spec.Devices {
				defined[spec.Kind+"="+d.Name] = true
			}
		}
	}
	var missing []string
	for _, n := range names {
		if _, _, _, err := parser.ParseQualifiedName(n); err != nil || !defined[n] {
			missing = append(missing, n)
		}
	}
	return missing, errors.Join(errs...)
}

// Checker is a health.Checker that also fails a GPU whose CDI names no
// spec in Dirs defines.
type Checker struct {
	health.Checker
	// Dirs are the CDI spec directories the runtime reads.
	Dirs []string
	// Names are the CDI names of the GPU of NVML index i.
	Names func(i int) []string
}

var _ health.Checker = Checker{}

// CheckHealth checks the GPU, then its CDI names.
func (c Checker) CheckHealth(index int) error {
	if err := c.Checker.CheckHealth(index); err != nil {
		return err
	}
	missing, err := Missing(c.Dirs, c.Names(index))
	if len(missing) > 0 {
		if err != nil {
			return fmt.Errorf("no CDI spec in %s defines %s (%w)", strings.Join(c.Dirs, ", "), strings.Join(missing, ", "), err)
		}
		return fmt.Errorf("no CDI spec in %s defines %s: the runtime could not give it to a container (install the NVIDIA Container Toolkit's spec: nvidia-ctk cdi generate)", strings.Join(c.Dirs, ", "), strings.Join(missing, ", "))
	}
	return nil
}
