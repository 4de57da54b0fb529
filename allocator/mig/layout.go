package mig

import (
	"errors"
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// Instance is one MIG instance of a GPU: its profile, where it lies, and
// whether a container uses it.
type Instance struct {
	Profile   string
	Placement api.MIGPlacement
	Used      bool
}

// Layout is a GPU in MIG mode: its model and its instances. Memory slices
// no instance covers are unpartitioned.
type Layout struct {
	Model     *Model
	Instances []Instance
}

// Validate checks that every instance is a profile of the model at one of
// its placements, and that no two overlap (api.CheckMIGPlacements).
func (l Layout) Validate() error {
	if l.Model == nil {
		return errors.New("layout has no GPU model")
	}
	places := make([]api.MIGPlacement, len(l.Instances))
	for i, in := range l.Instances {
		p, ok := l.Model.Profile(in.Profile)
		if !ok {
			return fmt.Errorf("instance %d: %s has no profile %q", i, l.Model.Name, in.Profile)
		}
		if in.Placement.Size != p.Size || !hasStart(p, in.Placement.Start) {
			return fmt.Errorf("instance %d: %s is not a placement of %s on %s (size %d, starts %v)", i, placeString(in.Placement), p.Name, l.Model.Name, p.Size, p.Starts)
		}
		places[i] = in.Placement
	}
	return api.CheckMIGPlacements("instances", places)
}

func hasStart(p Profile, start int) bool {
	for _, s := range p.Starts {
		if s == start {
			return true
		}
	}
	return false
}

// Occupied is the mask of memory slices covered by an instance (bit i is
// slice i).
func (l Layout) Occupied() uint8 {
	var m uint8
	for _, in := range l.Instances {
		m |= span(in.Placement.Start, in.Placement.Size)
	}
	return m
}

// Tenanted reports whether a container uses an instance of the GPU.
func (l Layout) Tenanted() bool {
	for _, in := range l.Instances {
		if in.Used {
			return true
		}
	}
	return false
}

// UsedCompute is the number of compute slices of the used instances.
func (l Layout) UsedCompute() int {
	c := 0
	for _, in := range l.Instances {
		if p, ok := l.Model.Profile(in.Profile); ok && in.Used {
			c += p.Compute
		}
	}
	return c
}

// Mode says what a placement may do to a GPU's partitioning.
type Mode uint8

const (
	// Static MIG: a request only takes an existing free instance of its
	// profile (the layout is what an administrator configured).
	Static Mode = iota
	// Dynamic MIG: a request may also get a new instance in unpartitioned
	// memory slices, and, when neither that nor a free instance fits, a
	// GPU without a tenant may be repartitioned whole (its free instances
	// destroyed). A GPU with a tenant is never repartitioned: it only
	// gains instances in its free slices.
	Dynamic
)

func (m Mode) String() string {
	if m == Dynamic {
		return "dynamic"
	}
	return "static"
}

// Strategy says which of the feasible placements to take.
type Strategy uint8

const (
	// FirstFit takes an existing free instance first, then a new one in
	// unpartitioned slices, then repartitions; each at the lowest start.
	FirstFit Strategy = iota
	// FragAware takes the placement after which the expected unplaceable
	// demand (Meter.Unplaceable) is lowest: the one that keeps the most
	// popular profiles placeable. Ties go to the one leaving the most
	// placements of popular profiles (Meter.Room), then as FirstFit.
	FragAware
)

func (s Strategy) String() string {
	if s == FragAware {
		return "frag"
	}
	return "firstfit"
}

// Choice is where Place puts a request.
type Choice struct {
	Placement api.MIGPlacement
	// Existing is true when the request takes an existing free instance;
	// false when a new instance is to be created at Placement.
	Existing bool
	// Repartition is true when the GPU's free instances must be destroyed
	// first (Dynamic mode, a GPU without a tenant).
	Repartition bool
}

// Placer places requests on GPU layouts.
type Placer struct {
	Mode     Mode
	Strategy Strategy
	// Meter is the demand FragAware measures against; nil means every
	// profile of the layout's model equally popular.
	Meter *Meter
}

// Place is a dynamic-MIG first fit: where a request for profile goes on l,
// and whether it fits at all.
func Place(l Layout, profile string) (api.MIGPlacement, bool) {
	c, ok := Placer{Mode: Dynamic}.Place(l, profile)
	return c.Placement, ok
}

// candidate is one feasible choice and the GPU state it leaves.
type candidate struct {
	Choice
	after state
}

// state is what decides which profiles a GPU can still take: the starts
// of its free instances per profile, its unpartitioned slices, and whether
// it has a tenant.
type state struct {
	freeInst []uint8 // per profile index: mask of starts of free instances
	free     uint8   // unpartitioned slices
	tenanted bool
}

func stateOf(l Layout) state {
	s := state{freeInst: make([]uint8, len(l.Model.Profiles)), free: ^l.Occupied(), tenanted: l.Tenanted()}
	for _, in := range l.Instances {
		if !in.Used {
			if i := l.Model.profileIndex(in.Profile); i >= 0 {
				s.freeInst[i] |= 1 << in.Placement.Start
			}
		}
	}
	return s
}

// Place chooses where a request for profile goes on l. ok is false when
// the profile is not the model's, the layout is invalid, or no placement
// is feasible.
func (pl Placer) Place(l Layout, profile string) (Choice, bool) {
	if l.Validate() != nil {
		return Choice{}, false
	}
	pi := l.Model.profileIndex(profile)
	if pi < 0 {
		return Choice{}, false
	}
	cands := pl.candidates(l, pi)
	if len(cands) == 0 {
		return Choice{}, false
	}
	if pl.Strategy == FirstFit {
		return cands[0].Choice, true
	}
	meter := pl.Meter
	if meter == nil || meter.model != l.Model {
		meter = UniformMeter(l.Model)
	}
	best := 0
	bu, br := meter.unplaceable(cands[0].after, pl.Mode), meter.room(cands[0].after, pl.Mode)
	for i := 1; i < len(cands); i++ {
		u, r := meter.unplaceable(cands[i].after, pl.Mode), meter.room(cands[i].after, pl.Mode)
		if u < bu-1e-12 || (u <= bu+1e-12 && r > br+1e-12) {
			best, bu, br = i, u, r
		}
	}
	return cands[best].Choice, true
}

// candidates lists the feasible choices in first-fit order.
func (pl Placer) candidates(l Layout, pi int) []candidate {
	p := l.Model.Profiles[pi]
	s := stateOf(l)
	var out []candidate
	for _, st := range p.Starts {
		if s.freeInst[pi]&(1<<st) != 0 {
			a := s.clone()
			a.freeInst[pi] &^= 1 << st
			a.tenanted = true
			out = append(out, candidate{Choice{Placement: api.MIGPlacement{Start: st, Size: p.Size}, Existing: true}, a})
		}
	}
	if pl.Mode != Dynamic {
		return out
	}
	for _, st := range p.Starts {
		if m := span(st, p.Size); s.free&m == m {
			a := s.clone()
			a.free &^= m
			a.tenanted = true
			out = append(out, candidate{Choice{Placement: api.MIGPlacement{Start: st, Size: p.Size}}, a})
		}
	}
	// Repartitioning (destroying the free instances of a GPU without a
	// tenant) only when nothing else fits: it resets the GPU.
	if len(out) == 0 && !s.tenanted && len(l.Instances) > 0 {
		for _, st := range p.Starts {
			m := span(st, p.Size)
			a := state{freeInst: make([]uint8, len(s.freeInst)), free: ^m, tenanted: true}
			out = append(out, candidate{Choice{Placement: api.MIGPlacement{Start: st, Size: p.Size}, Repartition: true}, a})
		}
	}
	return out
}

func (s state) clone() state {
	c := s
	c.freeInst = append([]uint8(nil), s.freeInst...)
	return c
}

// Meter measures how well a GPU state serves a demand: a popularity
// distribution over a model's profiles. It precomputes, for every mask of
// free memory slices, the expected unplaceable demand and room.
type Meter struct {
	model  *Model
	weight []float64                   // per profile index, summing to 1
	unpl   [1 << api.MIGSlices]float64 // Σ weight of the profiles not placeable in the mask
	roomOf [1 << api.MIGSlices]float64 // Σ weight × share of the profile's starts placeable in the mask
}

// NewMeter builds a meter for model from a demand: profile name → weight
// (any positive scale; it is normalised). Profiles not in the map weigh 0.
func NewMeter(model *Model, demand map[string]float64) (*Meter, error) {
	if model == nil {
		return nil, errors.New("meter: no GPU model")
	}
	mt := &Meter{model: model, weight: make([]float64, len(model.Profiles))}
	var sum float64
	names := make([]string, 0, len(demand))
	for n := range demand {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		w := demand[n]
		i := model.profileIndex(n)
		switch {
		case i < 0:
			return nil, fmt.Errorf("meter: %s has no profile %q", model.Name, n)
		case !(w >= 0):
			return nil, fmt.Errorf("meter: profile %s: weight %v is not >= 0", n, w)
		}
		mt.weight[i] += w
		sum += w
	}
	if !(sum > 0) {
		return nil, errors.New("meter: the demand weighs nothing")
	}
	for i := range mt.weight {
		mt.weight[i] /= sum
	}
	for free := 0; free < 1<<api.MIGSlices; free++ {
		for pi, p := range model.Profiles {
			w := mt.weight[pi]
			if w == 0 {
				continue
			}
			if !model.placeable[pi][free] {
				mt.unpl[free] += w
			}
			n := 0
			for _, st := range p.Starts {
				if m := span(st, p.Size); uint8(free)&m == m {
					n++
				}
			}
			mt.roomOf[free] += w * float64(n) / float64(len(p.Starts))
		}
	}
	return mt, nil
}

// UniformMeter is the meter of a demand where every profile of the model
// is equally popular.
func UniformMeter(model *Model) *Meter {
	d := make(map[string]float64, len(model.Profiles))
	for _, p := range model.Profiles {
		d[p.Name] = 1
	}
	mt, err := NewMeter(model, d)
	if err != nil {
		panic(err) // cannot happen: every profile is the model's, weight 1
	}
	return mt
}

// Model is the meter's GPU model.
func (mt *Meter) Model() *Model { return mt.model }

// Weight is the normalised popularity of the profile at index i of the
// model's Profiles.
func (mt *Meter) Weight(i int) float64 { return mt.weight[i] }

// Unplaceable is the expected unplaceable demand of a dynamic-MIG GPU
// without free instances whose unpartitioned slices are free (bit i is
// slice i): the total weight of the profiles no placement of which is
// free. 0 for an empty GPU, 1 for a full one.
func (mt *Meter) Unplaceable(free uint8) float64 { return mt.unpl[free] }

// Room is the expected share of a profile's placements still free in the
// mask, weighted by popularity (1 for an empty GPU).
func (mt *Meter) Room(free uint8) float64 { return mt.roomOf[free] }

func (mt *Meter) unplaceable(s state, mode Mode) float64 {
	var u float64
	for pi, w := range mt.weight {
		if w == 0 {
			continue
		}
		if s.freeInst[pi] == 0 && (mode != Dynamic || !mt.model.placeable[pi][s.free]) {
			u += w
		}
	}
	return u
}

func (mt *Meter) room(s state, mode Mode) float64 {
	var r float64
	if mode == Dynamic {
		r = mt.roomOf[s.free]
	}
	for pi, w := range mt.weight {
		if w == 0 || s.freeInst[pi] == 0 {
			continue
		}
		p := mt.model.Profiles[pi]
		r += w * float64(bits.OnesCount8(s.freeInst[pi])) / float64(len(p.Starts))
	}
	return r
}

// Placeable reports whether a new instance of the profile at index pi fits
// in the free memory slices (bit i is slice i).
func (m *Model) Placeable(pi int, free uint8) bool { return m.placeable[pi][free] }

// BestStart is the fast path of a dynamic-MIG GPU without free instances
// (what the simulator replays): the start of a new instance of the profile
// at index pi in the free slices, by the strategy (FragAware measured by
// mt, which must be of m). ok is false when no placement is free.
func (m *Model) BestStart(pi int, free uint8, strategy Strategy, mt *Meter) (start int, ok bool) {
	p := &m.Profiles[pi]
	best := -1
	var bu, br float64
	for _, st := range p.Starts {
		sp := span(st, p.Size)
		if free&sp != sp {
			continue
		}
		if strategy == FirstFit {
			return st, true
		}
		after := free &^ sp
		u, r := mt.unpl[after], mt.roomOf[after]
		if best < 0 || u < bu-1e-12 || (u <= bu+1e-12 && r > br+1e-12) {
			best, bu, br = st, u, r
		}
	}
	return best, best >= 0
}

// String renders the layout as ParseLayout reads it.
func (l Layout) String() string {
	parts := make([]string, len(l.Instances))
	for i, in := range l.Instances {
		parts[i] = in.Profile + "@" + strconv.Itoa(in.Placement.Start)
		if in.Used {
			parts[i] += "*"
		}
	}
	return strings.Join(parts, ",")
}

func placeString(p api.MIGPlacement) string {
	return fmt.Sprintf("start %d size %d", p.Start, p.Size)
}

// ParseLayout reads a layout of model written as comma-separated
// "<profile>@<start>" instances, "*" after the start marking one in use,
// e.g. "3g.20gb@4*,2g.10gb@0,1g.5gb@2". The empty string is a GPU with no
// instances. The result is validated.
func ParseLayout(model *Model, s string) (Layout, error) {
	l := Layout{Model: model}
	if model == nil {
		return l, errors.New("layout: no GPU model")
	}
	if strings.TrimSpace(s) == "" {
		return l, nil
	}
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		name, start, found := strings.Cut(part, "@")
		if !found {
			return Layout{}, fmt.Errorf("layout instance %d %q: want <profile>@<start>", i, part)
		}
		in := Instance{Profile: name}
		if strings.HasSuffix(start, "*") {
			in.Used = true
			start = strings.TrimSuffix(start, "*")
		}
		st, err := strconv.Atoi(start)
		if err != nil || st < 0 || st >= api.MIGSlices || start != strconv.Itoa(st) {
			return Layout{}, fmt.Errorf("layout instance %d %q: start %q is not a memory slice 0..%d", i, part, start, api.MIGSlices-1)
		}
		p, ok := model.Profile(name)
		if !ok {
			return Layout{}, fmt.Errorf("layout instance %d %q: %s has no profile %q", i, part, model.Name, name)
		}
		in.Placement = api.MIGPlacement{Start: st, Size: p.Size}
		l.Instances = append(l.Instances, in)
	}
	if err := l.Validate(); err != nil {
		return Layout{}, fmt.Errorf("layout %q: %w", s, err)
	}
	return l, nil
}
