package jobs

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"time"

	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/queue"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

// StrategyQueues admits whole jobs through hierarchical workload queues
// (allocator/queue, the extender's core): every team is a leaf queue under
// one of QueueConfig.Departments departments, with an equal guarantee,
// weight 1 and no limit. Pending jobs go in State.Order order (priority is
// uniform in the traces, so the teams' shares of decayed usage history
// decide, then age); each starts only if State.Admit allows it and the gang
// planner places it; a job within its team's guarantee that does not fit
// reclaims borrowed jobs through State.Reclaim (evicted whole; an evicted
// job waits again and restarts from zero, as StrategyGang's quota reclaim
// does).
const StrategyQueues Strategy = "queues"

// DefaultQueueTeams is how many teams jobs are spread over for
// StrategyQueues and for the fairness metric when neither QueueConfig.Teams
// nor Config.Teams says.
const DefaultQueueTeams = 4

// QueueConfig sets up StrategyQueues; its teams also define the fairness
// metric of every strategy.
type QueueConfig struct {
	// Teams is the number of leaf queues jobs are spread over by a hash
	// of the job ID (a Job's Team overrides it); 0 takes Config.Teams, or
	// DefaultQueueTeams when that is 0 too. The hash is the one quota
	// uses, so with equal counts a job is in the same team under every
	// strategy.
	Teams int
	// Departments are the parent queues; team i is under dept-(i mod
	// Departments). 0 means 2.
	Departments int
	// GuaranteeFraction: each team guarantees floor(capacity × fraction /
	// teams) GPUs; a department guarantees the sum of its teams'. 0 means
	// 1 (the whole cluster is guaranteed).
	GuaranteeFraction float64
	// HalfLife of the decayed usage history; 0 means 24h, below 0 no
	// decay (a plain sum).
	HalfLife time.Duration
	// HistoryWeight tilts each team's part of what is lent by its recent
	// borrowing (queue.State.HistoryWeight); 0 means
	// queue.DefaultHistoryWeight, below 0 none (by weight alone).
	HistoryWeight float64
}

// DefaultQueueHalfLife is the usage history's default half-life.
const DefaultQueueHalfLife = 24 * time.Hour

func (c QueueConfig) resolved(cfg Config) QueueConfig {
	if c.Teams <= 0 {
		c.Teams = cfg.Teams
		if c.Teams <= 0 {
			c.Teams = DefaultQueueTeams
		}
	}
	if c.Departments <= 0 {
		c.Departments = 2
	}
	if c.GuaranteeFraction == 0 {
		c.GuaranteeFraction = 1
	}
	if c.HalfLife == 0 {
		c.HalfLife = DefaultQueueHalfLife
	}
	if c.HistoryWeight == 0 {
		c.HistoryWeight = queue.DefaultHistoryWeight
	}
	return c
}

func (c QueueConfig) validate() error {
	if c.GuaranteeFraction < 0 || c.GuaranteeFraction > 1 {
		return fmt.Errorf("queue guarantee fraction %v: want 0..1", c.GuaranteeFraction)
	}
	if c.Teams < 0 || c.Departments < 0 {
		return fmt.Errorf("queue teams %d, departments %d: negative", c.Teams, c.Departments)
	}
	return nil
}

// Fairness is how evenly the teams were served while they waited (see
// docs/sim.md, "Queues on the ITP traces"): for each team, the GPU-time it
// received over the GPU-time it was entitled to, both integrated over the
// instants when it had a job waiting; entitlement is the team's
// queue.FairShare of the cluster at that instant (hierarchical
// water-filling of the GPUs over the teams' demand, used + pending, with
// the queues' guarantees and weights).
type Fairness struct {
	// JainIndex is Jain's fairness index over the teams that ever waited
	// of x = received/entitled: (Σx)² / (n·Σx²), 1 when all are equal,
	// 1/n when only one team got anything.
	JainIndex float64 `json:"jainIndex"`
	// MinShareRatio is the smallest x, the worst-served team's.
	MinShareRatio float64     `json:"minShareRatio"`
	Teams         []TeamShare `json:"teams,omitempty"`
}

// TeamShare is one team's fairness accounting.
type TeamShare struct {
	Team string `json:"team"`
	// WaitingHours is how long the team had a job waiting.
	WaitingHours float64 `json:"waitingHours"`
	// ReceivedGPUHours and EntitledGPUHours are integrated over those
	// hours; Ratio is their quotient.
	ReceivedGPUHours float64 `json:"receivedGPUHours"`
	EntitledGPUHours float64 `json:"entitledGPUHours"`
	Ratio            float64 `json:"ratio"`
	// UsedGPUHours is everything the team ran, waiting or not.
	UsedGPUHours float64 `json:"usedGPUHours"`
}

// Jain returns Jain's fairness index of xs, (Σx)²/(n·Σx²): 1 when all are
// equal (all zero included), 1/n when one is positive and the rest 0; 1
// for no values.
func Jain(xs []float64) float64 {
	if len(xs) == 0 {
		return 1
	}
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// queueSim is the queue books every strategy keeps (for fairness) and
// StrategyQueues schedules by.
type queueSim struct {
	cfg      QueueConfig
	teams    []string
	tree     *queue.Tree
	capacity int64
	used     map[string]int64 // GPUs of running jobs
	pending  map[string]int64 // GPUs of waiting jobs (not running)
	// waiting counts each team's waiting jobs by their GPUs: State.Waiting
	// lists one entry per job.
	waiting   map[string]map[int]int
	guarantee int64
	// afterEvict, when set (tests), sees every eviction once the books
	// are updated.
	afterEvict  func(j *jobState)
	afterFinish func(j *jobState)
	usage       map[string]queue.Usage
	// fair is each waiting team's fair share since the last schedule.
	fair     map[string]int64
	recv     map[string]float64 // GPU-seconds while waiting
	ent      map[string]float64
	waitSec  map[string]float64
	usedArea map[string]float64
}

func (s *sim) initQueues() {
	qc := s.cfg.Queues.resolved(s.cfg)
	q := &queueSim{cfg: qc, capacity: int64(s.cfg.Nodes * s.cfg.GPUsPerNode),
		used: map[string]int64{}, pending: map[string]int64{}, waiting: map[string]map[int]int{}, usage: map[string]queue.Usage{}, fair: map[string]int64{},
		recv: map[string]float64{}, ent: map[string]float64{}, waitSec: map[string]float64{}, usedArea: map[string]float64{}}
	guar := int64(math.Floor(float64(q.capacity) * qc.GuaranteeFraction / float64(qc.Teams)))
	q.guarantee = guar
	depts := make([]queue.Spec, qc.Departments)
	for d := range depts {
		depts[d] = queue.Spec{Name: fmt.Sprintf("dept-%d", d), Guaranteed: quota.Resources{api.ResourceGPU: 0}}
	}
	var specs []queue.Spec
	for t := 0; t < qc.Teams; t++ {
		name := teamName(t)
		q.teams = append(q.teams, name)
		d := t % qc.Departments
		specs = append(specs, queue.Spec{Name: name, Parent: depts[d].Name, Namespaces: []string{name}, Guaranteed: quota.Resources{api.ResourceGPU: guar}})
		depts[d].Guaranteed[api.ResourceGPU] += guar
	}
	q.tree = queue.Build(append(depts, specs...))
	s.q = q
}

// fairTeam is j's team for StrategyQueues and the fairness metric.
func (s *sim) fairTeam(j Job) string {
	if j.Team != "" {
		return j.Team
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(j.ID))
	return teamName(int(h.Sum32() % uint32(s.q.cfg.Teams)))
}

// The books: a job's GPUs are pending from arrival until they run (an
// elastic gang's pods that do not run yet stay pending: demand), used
// while they run, pending again when evicted or taken back (resized).
// Waiting counts the jobs that wait to start, by the GPUs they start with.
func (s *sim) queueArrive(j *jobState) {
	s.q.pending[j.fteam] += int64(j.job.GPUs)
	s.addWaiting(j, 1)
}
func (s *sim) queueStart(j *jobState) {
	s.q.pending[j.fteam] -= int64(j.gpusNow())
	s.q.used[j.fteam] += int64(j.gpusNow())
	s.addWaiting(j, -1)
}

// queueFinish books j's end, before its pods are released.
func (s *sim) queueFinish(j *jobState) {
	s.q.used[j.fteam] -= int64(j.gpusNow())
	s.q.pending[j.fteam] -= int64(j.job.GPUs - j.gpusNow())
	if s.q.afterFinish != nil {
		s.q.afterFinish(j)
	}
}

// queueEvict books j's eviction, before its pods are released.
func (s *sim) queueEvict(j *jobState) {
	s.q.used[j.fteam] -= int64(j.gpusNow())
	s.q.pending[j.fteam] += int64(j.gpusNow())
	s.addWaiting(j, 1)
	if s.q.afterEvict != nil {
		s.q.afterEvict(j)
	}
}

func (s *sim) addWaiting(j *jobState, sign int) {
	w := s.q.waiting[j.fteam]
	if w == nil {
		w = map[int]int{}
		s.q.waiting[j.fteam] = w
	}
	g := j.startGPUs()
	if w[g] += sign; w[g] == 0 {
		delete(w, g)
	}
}

// state is the queue.State of the books now, as the extender's snapshot
// has it (extender/queue.go): every waiting job's GPUs in its team's
// Pending (fair share counts them all), and in Waiting its waiting jobs,
// one entry each, so that Admit's lending check protects, of a team's
// unmet guarantee, only the waiting jobs that could start within it.
//
// Waiting lists a team's jobs smallest first and stops at the first that
// would not fit in what its guarantee leaves beyond its use: Admit takes
// them in that order and, for one resource, stops there too
// (allocator/queue startableWithin), so the answers are the same as with
// every waiting job listed, and a pass does not sort thousands of jobs
// for each Admit on the long queues of cluster04 and cluster07.
func (s *sim) state() *queue.State {
	q := s.q
	st := s.books()
	st.Waiting = map[string][]quota.Resources{}
	for _, t := range q.teams {
		sizes := make([]int, 0, len(q.waiting[t]))
		for g := range q.waiting[t] {
			sizes = append(sizes, g)
		}
		sort.Ints(sizes)
		room := max(q.guarantee-q.used[t], 0)
		ws := []quota.Resources{}
	fill:
		for _, g := range sizes {
			for range q.waiting[t][g] {
				if int64(g) > room {
					break fill
				}
				room -= int64(g)
				ws = append(ws, gpuRes(g))
			}
		}
		st.Waiting[t] = ws
	}
	return st
}

// books is the queue.State of the books without Waiting: what FairShare
// and Order read.
func (s *sim) books() *queue.State {
	q := s.q
	st := &queue.State{Tree: q.tree, Capacity: quota.Resources{api.ResourceGPU: q.capacity}, Used: map[string]quota.Resources{},
		Pending: map[string]quota.Resources{}, Usage: map[string]queue.Usage{}, HalfLife: q.cfg.HalfLife,
		HistoryWeight: max(q.cfg.HistoryWeight, 0)}
	for _, t := range q.teams {
		st.Used[t] = quota.Resources{api.ResourceGPU: q.used[t]}
		st.Pending[t] = quota.Resources{api.ResourceGPU: q.pending[t]}
		if u, ok := q.usage[t]; ok {
			st.Usage[t] = u
		}
	}
	return st
}

// observeQueues records, after a schedule, each waiting team's fair share
// until the next event.
func (s *sim) observeQueues() {
	q := s.q
	waiting := false
	for _, t := range q.teams {
		if q.pending[t] > 0 {
			waiting = true
		}
	}
	clear(q.fair)
	if !waiting {
		return
	}
	// Entitlement is by guarantees and weights alone: the history's tilt
	// is how the queues strategy pays a team back over time, so the
	// metric that judges it must not move with it.
	books := s.books()
	books.HistoryWeight = 0
	fs := books.FairShare()
	for _, t := range q.teams {
		if q.pending[t] > 0 {
			q.fair[t] = fs[t][api.ResourceGPU]
		}
	}
}

// accrueQueues integrates dt seconds of the state since the last schedule:
// fairness for every strategy, usage history for StrategyQueues.
func (s *sim) accrueQueues(dt int64) {
	if dt <= 0 {
		return
	}
	q := s.q
	for _, t := range q.teams {
		u := float64(q.used[t])
		q.usedArea[t] += u * float64(dt)
		if q.pending[t] > 0 {
			q.waitSec[t] += float64(dt)
			q.recv[t] += u * float64(dt)
			q.ent[t] += float64(q.fair[t]) * float64(dt)
		}
		if s.cfg.Strategy == StrategyQueues {
			q.usage[t] = queue.Accrue(q.usage[t], quota.Resources{api.ResourceGPU: q.used[t]}, time.Duration(dt)*time.Second, q.cfg.HalfLife)
		}
	}
}

func (s *sim) fairnessResult() Fairness {
	q := s.q
	var f Fairness
	var xs []float64
	f.MinShareRatio = math.Inf(1)
	for _, t := range q.teams {
		ts := TeamShare{Team: t, WaitingHours: q.waitSec[t] / 3600, ReceivedGPUHours: q.recv[t] / 3600, EntitledGPUHours: q.ent[t] / 3600, UsedGPUHours: q.usedArea[t] / 3600}
		if q.ent[t] > 0 {
			ts.Ratio = q.recv[t] / q.ent[t]
			xs = append(xs, ts.Ratio)
			f.MinShareRatio = math.Min(f.MinShareRatio, ts.Ratio)
		}
		f.Teams = append(f.Teams, ts)
	}
	if len(xs) == 0 {
		f.MinShareRatio = 1
	}
	f.JainIndex = Jain(xs)
	return f
}

// scheduleQueues is one pass of StrategyQueues: the waiting jobs in
// State.Order order, each admitted by State.Admit and placed by the gang
// planner, reclaiming for a job within its team's guarantee.
func (s *sim) scheduleQueues() error {
	s.noRoom = map[string]bool{}
	ws := make([]queue.Workload, len(s.queue))
	byKey := make(map[string]*jobState, len(s.queue))
	for i, j := range s.queue {
		// The key breaks ties of equal submission seconds by arrival.
		key := fmt.Sprintf("%s/%09d", j.fteam, j.order)
		ws[i] = queue.Workload{Key: key, Queue: j.fteam, Created: unix(j.job.Submit), Uses: gpuRes(j.startGPUs()), Preemptible: true}
		byKey[key] = j
	}
	st := s.state()
	st.Order(ws)
	// Admit answers depend only on the books, and reclaim failures only on
	// them and the cluster: remembered until something starts or stops.
	type ask struct {
		team string
		gpus int
	}
	admitted := map[ask]queue.Decision{}
	noReclaim := map[string]bool{}
	started := map[*jobState]bool{}
	for _, w := range ws {
		j := byKey[w.Key]
		k := ask{j.fteam, j.startGPUs()}
		d, ok := admitted[k]
		if !ok {
			d = st.Admit(j.fteam, w.Uses)
			admitted[k] = d
		}
		if !d.Allowed {
			continue
		}
		var plan *gang.Plan
		err := error(&gang.Error{Kind: gang.ErrNoRoom})
		key := j.shapeKey(false)
		if !s.noRoom[key] {
			plan, err = gang.PlanGroup(s.group(j), s.nodes, s.policy)
			if errors.Is(err, gang.ErrNoRoom) {
				s.noRoom[key] = true
			}
		}
		rkey := j.fteam + " " + key
		if errors.Is(err, gang.ErrNoRoom) && !d.Borrowing && s.now-j.job.Submit >= s.cfg.ReclaimAfter && !noReclaim[rkey] {
			plan, err = s.queueReclaim(st, j, w.Uses)
			if plan == nil && err == nil {
				noReclaim[rkey] = true
			}
		}
		if errors.Is(err, gang.ErrNoRoom) || (err == nil && plan == nil) {
			continue
		}
		if err != nil {
			return err
		}
		s.apply(j, plan)
		s.startJob(j)
		started[j] = true
		st = s.state()
		clear(admitted)
		clear(noReclaim)
	}
	kept := s.queue[:0]
	for _, j := range s.queue {
		if !started[j] {
			kept = append(kept, j)
		}
	}
	s.queue = kept
	s.requeueEvicted()
	// Elastic gangs grow into what is left, each pod admitted like work.
	return s.growElastic(s.nodes, func(j *jobState, gpus int) bool {
		return s.state().Admit(j.fteam, gpuRes(gpus)).Allowed
	})
}

// queueReclaim evicts borrowed jobs whole, or takes back their elastic
// gangs' extra pods, chosen by State.Reclaim, so that j fits; it returns
// j's plan on the freed cluster, or (nil, nil) when reclaim cannot help.
func (s *sim) queueReclaim(st *queue.State, j *jobState, req quota.Resources) (*gang.Plan, error) {
	var running []queue.Workload
	byKey := map[string]victim{}
	for _, c := range s.running {
		r := c.job
		key := fmt.Sprintf("%s/%09d", r.fteam, r.order)
		running = append(running, queue.Workload{Key: key, Queue: r.fteam, Created: unix(r.start), Uses: gpuRes(r.gpusNow()), Preemptible: true})
		byKey[key] = victim{r, -1}
		for _, e := range r.extras() {
			ek := fmt.Sprintf("%s member %d", key, e.k)
			running = append(running, queue.Workload{Key: ek, Queue: r.fteam, Created: unix(r.podStart[e.k]), Uses: gpuRes(r.extraUses(e.k)), Preemptible: true, Extra: true})
			byKey[ek] = e
		}
	}
	of := func(ws []queue.Workload) []victim {
		out := make([]victim, len(ws))
		for i, w := range ws {
			out[i] = byKey[w.Key]
		}
		return out
	}
	// The heap's order is not stable across pushes; Reclaim sorts, but
	// equal candidates keep input order, so give it a stable one.
	sort.Slice(running, func(a, b int) bool { return running[a].Key < running[b].Key })
	victims, err := st.Reclaim(j.fteam, req, running, func(v []queue.Workload) bool { return s.fitsWithout(j, of(v)) })
	var re *queue.ReclaimError
	if errors.As(err, &re) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return s.reclaimWith(j, of(victims))
}

func gpuRes(n int) quota.Resources { return quota.Resources{api.ResourceGPU: int64(n)} }
