package sim

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
)

// ParseTesseraConfig reads a tessera tuning such as
// "frag=0.25,strand=4,gap=4,gapcomp=0.01,gaptau=5,open=40,model=2,scarce=1,claim=0,free=1,rem=1,priced=1" on top of
// allocator.DefaultTesseraConfig: keys left out keep their default. On an
// error it returns the zero config.
func ParseTesseraConfig(s string) (allocator.TesseraConfig, error) {
	cfg := allocator.DefaultTesseraConfig()
	fields := map[string]*float64{
		"frag":    &cfg.FragWeight,
		"strand":  &cfg.StrandWeight,
		"gap":     &cfg.GapWeight,
		"gapcomp": &cfg.GapCompetition,
		"gaptau":  &cfg.GapRouting,
		"open":    &cfg.OpenCost,
		"model":   &cfg.ModelWeight,
		"scarce":  &cfg.Scarcity,
		"claim":   &cfg.ClaimFillers,
		"free":    &cfg.FreeWaste,
		"rem":     &cfg.Remainder,
		"priced":  &cfg.PricedGaps,
	}
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		kv = strings.TrimSpace(kv)
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		dst, known := fields[k]
		if !ok || !known {
			return allocator.TesseraConfig{}, fmt.Errorf("tessera weights %q: %q is not KEY=VALUE with KEY one of frag, strand, gap, gapcomp, gaptau, open, model, scarce, claim, free, rem, priced", s, kv)
		}
		if seen[k] {
			return allocator.TesseraConfig{}, fmt.Errorf("tessera weights %q: %s given twice", s, k)
		}
		seen[k] = true
		x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || x < 0 || math.IsInf(x, 0) || math.IsNaN(x) {
			return allocator.TesseraConfig{}, fmt.Errorf("tessera weights %q: %s=%q is not a non-negative number", s, k, v)
		}
		*dst = x
	}
	if cfg.GapWeight > 0 && cfg.GapCompetition <= 0 {
		return allocator.TesseraConfig{}, fmt.Errorf("tessera weights %q: gapcomp must be > 0 when gap > 0", s)
	}
	return cfg, nil
}
