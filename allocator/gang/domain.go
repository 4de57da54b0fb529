package gang

import (
	"fmt"
	"sort"

	"github.com/tessera-gpu/tessera/allocator"
)

// domain is a set of nodes the whole group may be planned in.
type domain struct {
	level, value string
	nodes        []int // indices into the planner's nodes
	freeWhole    int
	freeMilli    int64
}

func (d domain) describe() string {
	if d.level == "" {
		return "the whole cluster"
	}
	return fmt.Sprintf("%s=%s", d.level, d.value)
}

// domains lists where to try the group, in order: the domains of each level,
// lowest level first and, within a level, the tightest (least free GPU)
// first; then the whole cluster unless a level is required. Nodes without a
// level's label belong to no domain of that level.
func domains(nodes []Node, levels []Level) []domain {
	var out []domain
	for _, l := range levels {
		byValue := map[string]*domain{}
		for i, n := range nodes {
			v, ok := n.Labels[l.Key]
			if !ok {
				continue
			}
			d := byValue[v]
			if d == nil {
				d = &domain{level: l.Key, value: v}
				byValue[v] = d
			}
			d.add(i, n.Node)
		}
		level := make([]domain, 0, len(byValue))
		for _, d := range byValue {
			level = append(level, *d)
		}
		sort.Slice(level, func(a, b int) bool {
			if level[a].freeMilli != level[b].freeMilli {
				return level[a].freeMilli < level[b].freeMilli
			}
			return level[a].value < level[b].value
		})
		out = append(out, level...)
		if l.Required {
			return out
		}
	}
	all := domain{}
	for i, n := range nodes {
		all.add(i, n.Node)
	}
	return append(out, all)
}

func (d *domain) add(i int, n *allocator.Node) {
	d.nodes = append(d.nodes, i)
	d.freeWhole += n.FullyFreeGPUs()
	d.freeMilli += n.GPUMilliFree()
}
