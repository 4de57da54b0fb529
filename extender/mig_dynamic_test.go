package extender

import (
	"fmt"
	"testing"

	"github.com/tessera-gpu/tessera/api"
)

const a100 = "NVIDIA A100-SXM4-40GB"

func migGPU(index int, instances ...string) api.InventoryGPU {
	g := api.InventoryGPU{Index: index, UUID: fmt.Sprintf("GPU-%08d", index), Model: a100, Healthy: true, MIG: &api.InventoryMIG{Instances: []api.InventoryMIGInstance{}}}
	for k, s := range instances {
		var p string
		var start, size int
		if _, err := fmt.Sscanf(s, "%s %d %d", &p, &start, &size); err != nil {
			panic(err)
		}
		g.MIG.Instances = append(g.MIG.Instances, api.InventoryMIGInstance{
			UUID: fmt.Sprintf("MIG-%08d-0000-0000-0000-%012d", index, k), Profile: p, Healthy: true,
			MIGPlacement: api.MIGPlacement{Start: start, Size: size},
		})
	}
	return g
}

func seven(index int) api.InventoryGPU {
	var in []string
	for s := 0; s < 7; s++ {
		in = append(in, fmt.Sprintf("1g.5gb %d 1", s))
	}
	return migGPU(index, in...)
}

func mixed(index int) api.InventoryGPU {
	return migGPU(index, "3g.20gb 0 4", "2g.10gb 4 2", "1g.5gb 6 1")
}

func TestDecideMIGRepartition(t *testing.T) {
	whole := api.InventoryGPU{Index: 4, UUID: "GPU-00000004", Model: a100, Healthy: true}
	node := func(name string, gpus ...api.InventoryGPU) MIGNodeView {
		return MIGNodeView{Name: name, GPUs: gpus, Used: map[string]bool{}}
	}
	t.Run("free mixed GPU replaced, fewest destroyed", func(t *testing.T) {
		n := node("a", seven(0), mixed(2), whole)
		r, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{n})
		if !ok {
			t.Fatal("no decision")
		}
		// GPU 2 keeps its 2g.10gb and 1g.5gb (the 4g needs slices 0-3,
		// its 3g.20gb goes); GPU 0 would lose four 1g.5gb.
		if r.Node != "a" || r.Index != 2 || r.Destroyed != 1 {
			t.Fatalf("decision %+v", r)
		}
		want := []api.MIGLayoutInstance{{Profile: "4g.20gb", MIGPlacement: api.MIGPlacement{Start: 0, Size: 4}}, {Profile: "2g.10gb", MIGPlacement: api.MIGPlacement{Start: 4, Size: 2}}, {Profile: "1g.5gb", MIGPlacement: api.MIGPlacement{Start: 6, Size: 1}}}
		if fmt.Sprint(r.GPU.Instances) != fmt.Sprint(want) {
			t.Fatalf("layout %v, want %v", r.GPU.Instances, want)
		}
		req := &api.MIGLayoutRequest{APIVersion: api.Version, Kind: api.KindMIGLayoutRequest, Generation: 1, GPUs: []api.MIGLayoutGPU{r.GPU}, Pod: &api.MIGLayoutPod{Namespace: "ns", Name: "p", UID: "u"}}
		if err := req.Validate(); err != nil {
			t.Fatalf("the decision is not a valid request: %v", err)
		}
	})
	t.Run("tenant never repartitioned", func(t *testing.T) {
		g2, g3 := mixed(2), mixed(3)
		n := node("a", g2, g3)
		n.Used[g2.MIG.Instances[2].UUID] = true
		r, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{n})
		if !ok || r.Index != 3 {
			t.Fatalf("decision %+v %v, want GPU 3", r, ok)
		}
		n.Used[g3.MIG.Instances[0].UUID] = true
		if r, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{n}); ok {
			t.Fatalf("repartitioned a GPU with a tenant: %+v", r)
		}
	})
	t.Run("unrecorded MIG pods, busy node, unhealthy GPU", func(t *testing.T) {
		n := node("a", mixed(2))
		n.Pending = true
		if _, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{n}); ok {
			t.Fatal("node with unrecorded MIG pods chosen")
		}
		n.Pending, n.Busy = false, true
		if _, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{n}); ok {
			t.Fatal("busy node chosen")
		}
		g := mixed(2)
		g.Healthy = false
		if _, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{node("a", g)}); ok {
			t.Fatal("unhealthy GPU chosen")
		}
	})
	t.Run("whole GPUs and fitting demand are left alone", func(t *testing.T) {
		if _, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1}, []MIGNodeView{node("a", whole)}); ok {
			t.Fatal("a GPU not in MIG mode chosen")
		}
		// 1g.5gb exists free: no repartition.
		if r, ok := DecideMIGRepartition(map[string]int{"1g.5gb": 2}, []MIGNodeView{node("a", seven(0))}); ok {
			t.Fatalf("repartition for instances that exist: %+v", r)
		}
	})
	t.Run("several profiles on one GPU, wholesale when needed", func(t *testing.T) {
		r, ok := DecideMIGRepartition(map[string]int{"4g.20gb": 1, "3g.20gb": 1}, []MIGNodeView{node("a", seven(0))})
		if !ok || len(r.GPU.Instances) != 2 || r.Destroyed != 7 {
			t.Fatalf("decision %+v %v", r, ok)
		}
		if _, ok := DecideMIGRepartition(map[string]int{"7g.40gb": 2}, []MIGNodeView{node("a", seven(0), mixed(2))}); ok {
			t.Fatal("two 7g.40gb on one GPU")
		}
	})
	t.Run("empty GPU in MIG mode gets new instances", func(t *testing.T) {
		r, ok := DecideMIGRepartition(map[string]int{"2g.10gb": 2}, []MIGNodeView{node("b", migGPU(5))})
		if !ok || r.Destroyed != 0 || len(r.GPU.Instances) != 2 {
			t.Fatalf("decision %+v %v", r, ok)
		}
	})
}
