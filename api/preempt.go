package api

// Events of Tessera's priority preemption (extender.Preemptor).
const (
	// EventPreempting: on the pod that needs room, naming the victims, the
	// node and how long the room is held for it.
	EventPreempting = "Preempting"
	// EventPreempted: on each evicted pod, naming the pod it was evicted
	// for and why it was chosen.
	EventPreempted = "Preempted"
	// EventPreemptionBlocked: a chosen victim could not be evicted (a
	// PodDisruptionBudget refused it); another choice is made without it.
	EventPreemptionBlocked = "PreemptionBlocked"
	// EventPreemptionExpired: the room freed for a pod was held until its
	// plan expired without the pod binding there; the hold is released.
	EventPreemptionExpired = "PreemptionExpired"
	// EventReserved: on a workload's pods, that nodes are reserved for it
	// after it waited too long (extender reservations), which and until
	// when.
	EventReserved = "Reserved"
	// EventBackfilled: on a workload's pods, that they were planned on
	// nodes reserved for another workload (by their expected run time, or
	// as preemptible pods), and on what terms.
	EventBackfilled = "Backfilled"
)

// ExtraMemberEvicted is added to the Preempted or Reclaimed Event of a pod
// evicted as an elastic gang's member beyond its minimum (ExtraMemberKey).
const ExtraMemberEvicted = "this pod is a member of its elastic gang beyond the gang's minimum, and the gang keeps running"
