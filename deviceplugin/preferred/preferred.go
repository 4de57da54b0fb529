// Package preferred is the node agent's preferred-allocation policy: which
// devices it asks the kubelet to allocate when the kubelet offers a choice
// (the device plugin API's GetPreferredAllocation). It is pure: it takes the
// topology model and device IDs and returns device IDs.
//
// Whole GPUs are chosen by go-gpuallocator's best-effort policy, run on
// devices built from Tessera's topology model rather than from NVML: every
// GPU pair gets the PCIe P2P link of its common ancestor and, when connected,
// its NVLink count, an NVSwitch fabric counting as that many direct NVLinks
// between every pair on it (go-gpuallocator itself sees no GPU-to-GPU NVLinks
// behind an NVSwitch). When several sets score the same, the one spanning the
// fewest NUMA nodes wins.
//
// Shared units are packed onto as few GPUs as possible, those of the slice
// the kubelet is taken to admit (Admitting) first.
package preferred

import (
	"fmt"
	"math/big"
	"reflect"
	"sort"

	"github.com/NVIDIA/go-gpuallocator/gpuallocator"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/topology"
)

// Values of go-gpuallocator's P2PLinkType (its internal links package, which
// cannot be imported): the PCIe levels, then SingleNVLINKLink .. for 1 ..
// 18 NVLinks. TestLinkTypesMatchGoGPUAllocator pins them to its names.
const (
	linkCrossCPU     = 1
	linkSameCPU      = 2
	linkHostBridge   = 3
	linkMultiSwitch  = 4
	linkSingleSwitch = 5
	linkSameBoard    = 6
	linkOneNVLink    = 7
	maxNVLinks       = 18
)

// maxTieBreakSets bounds the sets the NUMA tie-break enumerates.
const maxTieBreakSets = 20000

// GPUPolicy picks whole GPUs on one node.
type GPUPolicy struct {
	byUUID map[string]*gpuallocator.Device
	numa   map[*gpuallocator.Device]int
	best   gpuallocator.Policy
}

// NewGPUPolicy builds the policy for a topology.
func NewGPUPolicy(t *topology.Topology) (*GPUPolicy, error) {
	p := &GPUPolicy{
		byUUID: map[string]*gpuallocator.Device{},
		numa:   map[*gpuallocator.Device]int{},
		best:   gpuallocator.NewBestEffortPolicy(),
	}
	devs := make([]*gpuallocator.Device, len(t.GPUs))
	for i, g := range t.GPUs {
		d := &gpuallocator.Device{Index: g.Index, Links: map[int][]gpuallocator.P2PLink{}}
		d.UUID = g.UUID
		d.PCI.BusID = g.PCIBusID
		devs[i] = d
		p.byUUID[g.UUID] = d
		p.numa[d] = g.NUMANode
	}
	if len(t.Links) != len(t.GPUs) {
		return nil, fmt.Errorf("topology has %d GPUs but %d rows of links", len(t.GPUs), len(t.Links))
	}
	for i := range t.GPUs {
		if len(t.Links[i]) != len(t.GPUs) {
			return nil, fmt.Errorf("topology links row %d has %d columns, want %d", i, len(t.Links[i]), len(t.GPUs))
		}
		for j := range t.GPUs {
			if i == j {
				continue
			}
			for _, typ := range linkTypes(t.Links[i][j]) {
				devs[i].Links[devs[j].Index] = append(devs[i].Links[devs[j].Index], p2pLink(devs[j], typ))
			}
		}
	}
	return p, nil
}

// linkTypes translates one link of the model into go-gpuallocator's P2P
// links: the PCIe one, and an NVLink one when NVLinked.
func linkTypes(l topology.Link) []uint {
	var out []uint
	switch l.PCIe {
	case "BOARD":
		out = append(out, linkSameBoard)
	case "PIX":
		out = append(out, linkSingleSwitch)
	case "PXB":
		out = append(out, linkMultiSwitch)
	case "PHB":
		out = append(out, linkHostBridge)
	case "NODE":
		out = append(out, linkSameCPU)
	case "SYS":
		out = append(out, linkCrossCPU)
	}
	if l.NVLinked() && l.NVLinks > 0 {
		n := min(l.NVLinks, maxNVLinks)
		out = append(out, uint(linkOneNVLink+n-1))
	}
	return out
}

// p2pLink returns a link to gpu of type t. go-gpuallocator's P2PLinkType
// lives in an internal package and cannot be named here, so the value is
// set through reflection.
func p2pLink(gpu *gpuallocator.Device, t uint) gpuallocator.P2PLink {
	l := gpuallocator.P2PLink{GPU: gpu}
	reflect.ValueOf(&l.Type).Elem().SetUint(uint64(t))
	return l
}

// linkScore is go-gpuallocator's score of one P2P link.
func linkScore(t uint) int {
	if t >= linkOneNVLink {
		return 100 * int(t-linkOneNVLink+1)
	}
	return 10 * int(t)
}

// setScore is go-gpuallocator's score of a set: the sum of its pairs' links.
func setScore(set []*gpuallocator.Device) int {
	s := 0
	for i := range set {
		for j := i + 1; j < len(set); j++ {
			for _, l := range set[i].Links[set[j].Index] {
				s += linkScore(uint(l.Type))
			}
		}
	}
	return s
}

// GPUs returns the preferred size GPU UUIDs out of available, including
// every one of mustInclude, ordered by GPU index. It returns an empty slice
// (and no error) when no such set exists, and an error for IDs that are no
// GPU of this node.
func (p *GPUPolicy) GPUs(available, mustInclude []string, size int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d: must be greater than 0", size)
	}
	avail, err := p.lookup(available)
	if err != nil {
		return nil, fmt.Errorf("available devices: %w", err)
	}
	required, err := p.lookup(mustInclude)
	if err != nil {
		return nil, fmt.Errorf("must-include devices: %w", err)
	}
	inAvail := map[*gpuallocator.Device]bool{}
	for _, d := range avail {
		inAvail[d] = true
	}
	for _, d := range required {
		if !inAvail[d] {
			return []string{}, nil
		}
	}
	sortDevices(avail)
	sortDevices(required)
	best := p.best.Allocate(avail, required, size)
	if len(best) != size {
		return []string{}, nil
	}
	best = p.numaTieBreak(avail, required, best)
	out := make([]string, len(best))
	sortDevices(best)
	for i, d := range best {
		out[i] = d.UUID
	}
	return out, nil
}

func (p *GPUPolicy) lookup(uuids []string) ([]*gpuallocator.Device, error) {
	seen := map[string]bool{}
	out := make([]*gpuallocator.Device, 0, len(uuids))
	for _, u := range uuids {
		d, ok := p.byUUID[u]
		if !ok {
			return nil, fmt.Errorf("%q is no GPU of this node", u)
		}
		if seen[u] {
			continue
		}
		seen[u] = true
		out = append(out, d)
	}
	return out, nil
}

// numaSpan counts the NUMA nodes a set touches; GPUs without a NUMA node
// count as a node of their own each.
func (p *GPUPolicy) numaSpan(set []*gpuallocator.Device) int {
	nodes := map[int]bool{}
	unknown := 0
	for _, d := range set {
		if n := p.numa[d]; n >= 0 {
			nodes[n] = true
		} else {
			unknown++
		}
	}
	return len(nodes) + unknown
}

// numaTieBreak returns, among the sets of the same size out of avail that
// hold required and score exactly as best does, the first (in index order)
// spanning the fewest NUMA nodes; best itself when none spans fewer.
func (p *GPUPolicy) numaTieBreak(avail, required, best []*gpuallocator.Device) []*gpuallocator.Device {
	span := p.numaSpan(best)
	if span <= 1 {
		return best
	}
	size := len(best)
	var rest []*gpuallocator.Device
	isRequired := map[*gpuallocator.Device]bool{}
	for _, d := range required {
		isRequired[d] = true
	}
	for _, d := range avail {
		if !isRequired[d] {
			rest = append(rest, d)
		}
	}
	k := size - len(required)
	if new(big.Int).Binomial(int64(len(rest)), int64(k)).Cmp(big.NewInt(maxTieBreakSets)) > 0 {
		return best
	}
	score := setScore(best)
	chosen, chosenSpan := best, span
	combinations(len(rest), k, func(idx []int) bool {
		set := append([]*gpuallocator.Device{}, required...)
		for _, i := range idx {
			set = append(set, rest[i])
		}
		if s := p.numaSpan(set); s < chosenSpan && setScore(set) == score {
			chosen, chosenSpan = set, s
		}
		return chosenSpan > 1
	})
	return chosen
}

// combinations calls f with every k-subset of 0..n-1 in lexicographic order
// until f returns false.
func combinations(n, k int, f func([]int) bool) {
	if k < 0 || k > n {
		return
	}
	idx := make([]int, k)
	for i := range idx {
		idx[i] = i
	}
	for {
		if !f(idx) {
			return
		}
		i := k - 1
		for i >= 0 && idx[i] == n-k+i {
			i--
		}
		if i < 0 {
			return
		}
		idx[i]++
		for j := i + 1; j < k; j++ {
			idx[j] = idx[j-1] + 1
		}
	}
}

func sortDevices(ds []*gpuallocator.Device) {
	sort.Slice(ds, func(i, j int) bool { return ds[i].Index < ds[j].Index })
}

// Units returns the preferred size units of resource r out of available,
// including every one of mustInclude. The GPUs of mustInclude come first,
// then the others by rank, highest first (the caller ranks the GPUs
// assigned to a slice of the node's pods and those already serving units:
// a unit taken from any other GPU would withhold that GPU from whole use
// while the slice runs, although the slice's assignment serves it
// elsewhere; GPUs rank has not are ranked 0); within each group it
// packs them onto as few GPUs as it can: a GPU that can serve all that is
// still needed (the one with the fewest free units), else the GPU with the
// most free units. It returns an empty slice when available cannot cover
// size.
func Units(r corev1.ResourceName, available, mustInclude []string, size int, rank map[string]int) ([]string, error) {
	if size <= 0 {
		return nil, fmt.Errorf("allocation size %d: must be greater than 0", size)
	}
	type unit struct {
		id string
		n  int
	}
	free := map[string][]unit{} // GPU UUID -> its available units not yet chosen
	isAvail := map[string]bool{}
	for _, id := range available {
		uuid, n, err := devices.ParseDeviceID(r, id)
		if err != nil {
			return nil, fmt.Errorf("available devices: %w", err)
		}
		if isAvail[id] {
			continue
		}
		isAvail[id] = true
		free[uuid] = append(free[uuid], unit{id, n})
	}
	chosen := []string{}
	taken := map[string]bool{}
	pinned := map[string]bool{} // GPUs of mustInclude
	for _, id := range mustInclude {
		uuid, _, err := devices.ParseDeviceID(r, id)
		if err != nil {
			return nil, fmt.Errorf("must-include devices: %w", err)
		}
		if !isAvail[id] {
			return []string{}, nil
		}
		if !taken[id] {
			taken[id] = true
			chosen = append(chosen, id)
			pinned[uuid] = true
		}
	}
	if len(chosen) > size || len(isAvail) < size {
		return []string{}, nil
	}
	for uuid, us := range free {
		kept := us[:0]
		for _, u := range us {
			if !taken[u.id] {
				kept = append(kept, u)
			}
		}
		sort.Slice(kept, func(i, j int) bool { return kept[i].n < kept[j].n })
		free[uuid] = kept
	}
	for need := size - len(chosen); need > 0; need = size - len(chosen) {
		var gpus []string
		for uuid, us := range free {
			if len(us) > 0 {
				gpus = append(gpus, uuid)
			}
		}
		if len(gpus) == 0 {
			return []string{}, nil
		}
		sort.Slice(gpus, func(i, j int) bool {
			a, b := gpus[i], gpus[j]
			if pinned[a] != pinned[b] {
				return pinned[a]
			}
			if rank[a] != rank[b] {
				return rank[a] > rank[b]
			}
			fitA, fitB := len(free[a]) >= need, len(free[b]) >= need
			if fitA != fitB {
				return fitA
			}
			if len(free[a]) != len(free[b]) {
				if fitA {
					return len(free[a]) < len(free[b])
				}
				return len(free[a]) > len(free[b])
			}
			return a < b
		})
		g := gpus[0]
		k := min(need, len(free[g]))
		for _, u := range free[g][:k] {
			chosen = append(chosen, u.id)
		}
		free[g] = free[g][k:]
	}
	return chosen, nil
}
