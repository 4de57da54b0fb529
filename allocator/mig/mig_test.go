package mig

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/tessera-gpu/tessera/api"
)

func mustModel(t testing.TB, name string) *Model {
	t.Helper()
	m, ok := Lookup(name)
	if !ok {
		t.Fatalf("no model %q", name)
	}
	return m
}

func TestProfileTables(t *testing.T) {
	want := map[string][]string{
		"A100-SXM4-40GB": {"1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"},
		"A100-SXM4-80GB": {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"H100-80GB-HBM3": {"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"},
		"H100-NVL":       {"1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"},
		"H200":           {"1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"},
	}
	if len(Models()) != len(want) {
		t.Errorf("Models() = %v, want the %d of the table", Models(), len(want))
	}
	// The geometry every model shares: compute slices, memory slices,
	// starts (NVIDIA's MIG user guide).
	geom := []struct {
		compute, size int
		starts        []int
	}{
		{1, 1, []int{0, 1, 2, 3, 4, 5, 6}}, {1, 2, []int{0, 2, 4, 6}}, {2, 2, []int{0, 2, 4}},
		{3, 4, []int{0, 4}}, {4, 4, []int{0}}, {7, 8, []int{0}},
	}
	for name, names := range want {
		m := mustModel(t, name)
		if len(m.Profiles) != len(names) {
			t.Fatalf("%s: %d profiles, want %d", name, len(m.Profiles), len(names))
		}
		for i, p := range m.Profiles {
			g := geom[i]
			if p.Name != names[i] || p.Compute != g.compute || p.Size != g.size || fmt.Sprint(p.Starts) != fmt.Sprint(g.starts) {
				t.Errorf("%s profile %d = %+v, want %s %dg size %d starts %v", name, i, p, names[i], g.compute, g.size, g.starts)
			}
			if !api.ValidMIGProfile(p.Name) {
				t.Errorf("%s: %s is not an api.ValidMIGProfile", name, p.Name)
			}
			for _, s := range p.Starts {
				if err := api.CheckMIGPlacements("p", []api.MIGPlacement{{Start: s, Size: p.Size}}); err != nil {
					t.Errorf("%s %s at %d: %v", name, p.Name, s, err)
				}
			}
		}
		if m.Full().Compute != ComputeSlices || m.Full().Size != api.MIGSlices {
			t.Errorf("%s: Full() = %+v", name, m.Full())
		}
	}
	// A100-40GB memory: 1g.5gb is 5 GiB, 7g.40gb 40 GiB.
	a := mustModel(t, "A100-SXM4-40GB")
	if p, _ := a.Profile("1g.5gb"); p.MemoryMiB != 5*1024 {
		t.Errorf("1g.5gb memory %d", p.MemoryMiB)
	}
	if p, _ := a.Profile("7g.40gb"); p.MemoryMiB != 40*1024 {
		t.Errorf("7g.40gb memory %d", p.MemoryMiB)
	}
}

func TestLookup(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"A100-SXM4-40GB", "A100-SXM4-40GB"},
		{"NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"},
		{"nvidia a100-pcie-40gb", "A100-SXM4-40GB"},
		{"NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"},
		{"NVIDIA A100 80GB PCIe", "A100-SXM4-80GB"},
		{"NVIDIA H100 80GB HBM3", "H100-80GB-HBM3"},
		{"H100-SXM5-80GB", "H100-80GB-HBM3"},
		{"NVIDIA H100 NVL", "H100-NVL"},
		{"NVIDIA H200", "H200"},
		{"Tesla T4", ""},
		{"", ""},
	} {
		m, ok := Lookup(tc.in)
		got := ""
		if ok {
			got = m.Name
		}
		if got != tc.want {
			t.Errorf("Lookup(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestSmallest(t *testing.T) {
	a40 := mustModel(t, "A100-SXM4-40GB")
	h := mustModel(t, "H100-80GB-HBM3")
	for _, tc := range []struct {
		m     *Model
		milli int64
		mem   int64
		want  string // "" = none
	}{
		{a40, 0, 0, "1g.5gb"},
		{a40, 110, 0, "1g.5gb"},
		{a40, 142, 0, "1g.5gb"},  // 1/7 = 0.1428... >= 0.142
		{a40, 143, 0, "2g.10gb"}, // 0.143 > 1/7
		{a40, 160, 0, "2g.10gb"},
		{a40, 285, 0, "2g.10gb"},
		{a40, 286, 0, "3g.20gb"}, // > 2/7 = 0.2857
		{a40, 320, 0, "3g.20gb"},
		{a40, 428, 0, "3g.20gb"},
		{a40, 429, 0, "4g.20gb"},
		{a40, 470, 0, "4g.20gb"},
		{a40, 571, 0, "4g.20gb"},
		{a40, 572, 0, "7g.40gb"}, // no 5g or 6g profile
		{a40, 810, 0, "7g.40gb"},
		{a40, 1000, 0, "7g.40gb"},
		{a40, 2000, 0, "7g.40gb"},
		{a40, 0, 5 * 1024, "1g.5gb"},
		{a40, 0, 5*1024 + 1, "1g.10gb"},
		{a40, 200, 6000, "2g.10gb"},
		{a40, 100, 15 * 1024, "3g.20gb"},
		{a40, 500, 30 * 1024, "7g.40gb"},
		{a40, 0, 40*1024 + 1, ""},
		{a40, -1, 0, ""},
		{a40, 0, -1, ""},
		{h, 100, 0, "1g.10gb"},
		{h, 100, 12 * 1024, "1g.20gb"},
		{h, 300, 0, "3g.40gb"},
		{nil, 0, 0, ""},
	} {
		p, ok := Smallest(tc.m, tc.milli, tc.mem)
		got := ""
		if ok {
			got = p.Name
		}
		if got != tc.want {
			name := "<nil>"
			if tc.m != nil {
				name = tc.m.Name
			}
			t.Errorf("Smallest(%s, %d, %d) = %q, want %q", name, tc.milli, tc.mem, got, tc.want)
		}
	}
}

func TestParseProfile(t *testing.T) {
	for _, tc := range []struct {
		in      string
		c, gb   int
		wantErr bool
	}{
		{"1g.5gb", 1, 5, false},
		{"7g.141gb", 7, 141, false},
		{"3g.40gb", 3, 40, false},
		{"1g.5gb+me", 0, 0, true},
		{"0g.5gb", 0, 0, true},
		{"1g.05gb", 0, 0, true},
		{"g.5gb", 0, 0, true},
		{"", 0, 0, true},
	} {
		c, gb, err := ParseProfile(tc.in)
		if (err != nil) != tc.wantErr || c != tc.c || gb != tc.gb {
			t.Errorf("ParseProfile(%q) = %d, %d, %v", tc.in, c, gb, err)
		}
	}
}

func TestParseLayoutAndValidate(t *testing.T) {
	a := mustModel(t, "A100-SXM4-40GB")
	for _, tc := range []struct {
		in      string
		wantErr bool
	}{
		{"", false},
		{"7g.40gb@0", false},
		{"3g.20gb@4*,2g.10gb@0,1g.5gb@2,1g.5gb@3", false},
		{"4g.20gb@0*,3g.20gb@4*", false},
		{"1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6", false},
		{"1g.5gb@7", true},            // no 1-slice instance at 7
		{"2g.10gb@6", true},           // 2g starts at 0, 2, 4
		{"4g.20gb@4", true},           // 4g starts at 0
		{"3g.20gb@0,2g.10gb@2", true}, // overlap
		{"1g.10gb@1", true},           // 2-slice 1g starts even
		{"3g.40gb@0", true},           // an A100-80GB profile
		{"1g.5gb", true},
		{"1g.5gb@x", true},
		{"1g.5gb@01", true},
		{"1g.5gb@-1", true},
		{"1g.5gb@0**", true},
	} {
		l, err := ParseLayout(a, tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("ParseLayout(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			continue
		}
		if err == nil && l.String() != tc.in {
			t.Errorf("ParseLayout(%q).String() = %q", tc.in, l.String())
		}
	}
	if _, err := ParseLayout(nil, ""); err == nil {
		t.Error("ParseLayout(nil model) succeeded")
	}
	if err := (Layout{}).Validate(); err == nil {
		t.Error("a layout without a model validated")
	}
}

func TestPlace(t *testing.T) {
	a := mustModel(t, "A100-SXM4-40GB")
	type want struct {
		ok                    bool
		start                 int
		existing, repartition bool
	}
	for _, tc := range []struct {
		layout  string
		profile string
		placer  Placer
		want    want
	}{
		// First fit, dynamic.
		{"", "1g.5gb", Placer{Mode: Dynamic}, want{true, 0, false, false}},
		{"1g.5gb@0*", "1g.5gb", Placer{Mode: Dynamic}, want{true, 1, false, false}},
		{"1g.5gb@0*", "3g.20gb", Placer{Mode: Dynamic}, want{true, 4, false, false}},
		{"1g.5gb@0*", "4g.20gb", Placer{Mode: Dynamic}, want{}},
		{"1g.5gb@0*", "7g.40gb", Placer{Mode: Dynamic}, want{}},
		{"4g.20gb@0*,3g.20gb@4", "3g.20gb", Placer{Mode: Dynamic}, want{true, 4, true, false}},
		{"4g.20gb@0*,3g.20gb@4*", "1g.5gb", Placer{Mode: Dynamic}, want{}},
		{"3g.20gb@0*", "2g.10gb", Placer{Mode: Dynamic}, want{true, 4, false, false}},
		// A free instance of the profile comes before new slices.
		{"1g.5gb@5,3g.20gb@0*", "1g.5gb", Placer{Mode: Dynamic}, want{true, 5, true, false}},
		// Without a tenant, free instances of other profiles may go.
		{"1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6", "7g.40gb", Placer{Mode: Dynamic}, want{true, 0, false, true}},
		// Only when nothing else fits: a free instance of the profile is
		// taken rather than resetting the GPU, whatever the strategy.
		{"1g.5gb@0,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6", "1g.5gb", Placer{Mode: Dynamic, Strategy: FragAware}, want{true, 0, true, false}},
		// A new instance next to the free 2g.10gb (slices 2-3 keep 3g's
		// start 4), rather than resetting the GPU for slice 6.
		{"2g.10gb@0", "1g.5gb", Placer{Mode: Dynamic, Strategy: FragAware}, want{true, 2, false, false}},
		{"2g.10gb@0", "4g.20gb", Placer{Mode: Dynamic}, want{true, 0, false, true}},
		// With a tenant, never.
		{"1g.5gb@0*,1g.5gb@1,1g.5gb@2,1g.5gb@3,1g.5gb@4,1g.5gb@5,1g.5gb@6", "2g.10gb", Placer{Mode: Dynamic}, want{}},
		// Static: only existing free instances.
		{"", "1g.5gb", Placer{Mode: Static}, want{}},
		{"3g.20gb@0*,1g.5gb@4,1g.5gb@5", "1g.5gb", Placer{Mode: Static}, want{true, 4, true, false}},
		{"3g.20gb@0*,1g.5gb@4,1g.5gb@5", "2g.10gb", Placer{Mode: Static}, want{}},
		// Fragmentation-aware: an empty GPU's 1g.5gb goes to slice 6,
		// keeping 4g (start 0) and every 2g start placeable.
		{"", "1g.5gb", Placer{Mode: Dynamic, Strategy: FragAware}, want{true, 6, false, false}},
		// Then the next one to 4 (5 ties with it and comes later): 4g
		// stays placeable; first fit would take 0 and lose 4g.
		{"1g.5gb@6*", "1g.5gb", Placer{Mode: Dynamic, Strategy: FragAware}, want{true, 4, false, false}},
		{"1g.5gb@6*", "1g.5gb", Placer{Mode: Dynamic}, want{true, 0, false, false}},
		// 2g.10gb on an empty GPU: 4 keeps 4g.
		{"", "2g.10gb", Placer{Mode: Dynamic, Strategy: FragAware}, want{true, 4, false, false}},
		// Static frag-aware: of the free 1g.5gb instances, the one whose
		// loss matters least (all leave the same profiles; ties: first).
		{"3g.20gb@0*,1g.5gb@4,1g.5gb@5", "1g.5gb", Placer{Mode: Static, Strategy: FragAware}, want{true, 4, true, false}},
		// Unknown profile.
		{"", "3g.40gb", Placer{Mode: Dynamic}, want{}},
	} {
		l, err := ParseLayout(a, tc.layout)
		if err != nil {
			t.Fatal(err)
		}
		c, ok := tc.placer.Place(l, tc.profile)
		got := want{ok, c.Placement.Start, c.Existing, c.Repartition}
		if !ok {
			got = want{}
		}
		if got != tc.want {
			t.Errorf("%s %s on %q (%s): got %+v, want %+v", tc.placer.Mode, tc.placer.Strategy, tc.layout, tc.profile, got, tc.want)
		}
		if ok {
			p, _ := a.Profile(tc.profile)
			if c.Placement.Size != p.Size {
				t.Errorf("%q %s: placement size %d", tc.layout, tc.profile, c.Placement.Size)
			}
		}
		if tc.placer == (Placer{Mode: Dynamic}) {
			if pl, ok2 := Place(l, tc.profile); ok2 != ok || pl != c.Placement {
				t.Errorf("Place(%q, %s) = %v %v, Placer says %v %v", tc.layout, tc.profile, pl, ok2, c.Placement, ok)
			}
		}
	}
}

func TestMeter(t *testing.T) {
	a := mustModel(t, "A100-SXM4-40GB")
	u := UniformMeter(a)
	if got := u.Unplaceable(0xff); got != 0 {
		t.Errorf("empty GPU: unplaceable %v", got)
	}
	if got := u.Unplaceable(0); got < 1-1e-9 || got > 1+1e-9 {
		t.Errorf("full GPU: unplaceable %v", got)
	}
	// Slice 7 alone: nothing (a 1-slice instance cannot start at 7).
	if got := u.Unplaceable(0x80); got < 1-1e-9 || got > 1+1e-9 {
		t.Errorf("slice 7 free: unplaceable %v", got)
	}
	// Slices 4..7: everything but 4g and 7g.
	if got := u.Unplaceable(0xf0); got < 2.0/6-1e-9 || got > 2.0/6+1e-9 {
		t.Errorf("slices 4-7 free: unplaceable %v, want 1/3", got)
	}
	if got := u.Room(0xff); got < 1-1e-9 || got > 1+1e-9 {
		t.Errorf("empty GPU: room %v", got)
	}
	m, err := NewMeter(a, map[string]float64{"1g.5gb": 3, "7g.40gb": 1})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Unplaceable(0x7f); got != 0.25 {
		t.Errorf("slices 0-6 free, demand 3:1 of 1g and 7g: unplaceable %v, want 0.25", got)
	}
	for _, bad := range []map[string]float64{nil, {"1g.5gb": 0}, {"1g.5gb": -1}, {"3g.40gb": 1}} {
		if _, err := NewMeter(a, bad); err == nil {
			t.Errorf("NewMeter(%v) succeeded", bad)
		}
	}
	if _, err := NewMeter(nil, map[string]float64{"1g.5gb": 1}); err == nil {
		t.Error("NewMeter(nil model) succeeded")
	}
}

// randomLayout builds a random valid layout by placing random profiles at
// random feasible starts.
func randomLayout(rng *rand.Rand, m *Model) Layout {
	l := Layout{Model: m}
	n := rng.Intn(6)
	for i := 0; i < n; i++ {
		p := m.Profiles[rng.Intn(len(m.Profiles))]
		st := p.Starts[rng.Intn(len(p.Starts))]
		in := Instance{Profile: p.Name, Placement: api.MIGPlacement{Start: st, Size: p.Size}, Used: rng.Intn(2) == 0}
		l.Instances = append(l.Instances, in)
		if l.Validate() != nil {
			l.Instances = l.Instances[:len(l.Instances)-1]
		}
	}
	return l
}

// TestPlaceProperties checks, on random layouts, that every choice is
// feasible (the new instance overlaps nothing it must not), that both
// strategies agree on whether a request fits, that static MIG only takes
// free instances, that a GPU with a tenant is never repartitioned, and
// that the simulator's fast path (BestStart) chooses as Place does.
func TestPlaceProperties(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, name := range Models() {
		m := mustModel(t, name)
		demand := map[string]float64{}
		for _, p := range m.Profiles {
			demand[p.Name] = float64(1 + rng.Intn(5))
		}
		meter, err := NewMeter(m, demand)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3000; i++ {
			l := randomLayout(rng, m)
			pi := rng.Intn(len(m.Profiles))
			prof := m.Profiles[pi]
			for _, mode := range []Mode{Static, Dynamic} {
				ff, okFF := Placer{Mode: mode}.Place(l, prof.Name)
				fa, okFA := Placer{Mode: mode, Strategy: FragAware, Meter: meter}.Place(l, prof.Name)
				if okFF != okFA {
					t.Fatalf("%s %s %q %s: first fit %v, frag-aware %v", name, mode, l, prof.Name, okFF, okFA)
				}
				for _, c := range []Choice{ff, fa} {
					if !okFF {
						break
					}
					if mode == Static && !c.Existing {
						t.Fatalf("static %q %s: %+v is not an existing instance", l, prof.Name, c)
					}
					if c.Repartition && l.Tenanted() {
						t.Fatalf("%q has a tenant and %s repartitions it: %+v", l, prof.Name, c)
					}
					if c.Repartition && mode == Dynamic {
						if _, ok := (Placer{Mode: Static}).Place(l, prof.Name); ok {
							t.Fatalf("%q: %s repartitions though a free instance fits", l, prof.Name)
						}
						if m.Placeable(pi, ^l.Occupied()) {
							t.Fatalf("%q: %s repartitions though free slices fit", l, prof.Name)
						}
					}
					// The new layout: the chosen instance used, plus what stays.
					var next Layout
					next.Model = m
					for _, in := range l.Instances {
						if c.Repartition && !in.Used {
							continue
						}
						if c.Existing && in.Placement == c.Placement && !in.Used {
							continue
						}
						next.Instances = append(next.Instances, in)
					}
					next.Instances = append(next.Instances, Instance{Profile: prof.Name, Placement: c.Placement, Used: true})
					if err := next.Validate(); err != nil {
						t.Fatalf("%s %q + %s at %+v: %v", mode, l, prof.Name, c, err)
					}
					if next.UsedCompute() > ComputeSlices {
						t.Fatalf("%q: %d compute slices used", next, next.UsedCompute())
					}
				}
			}
			// Fast path: a layout of used instances only.
			var used Layout
			used.Model = m
			for _, in := range l.Instances {
				if in.Used {
					used.Instances = append(used.Instances, in)
				}
			}
			if !used.Tenanted() {
				continue
			}
			free := ^used.Occupied()
			for _, s := range []Strategy{FirstFit, FragAware} {
				c, ok := Placer{Mode: Dynamic, Strategy: s, Meter: meter}.Place(used, prof.Name)
				st, ok2 := m.BestStart(pi, free, s, meter)
				if ok != ok2 || (ok && st != c.Placement.Start) || ok != m.Placeable(pi, free) {
					t.Fatalf("%s %q %s: Place %v %d, BestStart %v %d, Placeable %v", s, used, prof.Name, ok, c.Placement.Start, ok2, st, m.Placeable(pi, free))
				}
			}
		}
	}
}

// TestFragAwarePacksMore fills empty GPUs with a random stream of requests
// (popularity as the meter's) under both strategies: the fragmentation-
// aware choice must place more compute before the first request that fits
// nowhere (after that, small requests fill what is left under both).
func TestFragAwarePacksMore(t *testing.T) {
	m := mustModel(t, "A100-SXM4-40GB")
	demand := map[string]float64{"1g.5gb": 4, "2g.10gb": 2, "3g.20gb": 1, "4g.20gb": 1}
	meter, err := NewMeter(m, demand)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range m.Profiles { // in the model's order: deterministic
		for i := 0; i < int(demand[p.Name]); i++ {
			names = append(names, p.Name)
		}
	}
	placed := map[Strategy]int{}
	slices := map[Strategy]int{}
	first := map[Strategy]int{} // compute slices placed before the first request that fits nowhere
	for seed := int64(0); seed < 20; seed++ {
		for _, s := range []Strategy{FirstFit, FragAware} {
			rng := rand.New(rand.NewSource(seed))
			gpus := make([]uint8, 4) // free masks
			for i := range gpus {
				gpus[i] = 0xff
			}
			failed := false
			for k := 0; k < 40; k++ {
				pi := m.profileIndex(names[rng.Intn(len(names))])
				ok := false
				for g := range gpus {
					var st int
					if st, ok = m.BestStart(pi, gpus[g], s, meter); ok {
						gpus[g] &^= span(st, m.Profiles[pi].Size)
						placed[s]++
						slices[s] += m.Profiles[pi].Compute
						break
					}
				}
				if !ok {
					failed = true
				}
				if !failed && ok {
					first[s] += m.Profiles[pi].Compute
				}
			}
		}
	}
	t.Logf("20 streams of 40 requests on 4 GPUs: first fit placed %d (%d compute slices, %d before the first miss), frag-aware %d (%d, %d)",
		placed[FirstFit], slices[FirstFit], first[FirstFit], placed[FragAware], slices[FragAware], first[FragAware])
	if first[FragAware] <= first[FirstFit] {
		t.Errorf("frag-aware placed %d compute slices (%d before the first miss), first fit %d (%d)", slices[FragAware], first[FragAware], slices[FirstFit], first[FirstFit])
	}
}

func FuzzParseLayout(f *testing.F) {
	for _, s := range []string{"", "7g.40gb@0", "3g.20gb@4*,2g.10gb@0,1g.5gb@2", "1g.5gb@7", "1g.5gb@0**", "x@1,", "4g.20gb@0*,3g.20gb@4*"} {
		f.Add(s)
	}
	m, _ := Lookup("A100-SXM4-40GB")
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLayout(m, s)
		if err != nil {
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseLayout(%q) gave an invalid layout: %v", s, err)
		}
		back, err := ParseLayout(m, l.String())
		if err != nil || back.String() != l.String() {
			t.Fatalf("%q: String %q does not parse back (%v)", s, l.String(), err)
		}
		for _, p := range m.Profiles {
			if c, ok := (Placer{Mode: Dynamic, Strategy: FragAware}).Place(l, p.Name); ok {
				if c.Placement.Size != p.Size {
					t.Fatalf("%q %s: %+v", s, p.Name, c)
				}
			}
		}
	})
}

func FuzzParseProfile(f *testing.F) {
	for _, s := range []string{"1g.5gb", "7g.141gb", "1g.5gb+me", "0g.1gb", "9g.9gb"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, gb, err := ParseProfile(s)
		if err != nil {
			if api.ValidMIGProfile(s) {
				t.Fatalf("%q is valid but does not parse: %v", s, err)
			}
			return
		}
		if got := fmt.Sprintf("%dg.%dgb", c, gb); got != s {
			t.Fatalf("ParseProfile(%q) = %d, %d: renders %q", s, c, gb, got)
		}
	})
}

func BenchmarkPlace(b *testing.B) {
	m, _ := Lookup("A100-SXM4-40GB")
	l, err := ParseLayout(m, "1g.5gb@6*,2g.10gb@0*,1g.5gb@5")
	if err != nil {
		b.Fatal(err)
	}
	meter := UniformMeter(m)
	for _, s := range []Strategy{FirstFit, FragAware} {
		b.Run(s.String(), func(b *testing.B) {
			pl := Placer{Mode: Dynamic, Strategy: s, Meter: meter}
			for i := 0; i < b.N; i++ {
				if _, ok := pl.Place(l, "1g.5gb"); !ok {
					b.Fatal("no placement")
				}
			}
		})
	}
}

func BenchmarkBestStart(b *testing.B) {
	m, _ := Lookup("A100-SXM4-40GB")
	meter := UniformMeter(m)
	for i := 0; i < b.N; i++ {
		if _, ok := m.BestStart(0, 0x3f, FragAware, meter); !ok {
			b.Fatal("no placement")
		}
	}
}
