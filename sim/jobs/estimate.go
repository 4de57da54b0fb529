package jobs

import (
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tessera-gpu/tessera/allocator/reserve"
)

// EstimateKind is where the simulator takes the run time a job declares
// (reserve.Runtime, the tessera.dev/expected-runtime annotation of a real
// workload) from.
type EstimateKind string

// Estimate kinds.
const (
	// EstimateNone: no job declares a run time.
	EstimateNone EstimateKind = "none"
	// EstimateOracle: every job declares its actual duration (perfect
	// knowledge; a bound, not a fit).
	EstimateOracle EstimateKind = "oracle"
	// EstimateUser: as users fill in a time limit: the actual duration
	// times Factor, rounded up to the next limit class (LimitClasses);
	// a job longer than the largest class, and a share Missing of the jobs
	// (chosen by a hash of the ID), declare none.
	EstimateUser EstimateKind = "user"
	// EstimateTrace: the trace's expected_runtime column (Job.Estimate; 0
	// declares none).
	EstimateTrace EstimateKind = "trace"
)

// LimitClasses are the run-time limits a user picks from under
// EstimateUser (a queue's usual limits: 1 h to 30 days).
var LimitClasses = []time.Duration{
	time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 12 * time.Hour,
	24 * time.Hour, 48 * time.Hour, 72 * time.Hour, 7 * 24 * time.Hour, 14 * 24 * time.Hour, 30 * 24 * time.Hour,
}

// Estimates says what run time each job declares.
type Estimates struct {
	Kind EstimateKind
	// Factor (EstimateUser): how much longer than the actual duration
	// users ask for, at least 1.
	Factor float64
	// Missing (EstimateUser): the share of jobs that declare none, 0..1.
	Missing float64
}

// DefaultEstimates is the realistic model: users ask for twice the run
// time, rounded up to a limit class, and one job in five declares none.
func DefaultEstimates() Estimates {
	return Estimates{Kind: EstimateUser, Factor: 2, Missing: 0.2}
}

// Validate reports a model that cannot work.
func (e Estimates) Validate() error {
	switch e.Kind {
	case "", EstimateNone, EstimateOracle, EstimateTrace:
		return nil
	case EstimateUser:
		// Written so that NaN fails too; an infinite factor has no run time.
		if !(e.Factor >= 1) || math.IsInf(e.Factor, 1) || !(e.Missing >= 0 && e.Missing <= 1) {
			return fmt.Errorf("estimates: factor %v, missing %v: want a factor of at least 1 and a share in 0..1", e.Factor, e.Missing)
		}
		return nil
	}
	return fmt.Errorf("estimates: kind %q: want %s, %s, %s or %s", e.Kind, EstimateNone, EstimateOracle, EstimateTrace, EstimateUser)
}

// String names the model, e.g. "oracle" or "user2x-miss0.2".
func (e Estimates) String() string {
	switch e.Kind {
	case EstimateUser:
		return fmt.Sprintf("user%sx-miss%s", strconv.FormatFloat(e.Factor, 'g', -1, 64), strconv.FormatFloat(e.Missing, 'g', -1, 64))
	case "":
		return string(EstimateNone)
	}
	return string(e.Kind)
}

// ParseEstimates reads a model name as String writes it: none, oracle, or
// user<factor>x-miss<share>.
func ParseEstimates(s string) (Estimates, error) {
	switch EstimateKind(s) {
	case EstimateNone, EstimateOracle, EstimateTrace:
		return Estimates{Kind: EstimateKind(s)}, nil
	}
	rest, ok := strings.CutPrefix(s, "user")
	if !ok {
		return Estimates{}, fmt.Errorf("estimates %q: want none, oracle, trace or user<factor>x-miss<share> (e.g. user2x-miss0.2)", s)
	}
	f, m, ok := strings.Cut(rest, "x-miss")
	if !ok {
		return Estimates{}, fmt.Errorf("estimates %q: want user<factor>x-miss<share> (e.g. user2x-miss0.2)", s)
	}
	factor, err1 := strconv.ParseFloat(f, 64)
	missing, err2 := strconv.ParseFloat(m, 64)
	if err1 != nil || err2 != nil {
		return Estimates{}, fmt.Errorf("estimates %q: the factor and the share must be numbers", s)
	}
	e := Estimates{Kind: EstimateUser, Factor: factor, Missing: missing}
	if err := e.Validate(); err != nil {
		return Estimates{}, err
	}
	return e, nil
}

// runtime is the run time job j declares under e.
func (e Estimates) runtime(j Job) reserve.Runtime {
	actual := time.Duration(j.Duration) * time.Second
	switch e.Kind {
	case EstimateOracle:
		return reserve.Expect(actual)
	case EstimateTrace:
		if j.Estimate > 0 {
			return reserve.Expect(time.Duration(j.Estimate) * time.Second)
		}
	case EstimateUser:
		h := fnv.New32a()
		_, _ = h.Write([]byte(j.ID))
		if float64(h.Sum32()%10000) < e.Missing*10000 {
			return reserve.Runtime{}
		}
		want := time.Duration(float64(actual) * e.Factor)
		for _, c := range LimitClasses {
			if want <= c {
				return reserve.Expect(c)
			}
		}
	}
	return reserve.Runtime{}
}
