package reserve

import "time"

// Estimate-based backfill (EASY backfill with run-time estimates).
//
// A workload may declare how long it expects to run (the
// tessera.dev/expected-runtime annotation; in the simulator, the trace's
// duration under an estimate model). The estimates of the running work
// give each node the time it drains by, and a reservation the time its
// job starts (Start). A job that does not fit outside the reservations may
// start on held GPUs when, by its own estimate, it ends before the
// reservation starts (Admit: Backfilled). The estimate is only a hint: a
// backfilled job still running past its estimate when the reservation can
// otherwise start is a victim (Victims), so an estimate that is too short
// only hurts the job that declared it. Jobs without an estimate start on
// held GPUs only as preemptible backfill (Policy.Preemptible).

// Admission is how a job may start on a reservation's held GPUs.
type Admission int

// Admissions.
const (
	// Refused: the job may not start on held GPUs.
	Refused Admission = iota
	// Backfilled: the job ends, by its estimate, before the reservation
	// starts; it is evicted only if it runs past its estimate.
	Backfilled
	// AsPreemptible: the job starts preemptible and is evicted when the
	// reservation fills.
	AsPreemptible
)

func (a Admission) String() string {
	switch a {
	case Backfilled:
		return "backfilled"
	case AsPreemptible:
		return "preemptible"
	}
	return "refused"
}

// Runtime is a job's declared expected run time; Known is false when it
// declared none.
type Runtime struct {
	Known    bool
	Duration time.Duration
}

// Expect is a declared run time of d.
func Expect(d time.Duration) Runtime { return Runtime{Known: true, Duration: d} }

// Window is when a reservation's job starts by the estimates of the work
// that must drain first: In from now; Known is false when some of that
// work declared no run time (then the start is unknown and no job is
// backfilled by estimate).
type Window struct {
	Known bool
	In    time.Duration
}

// drainsIn is when n's work that must finish before a reservation can have
// it ends by its estimates: every occupant but preemptible backfill
// (evicted instead); an occupant past its estimate counts as ending now.
// known is false when an occupant that must finish declared no run time.
func (n Node) drainsIn() (in time.Duration, known bool) {
	for _, o := range n.Occupants {
		if o.Preemptible {
			continue
		}
		if !o.Remaining.Known {
			return 0, false
		}
		in = max(in, o.Remaining.Duration)
	}
	return in, true
}

// Start is the window of a reservation holding nodes held (one pod a
// node): it starts once the last of them has drained.
func Start(held []Node) Window {
	w := Window{Known: true}
	for _, n := range held {
		in, ok := n.drainsIn()
		if !ok {
			return Window{}
		}
		w.In = max(w.In, in)
	}
	return w
}

// Admit decides whether a job that declared run time rt may start on the
// GPUs of a reservation that starts in w: backfilled when it ends by its
// estimate no later than the reservation starts (EASY backfill);
// otherwise preemptible when the policy allows that; otherwise refused.
func (p Policy) Admit(rt Runtime, w Window) Admission {
	if p.Estimates && rt.Known && w.Known && rt.Duration <= w.In {
		return Backfilled
	}
	if p.Preemptible {
		return AsPreemptible
	}
	return Refused
}

// AdmitNew is Admit for a job not placed yet that asks to start on the
// held GPUs now (a scheduler's filter, a planner's pass): a reservation
// that can start now (w.Known, w.In 0: only preemptible backfill is left
// on its nodes) admits no new preemptible job, which would be evicted as
// soon as it started. On make demo's cluster a Deployment's preemptible
// replacements were sent to a reserved node that could start, evicted
// there, replaced, 29 times in a minute, while the gang waited. Admit
// still classifies a job already started inside (the simulator starts a
// reservation that can start in the pass that finds it so).
func (p Policy) AdmitNew(rt Runtime, w Window) Admission {
	a := p.Admit(rt, w)
	if a == AsPreemptible && w.Known && w.In <= 0 {
		return Refused
	}
	return a
}
