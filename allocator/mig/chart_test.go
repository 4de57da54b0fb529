package mig

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// The chart's default scheduler.migProfiles are the MIG resources
// kube-scheduler sends to the extender; a profile of a model this package
// places but missing there would be bound on allocatable alone (no quota,
// no per-GPU fit). Every profile of every model must be listed.
func TestChartListsEveryProfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "charts", "tessera", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values struct {
		Scheduler struct {
			MIGProfiles []string `json:"migProfiles"`
		} `json:"scheduler"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	for _, name := range Models() {
		m, _ := Lookup(name)
		for _, p := range m.Profiles {
			if !slices.Contains(values.Scheduler.MIGProfiles, p.Name) {
				t.Errorf("charts/tessera/values.yaml scheduler.migProfiles lacks %s (%s)", p.Name, name)
			}
		}
	}
}
