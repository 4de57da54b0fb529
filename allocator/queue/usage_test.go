package queue

import (
	"math"
	"testing"
	"time"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

func TestDecay(t *testing.T) {
	const h = 6 * time.Hour
	u := Usage{gpu: 1000, mem: 8}
	tests := []struct {
		name     string
		elapsed  time.Duration
		halfLife time.Duration
		want     float64 // factor
	}{
		{"one half-life halves", h, h, 0.5},
		{"two quarter", 2 * h, h, 0.25},
		{"half a half-life", h / 2, h, 1 / math.Sqrt2},
		{"nothing elapsed", 0, h, 1},
		{"negative elapsed is none", -h, h, 1},
		{"no half-life, no decay", 100 * h, 0, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Decay(u, tc.elapsed, tc.halfLife)
			for k, v := range u {
				if !close(got[k], v*tc.want, 1e-12) {
					t.Errorf("Decay(%s) = %g, want %g", k, got[k], v*tc.want)
				}
			}
		})
	}
	if u[gpu] != 1000 {
		t.Errorf("Decay changed its argument: %v", u)
	}
}

// Accrue's closed form against a fine midpoint sum of the decayed use.
func TestAccrueClosedForm(t *testing.T) {
	used := quota.Resources{gpu: 3, mem: 40}
	for _, tc := range []struct {
		elapsed, halfLife time.Duration
	}{
		{time.Hour, time.Hour},
		{10 * time.Minute, 7 * 24 * time.Hour},
		{3 * time.Hour, 20 * time.Minute},
	} {
		start := Usage{gpu: 500}
		got := Accrue(start, used, tc.elapsed, tc.halfLife)
		const steps = 200000
		e, h := tc.elapsed.Seconds(), tc.halfLife.Seconds()
		dt := e / steps
		var integral float64
		for k := 0; k < steps; k++ {
			mid := (float64(k) + 0.5) * dt
			integral += dt * math.Exp2(-(e-mid)/h)
		}
		decay := math.Exp2(-e / h)
		want := Usage{gpu: 500*decay + 3*integral, mem: 40 * integral}
		for k := range want {
			if !close(got[k], want[k], 1e-6) {
				t.Errorf("elapsed %v, half-life %v: Accrue %s = %.9g, numeric %.9g", tc.elapsed, tc.halfLife, k, got[k], want[k])
			}
		}
	}
}

func TestAccrue(t *testing.T) {
	const h = time.Hour
	// Two half-hours make one hour.
	two := Accrue(Accrue(Usage{gpu: 100}, gpus(2), h/2, h), gpus(2), h/2, h)
	one := Accrue(Usage{gpu: 100}, gpus(2), h, h)
	if !close(two[gpu], one[gpu], 1e-12) {
		t.Errorf("two half-hours %g, one hour %g", two[gpu], one[gpu])
	}
	// Used forever, it tends to used·h/ln 2.
	forever := Accrue(nil, gpus(2), 100*h, h)
	if !close(forever[gpu], 2*steadyState(h), 1e-12) {
		t.Errorf("steady state %g, want %g", forever[gpu], 2*steadyState(h))
	}
	// Without decay, a plain sum.
	plain := Accrue(Usage{gpu: 10}, gpus(2), time.Minute, 0)
	if plain[gpu] != 130 {
		t.Errorf("no decay: %g, want 130", plain[gpu])
	}
}

func close(a, b, rel float64) bool {
	if a == b {
		return true
	}
	return math.Abs(a-b) <= rel*math.Max(math.Abs(a), math.Abs(b))
}
