package extender

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/preempt"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/planner"
	equota "github.com/tessera-gpu/tessera/extender/quota"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/internal/eligible"
)

// ForGang implements planner.TierPreempt for a gang that fits nowhere: the
// planner gives its pending members and fits, which plans the whole gang
// (with its topology: a clique, a node, a rack) on a snapshot of the
// ledger. The gang preempts at the lowest priority of its members, and not
// at all when any member's preemptionPolicy is Never.
//
// Pods already leaving count as gone: when the gang fits once they are
// gone, nothing is evicted and they are returned. Otherwise the victims
// are chosen among the same units a single pod may evict (lower priority,
// MinRuntime, quota and queue rules, budgets' pass-over, the extra members
// of elastic gangs as units of their own), restricted to those with a pod
// on a node some member may run on, by preempt.ChooseAcross: the cheapest
// units until the gang fits, then every unit the fit does not need is
// given back, so that freed GPUs that cannot serve the gang (outside the
// domain it is planned in) are never the reason for an eviction. A victim
// its PodDisruptionBudget protects is passed over and the choice made
// again; when no choice leaves such victims out, with PastBudgets they are
// chosen among the others and deleted past their budgets. ForGang returns
// what it will do, the pods gone once the room is free (those leaving and
// the victims), on which the planner plans the
// gang, and evict: once the gang's plan holds the room in the ledger, the
// planner calls it, and the victims are evicted, with a Preempted Event on
// each and a Preempting Event on each member. Evicting first let a
// victim's replacement (a Deployment's, made at once) be bound into the
// freed room before the plan held it, and the gang preempt again, pass
// after pass (41 pods for a gang of 2 x 4 GPUs on make demo's cluster).
func (p *Preemptor) ForGang(ctx context.Context, members []*corev1.Pod, fits func(planner.Snapshot) bool) (string, map[types.UID]bool, func(context.Context) error, error) {
	c, ok := gangClaimant(members)
	if !ok {
		return "", nil, nil, nil
	}
	if p.fruitless.Current(p.now())[c.unit] {
		return noVictims, nil, nil, nil
	}
	logger := klog.FromContext(ctx)
	pods, err := p.Pods()
	if err != nil {
		return "", nil, nil, fmt.Errorf("listing pods: %w", err)
	}
	qsnap := p.queues()
	pastBudgets := false
	for attempt := 0; attempt < 5; attempt++ {
		victims, gone, ok := p.chooseForGang(c, members, pods, qsnap, fits, pastBudgets)
		switch {
		case !ok && p.mayGoPastBudgets(pastBudgets):
			pastBudgets = true
			continue
		case !ok:
			d := p.FruitlessFor
			if d <= 0 {
				d = 10 * time.Second
			}
			p.fruitless.Add(c.unit, p.now().Add(d))
			return noVictims, nil, nil, nil
		case len(victims) == 0:
			return "", gone, nil, nil // the room is being freed by pods that are leaving
		}
		if !pastBudgets {
			if blocker := p.dryRun(ctx, c, members, victims); blocker != "" {
				logger.V(2).Info("Preemption victim protected by a budget; choosing again", "gang", c.who, "victim", blocker)
				continue
			}
		}
		over := p.overrider(pastBudgets)
		var names []string
		for _, v := range victims {
			names = append(names, fmt.Sprintf("%s (priority %d)", api.KeyName(v.unit.Key), v.unit.Priority))
			for _, pod := range v.pods {
				gone[pod.UID] = true
			}
		}
		msg := "preempting lower tiers: evicting " + listed(names, 8)
		evict := func(ctx context.Context) error {
			err := p.evict(ctx, c, victims, over, func(v *workload) string {
				return fmt.Sprintf("tessera: evicted for %s (priority %d), which needs %s and fits nowhere: %s has priority %d, among the least important whose removal makes room for it",
					c.who, c.prio, equota.Describe(c.req), api.KeyName(v.unit.Key), v.unit.Priority)
			})
			for _, m := range members {
				p.event(m, corev1.EventTypeNormal, api.EventPreempting, "tessera: %s for %s (priority %d)", msg, c.who, c.prio)
			}
			klog.FromContext(ctx).Info("Preempting for a gang", "gang", c.who, "priority", c.prio, "victims", names)
			return err
		}
		return msg, gone, evict, nil
	}
	return "every lower-tier workload that would make room is protected by a PodDisruptionBudget", nil, nil, nil
}

// noVictims is ForGang's answer when no lower-tier workload makes room.
const noVictims = "no lower-tier workload it may preempt makes room"

// gangClaimant is a gang's members as a claimant: false when a member may
// not preempt (no priority, preemptionPolicy Never) or none asks for GPUs.
func gangClaimant(members []*corev1.Pod) (claimant, bool) {
	if len(members) == 0 {
		return claimant{}, false
	}
	unit := planner.UnitOf(members[0])
	c := claimant{who: unit, ns: members[0].Namespace, req: quota.Resources{}, self: map[types.UID]bool{}, unit: unit}
	for i, m := range members {
		if !tierPreempts(m) {
			return claimant{}, false
		}
		if prio := corev1helpers.PodPriority(m); i == 0 || prio < c.prio {
			c.prio = prio
		}
		c.req = c.req.Add(gpureq.QuotaCount(m))
		c.self[m.UID] = true
	}
	return c, len(c.req) > 0
}

// chooseForGang decides the victims for c on the current ledger, the pods
// already leaving (gone) counted as gone: none when c fits once those are
// gone; false when no choice makes it fit.
func (p *Preemptor) chooseForGang(c claimant, members, pods []*corev1.Pod, qsnap *planner.QueueSnapshot, fits func(planner.Snapshot) bool, pastBudgets bool) ([]*workload, map[types.UID]bool, bool) {
	now := p.now()
	gone, running := p.split(pods, now)
	base := without(p.Cache.Snapshot(), gone)
	// Only units with a pod on a node some member may run on: GPUs freed
	// elsewhere cannot serve the gang.
	var allowed []eligible.Pod
	for _, m := range members {
		allowed = append(allowed, eligible.For(m))
	}
	useful := map[string]bool{}
	for name, st := range base {
		for _, a := range allowed {
			if st.Admits(a) {
				useful[name] = true
				break
			}
		}
	}
	units, unitsOf := p.units(c, running, now, qsnap, p.quotaState(c, nil), pastBudgets)
	seen := map[string]bool{}
	var cands []preempt.Unit
	for _, pod := range running {
		if !useful[pod.Spec.NodeName] {
			continue
		}
		for _, k := range unitsOf[pod.UID] {
			if !seen[k] {
				seen[k] = true
				cands = append(cands, units[k].unit)
			}
		}
	}
	sort.Slice(cands, func(i, j int) bool { return cands[i].Key < cands[j].Key })
	chosen, ok := preempt.ChooseAcross(cands, func(victims []preempt.Unit) bool {
		g := map[types.UID]bool{}
		for _, v := range victims {
			for _, pod := range units[v.Key].pods {
				g[pod.UID] = true
			}
		}
		return fits(plannerSnapshot(without(base, g)))
	})
	if !ok {
		return nil, nil, false
	}
	victims := make([]*workload, 0, len(chosen))
	for _, v := range chosen {
		victims = append(victims, units[v.Key])
	}
	return victims, gone, true
}

// listed joins the first n of names, and says how many more there are:
// an Event's message stays short whatever the number of victims (the log
// names them all).
func listed(names []string, n int) string {
	if len(names) <= n {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:n], ", "), len(names)-n)
}
