package api_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

func validNUMA() *api.NUMATopology {
	return &api.NUMATopology{
		APIVersion: api.Version, Kind: api.KindNUMATopology,
		TopologyManagerPolicy: api.TopologyPolicySingleNUMANode, TopologyManagerScope: api.TopologyScopePod,
		CPUManagerPolicy: api.CPUManagerPolicyStatic, Source: api.NUMASourcePodResources,
		Zones: []api.NUMAZone{{ID: 0, CPUs: 63, FreeCPUs: 31, MemoryMiB: 1000, FreeMemoryMiB: 900}, {ID: 1, CPUs: 64, FreeCPUs: 64}},
		Pods:  []api.NUMAPodUse{{Namespace: "a", Name: "p", Zones: []api.NUMAZoneUse{{ID: 0, CPUs: 32, MemoryMiB: 100}}}},
	}
}

func TestNUMATopologyValidate(t *testing.T) {
	if err := validNUMA().Validate(); err != nil {
		t.Fatalf("valid: %v", err)
	}
	tests := []struct {
		name  string
		edit  func(*api.NUMATopology)
		field string
	}{
		{"version", func(n *api.NUMATopology) { n.APIVersion = "v1" }, "apiVersion"},
		{"kind", func(n *api.NUMATopology) { n.Kind = "X" }, "kind"},
		{"policy", func(n *api.NUMATopology) { n.TopologyManagerPolicy = "strict" }, "topologyManagerPolicy"},
		{"scope", func(n *api.NUMATopology) { n.TopologyManagerScope = "node" }, "topologyManagerScope"},
		{"cpu policy", func(n *api.NUMATopology) { n.CPUManagerPolicy = "dynamic" }, "cpuManagerPolicy"},
		{"source", func(n *api.NUMATopology) { n.Source = "" }, "source"},
		{"negative id", func(n *api.NUMATopology) { n.Zones[1].ID = -1 }, "zones[1].id"},
		{"duplicate id", func(n *api.NUMATopology) { n.Zones[1].ID = 0 }, "zones[1].id"},
		{"free above cpus", func(n *api.NUMATopology) { n.Zones[1].FreeCPUs = 65 }, "zones[1]"},
		{"free memory above memory", func(n *api.NUMATopology) { n.Zones[0].FreeMemoryMiB = 2000 }, "zones[0]"},
		{"pod named twice", func(n *api.NUMATopology) { n.Pods[0].UID = "u" }, "pods[0]"},
		{"pod not named", func(n *api.NUMATopology) { n.Pods[0].Name = "" }, "pods[0]"},
		{"duplicate pod", func(n *api.NUMATopology) { n.Pods = append(n.Pods, n.Pods[0]) }, "pods[1]"},
		{"unknown zone", func(n *api.NUMATopology) { n.Pods[0].Zones[0].ID = 7 }, "pods[0].zones[0].id"},
		{"negative use", func(n *api.NUMATopology) { n.Pods[0].Zones[0].CPUs = -1 }, "pods[0].zones[0]"},
		{"free does not add up", func(n *api.NUMATopology) { n.Zones[0].FreeCPUs = 30 }, "zones[0].freeCPUs"},
		{"free memory does not add up", func(n *api.NUMATopology) { n.Zones[0].FreeMemoryMiB = 1000 }, "zones[0].freeMemoryMiB"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := validNUMA()
			tc.edit(n)
			err := n.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tc.field) {
				t.Fatalf("Validate() = %v, want an error about %s", err, tc.field)
			}
		})
	}
}

func TestNUMATopologyRoundTrip(t *testing.T) {
	v, err := api.EncodeNUMATopology(validNUMA())
	if err != nil {
		t.Fatal(err)
	}
	got, ok, err := api.GetNUMATopology(map[string]string{api.AnnotationNUMATopology: v})
	if err != nil || !ok {
		t.Fatalf("GetNUMATopology: %v %v", ok, err)
	}
	if diff := cmp.Diff(validNUMA(), got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, ok, err := api.GetNUMATopology(nil); ok || err != nil {
		t.Errorf("no annotation: %v %v", ok, err)
	}
	for _, bad := range []string{"", "{", `{"apiVersion":"tessera.dev/v1alpha1","unknown":1}`} {
		if _, _, err := api.GetNUMATopology(map[string]string{api.AnnotationNUMATopology: bad}); err == nil || !strings.Contains(err.Error(), api.AnnotationNUMATopology) {
			t.Errorf("%q: error %v, want one naming the annotation", bad, err)
		}
	}
}

func FuzzParseNUMATopology(f *testing.F) {
	v, _ := api.EncodeNUMATopology(validNUMA())
	for _, s := range []string{v, "{}", "", `{"zones":[{"id":0,"cpus":1,"freeCPUs":2}]}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		n, err := api.ParseNUMATopology(value)
		if err != nil {
			if !strings.Contains(err.Error(), api.AnnotationNUMATopology) {
				t.Fatalf("error %v does not name the annotation", err)
			}
			return
		}
		again, err := api.EncodeNUMATopology(n)
		if err != nil {
			t.Fatalf("a parsed report does not encode: %v", err)
		}
		m, err := api.ParseNUMATopology(again)
		if err != nil {
			t.Fatalf("an encoded report does not parse: %v", err)
		}
		if diff := cmp.Diff(n, m); diff != "" {
			t.Fatalf("round trip (-first +second):\n%s", diff)
		}
	})
}
