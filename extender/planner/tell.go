package planner

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	equota "github.com/tessera-gpu/tessera/extender/quota"
)

// waitState is why a workload waits, and which of its pods were told.
type waitState struct {
	reason string
	// moving marks a reason whose numbers move with the cluster's use (a
	// queue's refusal); shape is reason with its numbers masked
	// (reasonShape); at is when it was first told.
	moving bool
	shape  string
	at     time.Time
	told   map[types.UID]bool
}

// RetellAfter is how long a waiting workload is not told a queue's refusal
// again that differs from the last one told only in its numbers (the
// queues' use moves with every pod that starts or ends: told on every
// pass, a gang waiting for its queue got twenty Events in a second). Other
// reasons are told as soon as they change ("7 of 8 members exist" after
// "6 of 8" is news).
const RetellAfter = 30 * time.Second

// reasonShape is reason with every run of digits replaced by "#".
func reasonShape(reason string) string {
	var b strings.Builder
	digits := false
	for _, r := range reason {
		isDigit := r >= '0' && r <= '9'
		switch {
		case isDigit && !digits:
			b.WriteByte('#')
		case !isDigit:
			b.WriteRune(r)
		}
		digits = isDigit
	}
	return b.String()
}

// The topics of what a waiting workload is told, each with its own last
// reason.
const (
	topicWait     = "wait"     // why it waits
	topicReserved = "reserved" // its reservation
	topicBackfill = "backfill" // that it backfills a reservation
	topicExtra    = "extra"    // an elastic gang's member beyond its minimum, before the gang starts
)

// untold records that workload key is told reason about topic and returns
// the pods not told that reason yet (all of them when the reason
// changed), so that each pod gets one Event per reason, members that come
// later too. What a workload was told is forgotten once it is planned or
// gone.
func (p *GangPlanner) untold(key, topic, reason string, pods []*corev1.Pod) []*corev1.Pod {
	return p.tell(key, topic, reason, false, pods)
}

// tell is untold; a moving reason (a queue's refusal, whose numbers move
// with the cluster's use) that differs from the moving reason told last
// only in its numbers counts as changed once RetellAfter has passed.
func (p *GangPlanner) tell(key, topic, reason string, moving bool, pods []*corev1.Pod) []*corev1.Pod {
	topics := p.waiting[key]
	if topics == nil {
		topics = map[string]*waitState{}
		p.waiting[key] = topics
	}
	now := p.now()
	w := topics[topic]
	same := w != nil && (w.reason == reason || moving && w.moving && reasonShape(reason) == w.shape && now.Sub(w.at) < RetellAfter)
	if !same {
		w = &waitState{reason: reason, moving: moving, shape: reasonShape(reason), at: now, told: map[types.UID]bool{}}
		topics[topic] = w
	}
	var out []*corev1.Pod
	for _, m := range pods {
		if !w.told[m.UID] {
			w.told[m.UID] = true
			out = append(out, m)
		}
	}
	if p.events == nil {
		return nil
	}
	return out
}

// wait records that gang key waits for reason, with a GangWaiting Event
// on each of pods not told yet.
func (p *GangPlanner) wait(key string, pods []*corev1.Pod, reason string) {
	for _, m := range p.untold(key, topicWait, reason, pods) {
		p.events.Eventf(m, corev1.EventTypeNormal, waitingReason(m), "tessera: %s", reason)
	}
}

// waitQuota is wait for a quota refusal, with a QuotaExceeded Event too.
// reason is quota's message, which begins with equota.RefusalPrefix
// ("tessera: quota: "): both Events give it as it is (the waiting one
// read "tessera: tessera: quota: ...").
func (p *GangPlanner) waitQuota(key string, pods []*corev1.Pod, reason string) {
	for _, m := range p.untold(key, topicWait, reason, pods) {
		p.events.Eventf(m, corev1.EventTypeWarning, api.EventQuotaExceeded, "%s", reason)
		p.events.Eventf(m, corev1.EventTypeNormal, waitingReason(m), "%s", reason)
	}
}

// waitingReason is the reason of the Event that says why pod waits:
// GangWaiting for a member of a gang (a malformed one included), and
// QueueWaiting for a pod outside any gang, which the planner holds as its
// queue's.
func waitingReason(pod *corev1.Pod) string {
	if _, inGang, _ := api.GangOf(pod); !inGang {
		return api.EventQueueWaiting
	}
	return "GangWaiting"
}

// admittedWhy says on what terms queue q admitted want (before it is
// counted).
func (p *GangPlanner) admittedWhy(q string, want quota.Resources) string {
	if p.qsnap == nil {
		return ""
	}
	st := p.qsnap.State
	return fmt.Sprintf("it uses %s, guaranteed %s, fair share %s", equota.Describe(st.Used[q]), equota.Describe(p.guaranteed(q)), equota.Describe(st.FairShare()[q]))
}

func (p *GangPlanner) guaranteed(q string) quota.Resources {
	sp, _ := p.qsnap.State.Tree.Spec(q)
	return sp.Guaranteed
}

// waitQueue records a queue's refusal, with a QueueWaiting Event on each
// of pods not told yet.
func (p *GangPlanner) waitQueue(key string, pods []*corev1.Pod, reason string) {
	for _, m := range p.tell(key, topicWait, reason, true, pods) {
		p.events.Eventf(m, corev1.EventTypeNormal, api.EventQueueWaiting, "tessera: %s", reason)
	}
}
