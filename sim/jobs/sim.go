package jobs

import (
	"container/heap"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"time"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/allocator/gang"
	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/allocator/reserve"
	"github.com/tessera-gpu/tessera/api"
)

// Strategy is how jobs are scheduled.
type Strategy string

// Strategies.
const (
	// StrategyGang is Tessera: a job starts when its whole group can be
	// planned; smaller jobs backfill around a blocked one, and once it has
	// waited MaxBackfillWait nodes are held for it as they drain; with
	// Teams > 0, ElasticQuota admission and reclaim apply.
	StrategyGang Strategy = "gang"
	// StrategyNoGang places pods one by one as they fit, as a scheduler
	// without gang support does: a multi-node job holds what it got while
	// its other pods wait.
	StrategyNoGang Strategy = "nogang"
	// StrategyFIFO starts whole jobs in strict arrival order: nothing
	// passes a job that does not fit.
	StrategyFIFO Strategy = "fifo"
)

// Strategies lists every strategy.
func Strategies() []Strategy {
	return []Strategy{StrategyGang, StrategyNoGang, StrategyFIFO, StrategyQueues, StrategyReserve}
}

// Config sets up a replay.
type Config struct {
	Strategy    Strategy
	Nodes       int
	GPUsPerNode int
	// Policy is the allocator policy that picks nodes.
	Policy string
	// Teams spreads jobs over this many namespaces (by a hash of the job
	// ID), each with an ElasticQuota of min = capacity/Teams and max =
	// capacity. 0 turns quota off. Only StrategyGang enforces quota.
	Teams int
	// MaxBackfillWait (seconds): once the oldest blocked job has waited
	// this long, StrategyGang holds nodes for it as they drain, so large
	// gangs are not starved by a stream of small ones. 0 means never.
	MaxBackfillWait int64
	// ReclaimAfter (seconds): a job within its team's min waits this long
	// for room before borrowed jobs are evicted for it, so short waits do
	// not cost other teams their work.
	ReclaimAfter int64
	// SampleEvery (seconds) is the period of the utilisation series.
	SampleEvery int64
	// Queues sets up StrategyQueues and the teams of the fairness metric
	// (queues.go).
	Queues QueueConfig
	// Reserve is StrategyReserve's reservation policy (reserve.go).
	Reserve reserve.Policy
	// Estimates is the run time each job declares (estimate.go), used by
	// StrategyReserve when Reserve.Estimates is set.
	Estimates Estimates
	// ConsolidateMovesPerMinute turns consolidation on in StrategyReserve
	// (consolidate.go): at most this many jobs moved per minute; 0: off.
	ConsolidateMovesPerMinute int
	// ElasticMin makes every job of several pods that the trace gives no
	// min_gpu an elastic gang (elastic.go) whose minimum is this fraction
	// of its pods, rounded up; 0: such jobs are rigid.
	ElasticMin float64
}

// DefaultConfig is an 8-GPU-node cluster scheduled by Tessera.
func DefaultConfig() Config {
	return Config{Strategy: StrategyGang, Nodes: 32, GPUsPerNode: 8, Policy: allocator.PolicyBestFit, Teams: 4, MaxBackfillWait: 4 * 3600, SampleEvery: 3600, Reserve: DefaultReservePolicy(), Estimates: DefaultEstimates()}
}

// Sample is the cluster's GPU use at one time.
type Sample struct {
	Time int64 `json:"time"`
	// Running GPUs do work: every pod of their job runs.
	Running int `json:"running"`
	// Held GPUs belong to jobs some of whose pods still wait (no gang).
	Held int `json:"held"`
}

// Result summarises a replay.
type Result struct {
	Strategy   Strategy `json:"strategy"`
	Jobs       int      `json:"jobs"`
	Finished   int      `json:"finished"`
	Unfinished int      `json:"unfinished"`
	// Job completion time and queueing delay of finished jobs, in hours.
	MeanJCTHours float64 `json:"meanJCTHours"`
	P50JCTHours  float64 `json:"p50JCTHours"`
	P95JCTHours  float64 `json:"p95JCTHours"`
	MaxJCTHours  float64 `json:"maxJCTHours"`
	// MaxBigGangJCTHours is the largest completion time of a finished job
	// of at least BigGangGPUs GPUs (0 when none finished).
	MaxBigGangJCTHours float64 `json:"maxBigGangJCTHours"`
	MeanQueueHours     float64 `json:"meanQueueHours"`
	P95QueueHours      float64 `json:"p95QueueHours"`
	// UtilizationPct is the time-average share of GPUs doing work, from
	// the first arrival to the end of the replay.
	UtilizationPct float64 `json:"utilizationPct"`
	// WastedGPUHours are held by partially placed gangs.
	WastedGPUHours float64 `json:"wastedGPUHours"`
	// ReservedIdleGPUHours stay free on nodes held for a starving gang.
	ReservedIdleGPUHours float64 `json:"reservedIdleGPUHours"`
	// Evictions are reclaims of borrowed jobs; LostGPUHours the work they
	// lost.
	Evictions    int     `json:"evictions"`
	LostGPUHours float64 `json:"lostGPUHours"`
	// ConsolidationMoves are the evictions made by consolidation.
	ConsolidationMoves int `json:"consolidationMoves,omitempty"`
	// ElasticGrows are pods that joined a running elastic gang;
	// ElasticShrinks pods taken back from one (elastic.go).
	ElasticGrows   int      `json:"elasticGrows,omitempty"`
	ElasticShrinks int      `json:"elasticShrinks,omitempty"`
	EndTime        int64    `json:"endTime"`
	Series         []Sample `json:"series,omitempty"`
	// Fairness over the teams of Config.Queues, for every strategy.
	Fairness Fairness `json:"fairness"`

	jctSec  []float64
	jctByID map[string]int64 // seconds, for tests
}

type jobState struct {
	job     Job
	team    string
	fteam   string // the team of StrategyQueues and the fairness metric
	sizes   []int
	nodes   []int // node of each pod, -1 while unplaced
	gpus    []allocator.GPUSet
	placed  int
	started bool
	start   int64
	// min is how many pods must run for the job to start: all of them,
	// or an elastic gang's minimum (elastic.go). Running pods are the
	// first placed.
	min int
	// left is the work left in pod-seconds as of since, done at one
	// pod-second per running pod per second; gpuSec the GPU-seconds run
	// since the start (lost on eviction); podStart when each pod started.
	left, since, gpuSec int64
	podStart            []int64
	// waited is set once the job's first start recorded its queueing delay.
	waited bool
	order  int // arrival order, the queue's sort key
	// rt is the run time the job declares (Config.Estimates).
	rt reserve.Runtime
	// backlog is the job's backlog wait when it arrived
	// (reserve.Policy.BacklogWait; StrategyReserve with Backlog only).
	backlog time.Duration
	// shape memoises shapeKey.
	shape string
}

// shapeKey identifies the job's pod shapes (and whether it may use held
// nodes) for the no-room memo.
func (j *jobState) shapeKey(holder bool) string {
	if j.shape == "" {
		j.shape = fmt.Sprint(j.sizes[:j.min])
	}
	if holder {
		return j.shape + " true"
	}
	return j.shape + " false"
}

func (j *jobState) request(i int) allocator.Request {
	return allocator.Request{GPUs: j.sizes[i]}
}

// Run replays jobs under cfg.
func Run(jobs []Job, cfg Config) (*Result, error) {
	if cfg.Nodes < 1 || cfg.GPUsPerNode < 1 || cfg.GPUsPerNode > allocator.MaxGPUsPerNode {
		return nil, fmt.Errorf("cluster of %d nodes x %d GPUs: need at least one node of 1..%d GPUs", cfg.Nodes, cfg.GPUsPerNode, allocator.MaxGPUsPerNode)
	}
	if cfg.Teams < 0 {
		return nil, fmt.Errorf("teams: %d is negative", cfg.Teams)
	}
	if cfg.ElasticMin < 0 || cfg.ElasticMin > 1 {
		return nil, fmt.Errorf("elastic minimum %v: want a fraction of a job's pods, 0..1 (0: rigid jobs)", cfg.ElasticMin)
	}
	policy, err := allocator.NewPolicy(cfg.Policy)
	if err != nil {
		return nil, err
	}
	switch cfg.Strategy {
	case StrategyGang, StrategyNoGang, StrategyFIFO, StrategyQueues:
	case StrategyReserve:
		if cfg.ConsolidateMovesPerMinute < 0 {
			return nil, fmt.Errorf("consolidation: %d moves per minute: want 0 (off) or more", cfg.ConsolidateMovesPerMinute)
		}
		if err := cfg.Reserve.Validate(); err != nil {
			return nil, err
		}
		if err := cfg.Estimates.Validate(); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("unknown strategy %q (known: gang, nogang, fifo, queues, reserve)", cfg.Strategy)
	}
	if err := cfg.Queues.validate(); err != nil {
		return nil, err
	}
	capacity := cfg.Nodes * cfg.GPUsPerNode
	for _, j := range jobs {
		if need := len(j.pods(cfg.GPUsPerNode)); need > cfg.Nodes {
			return nil, fmt.Errorf("job %s needs %d GPUs, more than the cluster's %d", j.ID, j.GPUs, capacity)
		}
	}
	s := newSim(cfg, policy)
	return s.run(jobs)
}

type sim struct {
	cfg     Config
	policy  allocator.Policy
	nodes   []gang.Node
	queue   []*jobState
	evicted []*jobState
	// noRoom holds the pod shapes that found no room in this pass.
	noRoom map[string]bool
	// reservedFor is the starving job nodes are held for; idleGPUs are
	// the free GPUs on those nodes.
	reservedFor *jobState
	idleGPUs    int
	idleArea    float64
	running     completions
	quota       *quota.State
	q           *queueSim
	rsv         *reservation
	cons        *consolidation
	res         Result
	now         int64
	lastT       int64
	runGPUs     int
	heldGPUs    int
	jct         []float64
	wait        []float64
	runArea     float64
	heldArea    float64
}

func newSim(cfg Config, p allocator.Policy) *sim {
	s := &sim{cfg: cfg, policy: p, res: Result{Strategy: cfg.Strategy}}
	s.initQueues()
	s.initReserve()
	clique := make([]int, cfg.GPUsPerNode)
	for i := range clique {
		clique[i] = i
	}
	for i := 0; i < cfg.Nodes; i++ {
		n := &allocator.Node{Name: fmt.Sprintf("node-%04d", i), Model: "A100", CPUMilliCapacity: 1 << 40, CPUMilliFree: 1 << 40, MemMiBCapacity: 1 << 40, MemMiBFree: 1 << 40}
		for g := 0; g < cfg.GPUsPerNode; g++ {
			n.GPUs = append(n.GPUs, allocator.GPU{Index: g, MilliFree: allocator.MilliPerGPU})
		}
		s.nodes = append(s.nodes, gang.Node{Node: n, Labels: map[string]string{}, Cliques: [][]int{clique}})
	}
	if cfg.Teams > 0 && cfg.Strategy == StrategyGang {
		capacity := int64(cfg.Nodes * cfg.GPUsPerNode)
		s.quota = &quota.State{Quotas: map[string]quota.Quota{}, Used: map[string]quota.Resources{}, Capacity: quota.Resources{api.ResourceGPU: capacity}}
		for t := 0; t < cfg.Teams; t++ {
			ns := teamName(t)
			s.quota.Quotas[ns] = quota.Quota{Namespace: ns, Min: quota.Resources{api.ResourceGPU: capacity / int64(cfg.Teams)}, Max: quota.Resources{api.ResourceGPU: capacity}}
		}
	}
	return s
}

func teamName(t int) string { return fmt.Sprintf("team-%d", t) }

func (s *sim) teamOf(j Job) string {
	if s.cfg.Teams == 0 {
		return ""
	}
	if j.Team != "" {
		return j.Team
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(j.ID))
	return teamName(int(h.Sum32() % uint32(s.cfg.Teams)))
}

func (s *sim) run(jobs []Job) (*Result, error) {
	s.res.Jobs = len(jobs)
	if len(jobs) == 0 {
		return &s.res, nil
	}
	s.now, s.lastT = jobs[0].Submit, jobs[0].Submit
	start := s.now
	nextSample := start
	next := 0
	for {
		t, ok := s.nextEvent(jobs, next)
		if !ok {
			break
		}
		for nextSample <= t && s.cfg.SampleEvery > 0 {
			s.res.Series = append(s.res.Series, Sample{Time: nextSample - start, Running: s.runGPUs, Held: s.heldGPUs})
			nextSample += s.cfg.SampleEvery
		}
		s.advance(t)
		for s.running.Len() > 0 && s.running[0].at == t {
			s.finish(heap.Pop(&s.running).(*completion).job)
		}
		for next < len(jobs) && jobs[next].Submit == t {
			j := jobs[next]
			js := &jobState{job: j, team: s.teamOf(j), fteam: s.fairTeam(j), sizes: j.pods(s.cfg.GPUsPerNode), order: next, rt: s.cfg.Estimates.runtime(j)}
			js.min = s.minPods(j, js.sizes)
			s.queueArrive(js)
			s.reserveArrive(js)
			js.nodes = make([]int, len(js.sizes))
			js.gpus = make([]allocator.GPUSet, len(js.sizes))
			js.podStart = make([]int64, len(js.sizes))
			for i := range js.nodes {
				js.nodes[i] = -1
			}
			s.queue = append(s.queue, js)
			next++
		}
		if err := s.schedule(); err != nil {
			return nil, err
		}
	}
	s.res.EndTime = s.now - start
	span := float64(s.now - start)
	if span > 0 {
		s.res.UtilizationPct = 100 * s.runArea / (span * float64(s.cfg.Nodes*s.cfg.GPUsPerNode))
	}
	s.res.WastedGPUHours = s.heldArea / 3600
	s.res.ReservedIdleGPUHours = s.idleArea / 3600
	s.res.Unfinished = len(s.queue)
	s.res.MeanJCTHours, s.res.P50JCTHours, s.res.P95JCTHours = stats(s.jct)
	for _, h := range s.jct {
		s.res.MaxJCTHours = max(s.res.MaxJCTHours, h)
	}
	s.res.MeanQueueHours, _, s.res.P95QueueHours = stats(s.wait)
	s.res.Fairness = s.fairnessResult()
	if s.cons != nil {
		s.res.ConsolidationMoves = s.cons.moved
	}
	return &s.res, nil
}

// nextEvent is the time of the next arrival or completion.
func (s *sim) nextEvent(jobs []Job, next int) (int64, bool) {
	var t int64
	ok := false
	if next < len(jobs) {
		t, ok = jobs[next].Submit, true
	}
	if s.running.Len() > 0 && (!ok || s.running[0].at < t) {
		t, ok = s.running[0].at, true
	}
	return t, ok
}

// advance moves the clock, integrating GPU use.
func (s *sim) advance(t int64) {
	s.accrueQueues(t - s.lastT)
	dt := float64(t - s.lastT)
	s.runArea += dt * float64(s.runGPUs)
	s.heldArea += dt * float64(s.heldGPUs)
	s.idleArea += dt * float64(s.idleGPUs)
	s.lastT, s.now = t, t
}

func (s *sim) finish(j *jobState) {
	s.reserveFinish(j)
	s.queueFinish(j)
	s.runGPUs -= j.gpusNow()
	s.release(j)
	s.res.Finished++
	s.jct = append(s.jct, float64(s.now-j.job.Submit)/3600)
	if j.job.GPUs >= BigGangGPUs {
		s.res.MaxBigGangJCTHours = max(s.res.MaxBigGangJCTHours, float64(s.now-j.job.Submit)/3600)
	}
	s.res.jctSec = append(s.res.jctSec, float64(s.now-j.job.Submit))
	if s.res.jctByID == nil {
		s.res.jctByID = map[string]int64{}
	}
	s.res.jctByID[j.job.ID] = s.now - j.job.Submit
}

// release frees every placed pod of j.
func (s *sim) release(j *jobState) {
	gpus := j.gpusNow()
	for i, n := range j.nodes {
		if n < 0 {
			continue
		}
		if err := allocator.Release(s.nodes[n].Node, j.request(i), j.gpus[i]); err != nil {
			panic(fmt.Sprintf("releasing job %s pod %d: %v", j.job.ID, i, err)) // the simulator's own ledger is broken
		}
		j.nodes[i], j.gpus[i] = -1, 0
	}
	j.placed = 0
	if s.quota != nil && j.started {
		s.quota.Used[j.team] = s.quota.Used[j.team].Sub(gpuRes(gpus))
	}
}

func (s *sim) startJob(j *jobState) {
	j.started, j.start = true, s.now
	j.left, j.since, j.gpuSec = int64(len(j.sizes))*j.job.Duration, s.now, 0
	s.queueStart(j)
	s.runGPUs += j.gpusNow()
	if !j.waited {
		j.waited = true
		s.wait = append(s.wait, float64(s.now-j.job.Submit)/3600)
	}
	if s.quota != nil {
		s.quota.Used[j.team] = s.quota.Used[j.team].Add(gpuRes(j.gpusNow()))
	}
	heap.Push(&s.running, &completion{at: s.due(j), job: j})
}

func (s *sim) schedule() error {
	defer s.observeQueues()
	switch s.cfg.Strategy {
	case StrategyNoGang:
		return s.scheduleNoGang()
	case StrategyFIFO:
		return s.scheduleWhole(true)
	case StrategyQueues:
		return s.scheduleQueues()
	case StrategyReserve:
		return s.scheduleReserve()
	}
	return s.scheduleWhole(false)
}

// scheduleWhole starts whole jobs in queue order. strict stops at the first
// job that does not fit. Otherwise smaller jobs backfill around a blocked
// one; once the oldest blocked job has waited MaxBackfillWait, the nodes
// closest to holding it are reserved for it, and other jobs backfill only on
// the rest, so the reserved nodes drain for the gang.
func (s *sim) scheduleWhole(strict bool) error {
	s.noRoom = map[string]bool{}
	kept := s.queue[:0]
	blocked := false
	for idx, j := range s.queue {
		if blocked {
			kept = append(kept, s.queue[idx:]...)
			break
		}
		started, err := s.tryStart(j)
		if err != nil {
			return err
		}
		if started {
			if s.reservedFor == j {
				s.reservedFor = nil
				s.noRoom = map[string]bool{} // held nodes it did not use are free to others
			}
			continue
		}
		kept = append(kept, j)
		switch {
		case strict:
			blocked = true
		case s.reservedFor == nil && s.cfg.MaxBackfillWait > 0 && s.now-j.job.Submit >= s.cfg.MaxBackfillWait:
			s.reserve(j)
		}
	}
	s.queue = kept
	s.requeueEvicted()
	if !strict {
		// Elastic gangs grow into what is left, off the held nodes.
		if err := s.growElastic(s.candidates(nil), func(j *jobState, gpus int) bool {
			return s.quota == nil || s.quota.Admit(j.team, gpuRes(gpus)).Allowed
		}); err != nil {
			return err
		}
	}
	s.idleGPUs = s.reservedIdle()
	return nil
}

// reserve makes j the job that nodes are held for.
func (s *sim) reserve(j *jobState) { s.reservedFor = j }

// held returns the nodes held for the reservation: for a job of whole-node
// pods, the fully free nodes (up to one per pod, by name), so it gathers
// nodes as they drain while other work backfills on partly used ones; for a
// smaller job, the one node with the most free GPUs.
func (s *sim) held() map[int]bool {
	j := s.reservedFor
	if j == nil {
		return nil
	}
	out := map[int]bool{}
	if j.sizes[0] >= s.cfg.GPUsPerNode {
		for i := range s.nodes {
			if len(out) == j.min {
				break
			}
			if s.nodes[i].Node.FullyFreeGPUs() == s.cfg.GPUsPerNode {
				out[i] = true
			}
		}
		return out
	}
	best := -1
	for i := range s.nodes {
		if best < 0 || s.nodes[i].Node.FullyFreeGPUs() > s.nodes[best].Node.FullyFreeGPUs() {
			best = i
		}
	}
	out[best] = true
	return out
}

// candidates are the nodes j may be planned on: all but the held ones,
// unless j holds the reservation.
func (s *sim) candidates(j *jobState) []gang.Node {
	if s.reservedFor == nil || s.reservedFor == j {
		return s.nodes
	}
	held := s.held()
	out := make([]gang.Node, 0, len(s.nodes))
	for i, n := range s.nodes {
		if !held[i] {
			out = append(out, n)
		}
	}
	return out
}

// reservedIdle counts the free GPUs on held nodes.
func (s *sim) reservedIdle() int {
	idle := 0
	for i := range s.held() {
		idle += s.nodes[i].Node.FullyFreeGPUs()
	}
	return idle
}

// group is the pods j starts with: all of them, or an elastic gang's
// minimum.
func (s *sim) group(j *jobState) gang.Group {
	g := gang.Group{Namespace: j.team, Name: j.job.ID, MinMember: j.min}
	for i := range j.sizes[:j.min] {
		g.Members = append(g.Members, gang.Member{Name: fmt.Sprintf("%s-%d", j.job.ID, i), Request: j.request(i)})
	}
	return g
}

// tryStart plans and starts j whole, with quota admission and reclaim when
// quota is on.
func (s *sim) tryStart(j *jobState) (bool, error) {
	req := gpuRes(j.startGPUs())
	if s.quota != nil {
		if d := s.quota.Admit(j.team, req); !d.Allowed {
			return false, nil
		}
	}
	// Within a pass free room only shrinks (until an eviction), so a shape
	// that found no room finds none again: skip planning it.
	var plan *gang.Plan
	err := error(&gang.Error{Kind: gang.ErrNoRoom})
	key := j.shapeKey(s.reservedFor == j)
	if !s.noRoom[key] {
		plan, err = gang.PlanGroup(s.group(j), s.candidates(j), s.policy)
		if errors.Is(err, gang.ErrNoRoom) {
			s.noRoom[key] = true
		}
	}
	if errors.Is(err, gang.ErrNoRoom) && s.quota != nil && s.now-j.job.Submit >= s.cfg.ReclaimAfter {
		plan, err = s.reclaimFor(j, req)
	}
	if errors.Is(err, gang.ErrNoRoom) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if plan == nil {
		return false, nil
	}
	s.apply(j, plan)
	s.startJob(j)
	return true, nil
}

// apply places the plan's members as j's next pods.
func (s *sim) apply(j *jobState, plan *gang.Plan) {
	byName := map[string]int{}
	for i, n := range s.nodes {
		byName[n.Node.Name] = i
	}
	for i, pl := range plan.Placements {
		k := j.placed + i
		n := byName[pl.Node]
		if err := allocator.Apply(s.nodes[n].Node, j.request(k), pl.GPUs); err != nil {
			panic(fmt.Sprintf("applying the plan of job %s: %v", j.job.ID, err)) // a plan the planner made must apply
		}
		j.nodes[k], j.gpus[k], j.podStart[k] = n, pl.GPUs, s.now
	}
	j.placed += len(plan.Placements)
}

// reclaimFor evicts borrowed jobs of other teams, whole, or takes back
// their elastic gangs' extra pods, so that j (whose team is within its
// min) fits; it returns j's plan on the freed cluster, or (nil, nil) when
// reclaim cannot help.
func (s *sim) reclaimFor(j *jobState, req quota.Resources) (*gang.Plan, error) {
	var running []quota.Workload
	byName := map[string]victim{}
	for _, c := range s.running {
		rj := c.job
		running = append(running, quota.Workload{Namespace: rj.team, Name: rj.job.ID, Created: unix(rj.start), Uses: gpuRes(rj.gpusNow())})
		byName[rj.job.ID] = victim{rj, -1}
		for _, e := range rj.extras() {
			name := fmt.Sprintf("%s member %d", rj.job.ID, e.k)
			running = append(running, quota.Workload{Namespace: rj.team, Name: name, Created: unix(rj.podStart[e.k]), Uses: gpuRes(rj.extraUses(e.k)), Extra: true})
			byName[name] = e
		}
	}
	of := func(ws []quota.Workload) []victim {
		out := make([]victim, len(ws))
		for i, w := range ws {
			out[i] = byName[w.Name]
		}
		return out
	}
	victims, err := s.quota.Reclaim(j.team, req, running, func(v []quota.Workload) bool { return s.fitsWithout(j, of(v)) })
	var re *quota.ReclaimError
	if errors.As(err, &re) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return s.reclaimWith(j, of(victims))
}

// fitsWithout reports whether j starts once victims are gone.
func (s *sim) fitsWithout(j *jobState, victims []victim) bool {
	if len(victims) == 0 {
		return false
	}
	_, err := gang.PlanGroup(s.group(j), s.freedCloneOf(victims), s.policy)
	return err == nil
}

// reclaimWith takes back the victims reclaim chose for j and returns j's
// plan on the room they free; (nil, nil) for no victims.
func (s *sim) reclaimWith(j *jobState, victims []victim) (*gang.Plan, error) {
	if len(victims) == 0 {
		return nil, nil
	}
	plan, err := gang.PlanGroup(s.group(j), s.freedCloneOf(victims), s.policy)
	if err != nil {
		return nil, fmt.Errorf("job %s: reclaim chose victims without room: %w", j.job.ID, err)
	}
	s.takeBack(victims)
	return plan, nil
}

// evict stops a running job; it waits again once the pass is over.
func (s *sim) evict(j *jobState) {
	for i, c := range s.running {
		if c.job == j {
			heap.Remove(&s.running, i)
			break
		}
	}
	s.res.Evictions++
	s.progress(j)
	s.queueEvict(j)
	s.noRoom = map[string]bool{} // the eviction freed room
	s.res.LostGPUHours += float64(j.gpuSec) / 3600
	s.runGPUs -= j.gpusNow()
	s.release(j)
	j.started = false
	// The queue is being walked; the job rejoins it after the pass.
	s.evicted = append(s.evicted, j)
}

// requeueEvicted puts evicted jobs back in the queue by arrival order.
func (s *sim) requeueEvicted() {
	if len(s.evicted) == 0 {
		return
	}
	s.queue = append(s.queue, s.evicted...)
	s.evicted = nil
	sort.SliceStable(s.queue, func(a, b int) bool { return s.queue[a].order < s.queue[b].order })
}

// scheduleNoGang places pods one at a time in queue order; a job starts when
// its last pod is placed.
func (s *sim) scheduleNoGang() error {
	nodes := make([]*allocator.Node, len(s.nodes))
	for k := range s.nodes {
		nodes[k] = s.nodes[k].Node
	}
	kept := s.queue[:0]
	for _, j := range s.queue {
		for i := range j.sizes {
			if j.nodes[i] >= 0 {
				continue
			}
			sel, err := allocator.Select(s.policy, nodes, j.request(i), nil)
			if err != nil {
				return err
			}
			if sel.Node < 0 {
				break // no node fits this pod now; later pods of the job wait too
			}
			if err := allocator.Apply(s.nodes[sel.Node].Node, j.request(i), sel.Evaluation.GPUs); err != nil {
				return fmt.Errorf("job %s pod %d: %w", j.job.ID, i, err)
			}
			j.nodes[i], j.gpus[i] = sel.Node, sel.Evaluation.GPUs
			j.placed++
			s.heldGPUs += j.sizes[i]
		}
		if j.placed == len(j.sizes) {
			s.heldGPUs -= j.job.GPUs
			s.startJob(j)
			continue
		}
		kept = append(kept, j)
	}
	s.queue = kept
	return nil
}

func stats(xs []float64) (mean, p50, p95 float64) {
	if len(xs) == 0 {
		return 0, 0, 0
	}
	sorted := append([]float64(nil), xs...)
	sort.Float64s(sorted)
	sum := 0.0
	for _, x := range sorted {
		sum += x
	}
	at := func(q float64) float64 { return sorted[int(q*float64(len(sorted)-1)+0.5)] }
	return sum / float64(len(sorted)), at(0.5), at(0.95)
}

type completion struct {
	at  int64
	job *jobState
}

// completions is a min-heap of completion times (then arrival order).
type completions []*completion

func (c completions) Len() int { return len(c) }
func (c completions) Less(i, j int) bool {
	if c[i].at != c[j].at {
		return c[i].at < c[j].at
	}
	return c[i].job.order < c[j].job.order
}
func (c completions) Swap(i, j int) { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)   { *c = append(*c, x.(*completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

// jctSeconds returns the finished jobs' completion times in seconds, in
// finish order (for tests).
func (r *Result) jctSeconds() []float64 {
	out := make([]float64, len(r.jctSec))
	copy(out, r.jctSec)
	return out
}
