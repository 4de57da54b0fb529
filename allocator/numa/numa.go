// Package numa decides whether a pod's GPUs and exclusive CPUs can be
// aligned on one NUMA node of a node, as the kubelet's topology manager will
// demand, before the pod is bound there.
//
// The kubelet aligns on the node: the device manager hints where the GPUs
// are, the CPU manager (static policy) where free CPUs are, and with the
// policy single-numa-node or restricted a pod whose hints do not meet on one
// NUMA node fails admission with TopologyAffinityError. A scheduler that
// counts only a node's totals binds such a pod to a node that cannot run it
// while another could. This package holds the rule the scheduler extender
// applies instead (and the gang planner through it): the alignment demand of
// a pod (Demand), the free room of each NUMA node (Zone), and the fit of the
// pod's demand together with what the node still has to place for pods it
// has not recorded yet (Fit). It is pure: no API, no clock.
package numa

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Policy is a kubelet topology manager policy (api.TopologyPolicy...).
type Policy string

// Policies.
const (
	None           Policy = "none"
	BestEffort     Policy = "best-effort"
	Restricted     Policy = "restricted"
	SingleNUMANode Policy = "single-numa-node"
)

// Requires reports whether the kubelet refuses a pod it cannot align.
func (p Policy) Requires() bool { return p == Restricted || p == SingleNUMANode }

// Prefers reports whether the kubelet aligns when it can but admits the pod
// anyway when it cannot.
func (p Policy) Prefers() bool { return p == BestEffort }

// Scope is a kubelet topology manager scope.
type Scope string

// Scopes.
const (
	// ScopeContainer aligns each container on its own.
	ScopeContainer Scope = "container"
	// ScopePod aligns all of a pod's containers on the same NUMA node(s).
	ScopePod Scope = "pod"
)

// Need is what one unit of alignment (a container, or the whole pod under
// ScopePod) must find on a single NUMA node.
type Need struct {
	// Name is the container's name, or "" for the pod.
	Name string
	// GPUs are whole GPUs.
	GPUs int
	// Slice is set when the unit's shared slice must be on a GPU of the
	// zone (the pod's slices are all on one GPU).
	Slice bool
	// CPUs are exclusive CPUs (the CPU manager's static policy).
	CPUs int
	// MemMiB is memory the memory manager pins (0 when not tracked).
	MemMiB int64
	// MIG counts the MIG instances per profile (e.g. "1g.5gb") the unit
	// needs on GPUs of the zone.
	MIG map[string]int
}

// IsZero reports whether n asks for nothing to align.
func (n Need) IsZero() bool {
	return n.GPUs == 0 && !n.Slice && n.CPUs == 0 && n.MemMiB == 0 && migCount(n.MIG) == 0
}

// migCount is the number of instances of m, all profiles together.
func migCount(m map[string]int) int {
	c := 0
	for _, n := range m {
		c += n
	}
	return c
}

// withoutSlice is n without its slice: what the kubelet aligns of it.
func (n Need) withoutSlice() Need {
	n.Slice = false
	return n
}

// String renders n as "4 free GPUs and 32 free CPUs".
func (n Need) String() string {
	var parts []string
	switch {
	case n.GPUs == 1:
		parts = append(parts, "1 free GPU")
	case n.GPUs > 1:
		parts = append(parts, fmt.Sprintf("%d free GPUs", n.GPUs))
	}
	if n.Slice {
		parts = append(parts, "a GPU with room for the slice")
	}
	for _, p := range slices.Sorted(maps.Keys(n.MIG)) {
		switch c := n.MIG[p]; {
		case c == 1:
			parts = append(parts, fmt.Sprintf("1 free %s MIG instance", p))
		case c > 1:
			parts = append(parts, fmt.Sprintf("%d free %s MIG instances", c, p))
		}
	}
	if n.CPUs > 0 {
		parts = append(parts, fmt.Sprintf("%d free CPUs", n.CPUs))
	}
	if n.MemMiB > 0 {
		parts = append(parts, fmt.Sprintf("%d MiB free memory", n.MemMiB))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	if len(parts) == 1 {
		return parts[0]
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}

// Demand is a pod's alignment demand for either scope.
type Demand struct {
	// Pod is the pod as one unit (ScopePod): its peak GPUs, CPUs and
	// memory.
	Pod Need
	// Containers are the units under ScopeContainer: each regular or
	// sidecar container that asks for exclusive CPUs or GPUs, with the
	// containers sharing the pod's slice merged into one unit (their GPU
	// is one). Init containers are left out: they run before the others
	// and the kubelet gives their CPUs to them afterwards.
	Containers []Need
}

// Needs returns the units to align under scope, leaving out those that ask
// for nothing.
func (d Demand) Needs(scope Scope) []Need {
	if scope == ScopePod {
		if d.Pod.IsZero() {
			return nil
		}
		return []Need{d.Pod}
	}
	var out []Need
	for _, n := range d.Containers {
		if !n.IsZero() {
			out = append(out, n)
		}
	}
	return out
}

// Zone is the room one NUMA node of a node has left.
type Zone struct {
	ID int
	// GPUs and FreeGPUs: the zone's healthy GPUs and those fully free.
	GPUs, FreeGPUs int
	// SliceRoom: a GPU of the zone has room for the pod's slice.
	SliceRoom bool
	// CPUs and FreeCPUs: exclusive-capable CPUs and those free.
	CPUs, FreeCPUs int
	// MemMiB and FreeMemMiB: pinnable memory; MemMiB 0 means memory is not
	// tracked on the node and is not checked.
	MemMiB, FreeMemMiB int64
	// MIG and FreeMIG count the zone's healthy MIG instances per profile,
	// and those no pod holds.
	MIG, FreeMIG map[string]int
}

// Held is a unit the node has yet to place: a pod bound or planned there
// whose GPUs or exclusive CPUs the node has not reported yet. Zone is where
// it must go (the zone of what it already has), or -1 for any.
type Held struct {
	Need
	Zone int
}

// room is a zone's room during a search.
type room struct {
	gpus, cpus int
	mem        int64
	slice      bool
	trackMem   bool
	mig        map[string]int
}

func (r *room) fits(n Need) bool {
	for p, c := range n.MIG {
		if r.mig[p] < c {
			return false
		}
	}
	return r.gpus >= n.GPUs && r.cpus >= n.CPUs && (!n.Slice || r.slice) && (!r.trackMem || r.mem >= n.MemMiB)
}

func (r *room) take(n Need, sign int) {
	r.gpus -= sign * n.GPUs
	r.cpus -= sign * n.CPUs
	r.mem -= int64(sign) * n.MemMiB
	for p, c := range n.MIG {
		if r.mig == nil {
			r.mig = map[string]int{}
		}
		r.mig[p] -= sign * c
	}
}

// Fit decides whether every held unit and every one of needs find room,
// each on a single zone, the way the kubelet places them: the topology
// manager picks, of the NUMA nodes with room for a unit, the narrowest and
// then the lowest (so first fit by zone ID in zones' order), one unit after
// the other. A unit's slice is not among what the kubelet aligns (its
// units carry no NUMA node): the slice fits when a GPU of the zone the
// rest of the unit gets has room for it. Held units go first (the node
// admits them before the pod): one with a zone takes its room there, one
// without takes the first zone
// with room; a held unit that fits nowhere is skipped (the kubelet refuses
// it, and it frees nothing). placed[i] is the ID of the zone needs[i] gets;
// ok is false when one of needs finds no zone.
func Fit(zones []Zone, held []Held, needs []Need) (placed []int, ok bool) {
	rooms := make([]room, len(zones))
	index := make(map[int]int, len(zones))
	for i, z := range zones {
		rooms[i] = room{gpus: z.FreeGPUs, cpus: z.FreeCPUs, mem: z.FreeMemMiB, slice: z.SliceRoom, trackMem: z.MemMiB > 0, mig: maps.Clone(z.FreeMIG)}
		index[z.ID] = i
	}
	first := func(n Need) int {
		if !n.Slice {
			for i := range rooms {
				if rooms[i].fits(n) {
					return i
				}
			}
			return -1
		}
		// A slice's units carry no NUMA node (deviceplugin/devices): the
		// kubelet aligns only the rest of the unit (its exclusive CPUs,
		// memory), so the slice must be on the zone the rest gets, and
		// a slice alone goes on any GPU with room.
		rest := n.withoutSlice()
		for i := range rooms {
			if rest.IsZero() && rooms[i].slice {
				return i
			}
			if !rest.IsZero() && rooms[i].fits(rest) {
				if !rooms[i].slice {
					return -1
				}
				return i
			}
		}
		return -1
	}
	for _, pinned := range []bool{true, false} {
		for _, h := range held {
			if h.IsZero() || (h.Zone >= 0) != pinned {
				continue
			}
			z := first(h.Need)
			if pinned {
				p, ok := index[h.Zone]
				if !ok {
					continue // a zone the node no longer reports
				}
				z = p
			}
			if z >= 0 {
				rooms[z].take(h.Need, 1)
			}
		}
	}
	placed = make([]int, len(needs))
	for i, n := range needs {
		z := first(n)
		if z < 0 {
			return nil, false
		}
		rooms[z].take(n, 1)
		placed[i] = zones[z].ID
	}
	return placed, true
}

// Capable returns the first of needs that no zone could hold even with
// nothing else on the node (ok false): under single-numa-node such a unit
// never runs on the node.
func Capable(zones []Zone, needs []Need) (Need, bool) {
	for _, n := range needs {
		fits := false
		for _, z := range zones {
			r := room{gpus: z.GPUs, cpus: z.CPUs, mem: z.MemMiB, slice: n.Slice, trackMem: z.MemMiB > 0, mig: z.MIG}
			if r.fits(n) {
				fits = true
				break
			}
		}
		if !fits {
			return n, false
		}
	}
	return Need{}, true
}

// Check is the rule for one pod on one node under policy: nil when the
// pod's units fit (or the policy does not require alignment), else an error
// saying which unit finds no NUMA node. Under Restricted a unit too large
// for any single zone is left to the kubelet (it admits the smallest set of
// NUMA nodes that holds it); under SingleNUMANode it is refused with
// ErrTooLarge.
func Check(policy Policy, zones []Zone, held []Held, needs []Need) error {
	if !policy.Requires() || len(needs) == 0 {
		return nil
	}
	if n, ok := Capable(zones, needs); !ok {
		if policy == SingleNUMANode {
			return &Error{Need: n, TooLarge: true, Only: len(needs) == 1}
		}
		var aligned []Need
		for _, m := range needs {
			if _, ok := Capable(zones, []Need{m}); ok {
				aligned = append(aligned, m)
			}
		}
		needs = aligned
	}
	if _, ok := Fit(zones, held, needs); ok {
		return nil
	}
	// Name the first unit that does not fit on its own, else the set.
	for _, n := range needs {
		if _, ok := Fit(zones, held, []Need{n}); !ok {
			e := &Error{Need: n, Only: len(needs) == 1}
			if rest := n.withoutSlice(); n.Slice && !rest.IsZero() {
				if z, ok := Fit(zones, held, []Need{rest}); ok {
					e.SliceAway, e.RestZone = true, z[0]
				}
			}
			return e
		}
	}
	return &Error{Need: needs[0], Together: len(needs)}
}

// Error says why a pod's units cannot be aligned on a node.
type Error struct {
	Need Need
	// TooLarge: no NUMA node of the node could ever hold the unit.
	TooLarge bool
	// Together > 1: each unit fits alone, not all of them at once.
	Together int
	// Only: the unit is the pod's only one (the message names no
	// container).
	Only bool
	// SliceAway: the unit's slice does not fit on NUMA node RestZone,
	// where the kubelet puts the rest of the unit (another NUMA node may
	// have both).
	SliceAway bool
	RestZone  int
}

func (e *Error) Error() string {
	who := ""
	if e.Need.Name != "" && !e.Only {
		who = fmt.Sprintf(" for container %q", e.Need.Name)
	}
	switch {
	case e.TooLarge:
		return fmt.Sprintf("no NUMA node has %s%s even when empty", strings.ReplaceAll(e.Need.String(), "free ", ""), who)
	case e.Together > 1:
		return fmt.Sprintf("no NUMA nodes hold the pod's %d aligned containers at once", e.Together)
	case e.SliceAway:
		return fmt.Sprintf("the kubelet puts %s%s on NUMA node %d, the first with room for them, and no GPU there has room for the slice",
			strings.ReplaceAll(e.Need.withoutSlice().String(), "free ", "exclusive "), who, e.RestZone)
	}
	return fmt.Sprintf("no NUMA node has %s%s", e.Need, who)
}
