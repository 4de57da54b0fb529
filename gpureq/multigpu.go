package gpureq

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// A multi-GPU slice (api.AnnotationGPUCount: N) splits each shared
// container's request evenly over N distinct GPUs of one node: the
// container holds (and the kubelet allocates, and quota counts) its whole
// request; each of its N GPUs serves request/N of it. The rules below are
// the only copy: the extender's filter and bind, the device plugin's
// Allocate checks, the NRI decision and quota call them.
//
// MPS groups. A CUDA client reaches exactly one MPS control daemon (one
// pipe directory), so the N GPUs of a multi-GPU slice are served by one
// daemon for that set of GPUs. A GPU is under at most one daemon, and
// every client of a daemon holds a slice on every GPU the daemon serves
// (so no client can reach, through its server, a GPU it holds nothing
// of). Hence the group rule: the slices on one GPU all span the same set
// of GPUs (its group, named by GroupKey), and a new slice over the set S
// goes only on GPUs that hold no slice or whose group is exactly S. A
// running daemon is then never restarted or merged to admit a tenant. The
// group of every GPU follows from the slices on the node (the sealed
// assignments, the NRI ledger): nothing is kept only in memory.

// PerGPU is the share of each of its n GPUs that c asks for: its memory
// units and cores divided by n. It refuses (CodeGPUCountUneven) a split
// that is not even. n < 2 returns c.
func (c Container) PerGPU(n int) (Container, *Refusal) {
	if n < 2 || !c.Shared() {
		return c, nil
	}
	k := int64(n)
	if c.MemUnits%k != 0 || c.Cores%k != 0 {
		return c, &Refusal{Code: CodeGPUCountUneven, Container: c.Name,
			Message: fmt.Sprintf("container %q asks for %d %s and %d %s, which %s %d does not split evenly: ask for multiples of %d", c.Name, c.MemUnits, api.ResourceGPUMemory, c.Cores, api.ResourceGPUCore, api.AnnotationGPUCount, n, n)}
	}
	out := c
	out.MemUnits, out.Cores = c.MemUnits/k, c.Cores/k
	return out, nil
}

// CheckCount refuses a multi-GPU slice of n GPUs on a node that offers
// only gpus GPUs for slices (healthy, not in MIG mode).
func CheckCount(n, gpus int) *Refusal {
	if n > gpus {
		return &Refusal{Code: CodeGPUCountAboveNode,
			Message: fmt.Sprintf("%s %d asks for more GPUs than the node's %d that can serve slices", api.AnnotationGPUCount, n, gpus)}
	}
	return nil
}

// GroupKey names the MPS group of a slice's GPUs: their UUIDs, sorted,
// joined by ",". A slice of one GPU is the group of that GPU alone (its
// key is its UUID).
func GroupKey(uuids []string) string {
	s := slices.Clone(uuids)
	sort.Strings(s)
	return strings.Join(s, ",")
}

// GroupGPUs is the inverse of GroupKey.
func GroupGPUs(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ",")
}

// conflict marks a GPU whose slices span different sets (a broken record):
// no slice is admitted there until they end.
const conflict = "\x00conflict"

// Groups is the MPS group of each GPU of a node that serves slices, built
// from every slice on the node (Add). The zero value is empty.
type Groups struct {
	of map[string]string
}

// Add records a slice over the GPUs uuids.
func (g *Groups) Add(uuids []string) {
	if len(uuids) == 0 {
		return
	}
	if g.of == nil {
		g.of = map[string]string{}
	}
	key := GroupKey(uuids)
	for _, u := range uuids {
		if cur, ok := g.of[u]; ok && cur != key {
			g.of[u] = conflict
			continue
		}
		g.of[u] = key
	}
}

// Of is the group key of the GPU uuid; ok is false when it serves no slice.
// A GPU whose slices span different sets has a key no slice matches.
func (g Groups) Of(uuid string) (key string, ok bool) {
	key, ok = g.of[uuid]
	return key, ok
}

// InSet reports whether the GPU uuid serves slices of a multi-GPU group
// (or of conflicting groups): a slice of one GPU cannot go there.
func (g Groups) InSet(uuid string) bool {
	key, ok := g.of[uuid]
	return ok && (key == conflict || strings.Contains(key, ","))
}

// Keys are the distinct groups, sorted (conflicting GPUs left out: their
// daemons cannot be derived).
func (g Groups) Keys() []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range g.of {
		if k != conflict && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// Check refuses (CodeMPSGroup) a slice over uuids when one of them serves
// slices of another group: the group rule above.
func (g Groups) Check(uuids []string) *Refusal {
	key := GroupKey(uuids)
	for _, u := range uuids {
		cur, ok := g.of[u]
		if !ok || cur == key {
			continue
		}
		if cur == conflict {
			return &Refusal{Code: CodeMPSGroup, Message: fmt.Sprintf("GPU %s serves slices of different GPU sets (a broken record) and takes no slice until they end", u)}
		}
		return &Refusal{Code: CodeMPSGroup, Message: fmt.Sprintf("GPU %s serves slices spanning the GPUs %s under their MPS daemon; a slice spanning %s cannot join it (a GPU is under one MPS daemon, whose clients all hold slices of all its GPUs)", u, describeKey(cur), describeKey(key))}
	}
	return nil
}

func describeKey(key string) string {
	gpus := GroupGPUs(key)
	if len(gpus) == 1 {
		return "[" + gpus[0] + "] alone"
	}
	return "[" + key + "]"
}

// Candidate is one GPU of a node, as a multi-GPU slice's placement sees
// it.
type Candidate struct {
	UUID  string
	Index int
	// Room: healthy, offered for slices, not used whole, and with room
	// for the slice's share of one GPU (memory and cores).
	Room bool
	// Group is the GPU's group key (Groups.Of); "" when it serves no
	// slice.
	Group string
	// FreeMiB is its free shared memory (prefer the fuller sets).
	FreeMiB int64
}

// ChooseGPUs picks n GPUs (positions in c, in index order) for a
// multi-GPU slice under the group rule: first an existing group of exactly
// n GPUs with room on each (the fullest, so that sets fill before new ones
// open), else n GPUs that serve no slice, within one NVLink clique when one
// has enough (the clique with the fewest such GPUs that suffices, then the
// lowest indices), else anywhere unless requireClique. cliques are
// positions in c; a node without cliques has each GPU as its own. ok is
// false when no set fits.
func ChooseGPUs(c []Candidate, n int, cliques [][]int, requireClique bool) (pos []int, ok bool) {
	if n < 1 || n > len(c) {
		return nil, false
	}
	cliqueOf := make([]int, len(c))
	for i := range cliqueOf {
		cliqueOf[i] = -1 - i // its own
	}
	for k, cl := range cliques {
		for _, p := range cl {
			if p >= 0 && p < len(c) {
				cliqueOf[p] = k
			}
		}
	}
	sameClique := func(ps []int) bool {
		for _, p := range ps {
			if cliqueOf[p] != cliqueOf[ps[0]] {
				return false
			}
		}
		return true
	}
	byUUID := make(map[string]int, len(c))
	for i := range c {
		byUUID[c[i].UUID] = i
	}
	// An existing group of exactly n GPUs.
	var best []int
	var bestFree int64
	seen := map[string]bool{}
	for i := range c {
		key := c[i].Group
		if key == "" || seen[key] {
			continue
		}
		seen[key] = true
		gpus := GroupGPUs(key)
		if len(gpus) != n {
			continue
		}
		var ps []int
		var free int64
		fits := true
		for _, u := range gpus {
			p, known := byUUID[u]
			if !known || !c[p].Room || c[p].Group != key {
				fits = false
				break
			}
			ps = append(ps, p)
			free += c[p].FreeMiB
		}
		if !fits || (requireClique && n > 1 && !sameClique(ps)) {
			continue
		}
		if best == nil || free < bestFree {
			best, bestFree = ps, free
		}
	}
	if best != nil {
		return sortedByIndex(c, best), true
	}
	// n GPUs serving no slice.
	var empty []int
	for i := range c {
		if c[i].Room && c[i].Group == "" {
			empty = append(empty, i)
		}
	}
	empty = sortedByIndex(c, empty)
	if len(empty) < n {
		return nil, false
	}
	perClique := map[int][]int{}
	var order []int
	for _, p := range empty {
		k := cliqueOf[p]
		if _, ok := perClique[k]; !ok {
			order = append(order, k)
		}
		perClique[k] = append(perClique[k], p)
	}
	var pick []int
	for _, k := range order {
		if ps := perClique[k]; len(ps) >= n && (pick == nil || len(ps) < len(pick)) {
			pick = ps
		}
	}
	if pick != nil {
		return pick[:n], true
	}
	if requireClique && n > 1 {
		return nil, false
	}
	return empty[:n], true
}

func sortedByIndex(c []Candidate, ps []int) []int {
	out := slices.Clone(ps)
	sort.Slice(out, func(i, j int) bool { return c[out[i]].Index < c[out[j]].Index })
	return out
}
