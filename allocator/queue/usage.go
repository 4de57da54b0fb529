package queue

import (
	"math"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator/quota"
)

// Usage is a queue's decayed usage history in resource-seconds: one GPU
// used for an hour, just now, is 3600 tessera.dev/gpu.
type Usage map[corev1.ResourceName]float64

// Decay returns u after elapsed: u·2^(−elapsed/halfLife). halfLife ≤ 0
// means no decay; a negative elapsed counts as 0.
func Decay(u Usage, elapsed, halfLife time.Duration) Usage {
	f := decayFactor(elapsed, halfLife)
	out := Usage{}
	for k, v := range u {
		out[k] = v * f
	}
	return out
}

// Accrue returns u after elapsed during which used was constantly in use:
// Decay(u) plus the decayed integral of used over elapsed,
//
//	∫₀ᵉ used·2^(−(e−t)/h) dt = used·(1 − 2^(−e/h))·h/ln 2   (seconds),
//
// or used·e with halfLife ≤ 0 (no decay). Amounts below 0 count as 0.
func Accrue(u Usage, used quota.Resources, elapsed, halfLife time.Duration) Usage {
	out := Decay(u, elapsed, halfLife)
	e := max(elapsed, 0).Seconds()
	gain := e
	if halfLife > 0 {
		h := halfLife.Seconds()
		// -expm1(-x) = 1 - e^-x, exact for small e/h.
		gain = -math.Expm1(-e/h*math.Ln2) * h / math.Ln2
	}
	for k, v := range used {
		if v > 0 {
			out[k] += float64(v) * gain
		}
	}
	return out
}

func decayFactor(elapsed, halfLife time.Duration) float64 {
	if halfLife <= 0 || elapsed <= 0 {
		return 1
	}
	return math.Exp2(-elapsed.Seconds() / halfLife.Seconds())
}

// steadyState is how many resource-seconds one unit used forever adds up
// to: h/ln 2 with decay, 1 second without (Usage is then a plain sum, and
// Share counts seconds at the entitlement).
func steadyState(halfLife time.Duration) float64 {
	if halfLife <= 0 {
		return 1
	}
	return halfLife.Seconds() / math.Ln2
}

func (u Usage) clone() Usage {
	if u == nil {
		return nil
	}
	out := Usage{}
	for k, v := range u {
		out[k] = v
	}
	return out
}

// add returns u + o (nil when both are).
func (u Usage) add(o Usage) Usage {
	if o == nil {
		return u
	}
	out := u.clone()
	if out == nil {
		out = Usage{}
	}
	for k, v := range o {
		out[k] += v
	}
	return out
}
