package jobs

// Fuzz targets for the parsers of the jobs simulator's flags. They check
// properties, not only "no panic"; `go test` runs the seeds.

import (
	"math"
	"strings"
	"testing"
)

// FuzzParseEstimates checks that ParseEstimates either fails with an error
// about the estimates and returns the zero model, or returns a model that
// validates, with a finite factor of at least 1 and a share in 0..1 for
// "user" (nothing else for the other kinds), and that String writes back
// as the same model.
func FuzzParseEstimates(f *testing.F) {
	for _, s := range []string{
		"none", "oracle", "trace", "user2x-miss0.2", "user1x-miss0", "user1x-miss1", "user1.5x-miss-0",
		"user0.5x-miss0", "user2x-miss1.5", "user2x", "userAx-missB", "perfect", "", "user", "User2x-miss0.2",
		"userNaNx-miss0.2", "user2x-missNaN", "userInfx-miss0", "user+Infx-miss0", "user1e400x-miss0",
		"user0x1p1x-miss0x1p-2", "user1_0x-miss0", "user2x-miss0.2x-miss0.1", " none",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEstimates(s)
		if err != nil {
			if e != (Estimates{}) {
				t.Fatalf("ParseEstimates(%q) = %+v with error %v", s, e, err)
			}
			if !strings.HasPrefix(err.Error(), "estimates") {
				t.Fatalf("error %q does not say it is about the estimates", err)
			}
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("ParseEstimates(%q) = %+v, which does not validate: %v", s, e, err)
		}
		switch e.Kind {
		case EstimateNone, EstimateOracle, EstimateTrace:
			if e.Factor != 0 || e.Missing != 0 || e.String() != s {
				t.Fatalf("ParseEstimates(%q) = %+v", s, e)
			}
		case EstimateUser:
			if !(e.Factor >= 1) || math.IsInf(e.Factor, 0) || !(e.Missing >= 0 && e.Missing <= 1) {
				t.Fatalf("ParseEstimates(%q): factor %v, missing %v", s, e.Factor, e.Missing)
			}
		default:
			t.Fatalf("ParseEstimates(%q): kind %q", s, e.Kind)
		}
		if again, err := ParseEstimates(e.String()); err != nil || again != e {
			t.Fatalf("ParseEstimates(%q) = %+v; String %q reads %+v, %v", s, e, e.String(), again, err)
		}
	})
}
