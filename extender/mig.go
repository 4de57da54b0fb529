package extender

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/tessera-gpu/tessera/api"
)

// MIGInstance is one MIG instance of a node, as its inventory lists it.
type MIGInstance struct {
	UUID    string
	Profile string
	// GPU is the position of its GPU in NodeInfo.GPUs.
	GPU     int
	Healthy bool
}

// migInstances lists the MIG instances of a node's inventory GPUs (gpus[i]
// is GPUs[i] of the info being built), with the health of their GPU.
func migInstances(inv []api.InventoryGPU) []MIGInstance {
	var out []MIGInstance
	for i, g := range inv {
		if g.MIG == nil {
			continue
		}
		for _, in := range g.MIG.Instances {
			out = append(out, MIGInstance{UUID: in.UUID, Profile: in.Profile, GPU: i, Healthy: in.Healthy && g.Healthy})
		}
	}
	return out
}

// migState is what a node has of each MIG profile: healthy instances, those
// pods hold (recorded by the node agent), and those held by pods whose
// instances are not recorded yet (the kubelet picks them).
type migState struct {
	healthy map[string]int
	used    map[string]int
	pending map[string]int
	// held are the instances recorded on pods, by UUID.
	held map[string]bool
}

// holds reports whether a pod counted on the node holds instance uuid.
func (m *migState) holds(uuid string) bool { return m != nil && m.held[uuid] }

// migInstance returns the node's MIG instance uuid (nil when unknown).
func (n *NodeInfo) migInstance(uuid string) *MIGInstance {
	for i := range n.MIG {
		if n.MIG[i].UUID == uuid {
			return &n.MIG[i]
		}
	}
	return nil
}

// free is the number of instances of profile a new pod can get.
func (m *migState) free(profile string) int {
	if m == nil {
		return 0
	}
	return max(0, m.healthy[profile]-m.used[profile]-m.pending[profile])
}

// buildMIG counts the node's MIG instances and their use.
func (s *NodeState) buildMIG() {
	info := s.Info
	if len(info.MIG) == 0 && !s.anyMIGUse() {
		return
	}
	m := &migState{healthy: map[string]int{}, used: map[string]int{}, pending: map[string]int{}, held: map[string]bool{}}
	byUUID := make(map[string]*MIGInstance, len(info.MIG))
	for i := range info.MIG {
		in := &info.MIG[i]
		byUUID[in.UUID] = in
		if in.Healthy {
			m.healthy[in.Profile]++
		}
	}
	for _, u := range s.Pods {
		for _, uuid := range u.MIG {
			if in, ok := byUUID[uuid]; ok {
				m.held[uuid] = true
				if in.Healthy {
					m.used[in.Profile]++
				}
			}
		}
		for profile, n := range u.MIGPending {
			m.pending[profile] += n
		}
	}
	s.mig = m
}

func (s *NodeState) anyMIGUse() bool {
	for _, u := range s.Pods {
		if len(u.MIG) > 0 || len(u.MIGPending) > 0 {
			return true
		}
	}
	return false
}

// checkMIG is the fit of a MIG demand: the node has MIG instances and, of
// every profile d asks, that many free. It returns the first profile short
// of instances, in name order ("" when d fits).
func (s *NodeState) checkMIG(d *Demand) (Reason, string) {
	if len(s.Info.MIG) == 0 {
		return NoMIG, ""
	}
	for _, p := range sortedProfiles(d.MIG) {
		if s.mig.healthy[p] < d.MIG[p] {
			return NoMIGProfile, p
		}
		if s.mig.free(p) < d.MIG[p] {
			return InsufficientMIG, p
		}
	}
	return Fits, ""
}

// migScore scores a node for MIG demand d: the fewer instances of the
// asked profiles are left free after the pod, the higher (binpacking keeps
// other nodes' instances, and whole MIG GPUs, for later pods).
func (s *NodeState) migScore(d *Demand) float64 {
	left := 0
	for p, n := range d.MIG {
		left += s.mig.free(p) - n
	}
	return -float64(left)
}

// explainMIG renders a MIG rejection.
func explainMIG(r Reason, st *NodeState, d *Demand) string {
	if st == nil {
		return "does not fit"
	}
	_, p := st.checkMIG(d)
	switch r {
	case NoMIG:
		return "node has no GPU in MIG mode"
	case NoMIGProfile:
		return fmt.Sprintf("node has fewer than %d healthy %s instances", d.MIG[p], api.MIGResource(p))
	case InsufficientMIG:
		return fmt.Sprintf("fewer than %d %s instances free (%d free; instances of pods the node agent has not recorded yet count as used)", d.MIG[p], api.MIGResource(p), st.mig.free(p))
	}
	return "does not fit"
}

func sortedProfiles(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for p := range m {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// migKey renders a MIG demand for the memo key.
func migKey(m map[string]int) string {
	var b strings.Builder
	for _, p := range sortedProfiles(m) {
		fmt.Fprintf(&b, "/mig:%s=%d", p, m[p])
	}
	return b.String()
}

// migAdmit is the gang planner's MIG rule for the node (gang.Node.Admit):
// the members it would put on the node, demands[i] for member i, must find
// as many free instances of each profile together. nil when no member asks
// for MIG.
func (s *NodeState) migAdmit(demands []Demand) func(members []int) bool {
	if !slices.ContainsFunc(demands, func(d Demand) bool { return len(d.MIG) > 0 }) {
		return nil
	}
	return func(members []int) bool {
		want := map[string]int{}
		for _, m := range members {
			for p, n := range demands[m].MIG {
				want[p] += n
			}
		}
		for p, n := range want {
			if s.mig.free(p) < n {
				return false
			}
		}
		return true
	}
}

// allOf admits what every non-nil rule admits (nil when all are nil).
func allOf(rules ...func([]int) bool) func([]int) bool {
	var set []func([]int) bool
	for _, r := range rules {
		if r != nil {
			set = append(set, r)
		}
	}
	if len(set) == 0 {
		return nil
	}
	return func(members []int) bool {
		for _, r := range set {
			if !r(members) {
				return false
			}
		}
		return true
	}
}
