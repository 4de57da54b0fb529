package sim

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// PublishedCurve is one row of the artifact's published results
// (expected/analysis_allo_discrete.csv): a GPU allocation ratio (%) per
// arrived-workload percentage for one workload, policy and seed.
type PublishedCurve struct {
	Workload string // e.g. "openb_pod_list_default"
	Policy   string // our policy name, e.g. "fgd"
	Seed     int64
	// Alloc maps arrived percentage to allocation ratio (%); missing
	// percentages are absent.
	Alloc map[int]float64
}

// ourPolicyName maps the artifact's sc_policy labels to our policy names.
func ourPolicyName(label string) (string, bool) {
	switch label {
	case "01-Random":
		return "random", true
	case "02-DotProd":
		return "dotprod", true
	case "03-GpuClustering":
		return "gpuclustering", true
	case "04-GpuPacking":
		return "gpupacking", true
	case "05-BestFit":
		return "bestfit", true
	case "06-FGD":
		return "fgd", true
	}
	return "", false
}

// LoadPublished reads the artifact's analysis_allo_discrete.csv.
func LoadPublished(path string) ([]PublishedCurve, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("published results: %w", err)
	}
	defer f.Close()
	return ReadPublished(f, path)
}

// ReadPublished parses the artifact's analysis_allo_discrete.csv format.
func ReadPublished(r io.Reader, file string) ([]PublishedCurve, error) {
	t, err := openTable(r, file, "workload", "sc_policy", "seed")
	if err != nil {
		return nil, err
	}
	var pctCols []int
	for name := range t.cols {
		if v, err := strconv.Atoi(name); err == nil && v >= 0 && v <= MaxArrivedPct {
			pctCols = append(pctCols, v)
		}
	}
	if len(pctCols) == 0 {
		return nil, fmt.Errorf("%s:1: no arrived-percentage columns 0..%d", file, MaxArrivedPct)
	}
	var out []PublishedCurve
	for {
		ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		policy, known := ourPolicyName(t.str("sc_policy"))
		if !known {
			return nil, t.errAt("sc_policy", "unknown artifact policy %q", t.str("sc_policy"))
		}
		seed, err := t.int("seed")
		if err != nil {
			return nil, err
		}
		c := PublishedCurve{Workload: t.str("workload"), Policy: policy, Seed: seed, Alloc: make(map[int]float64)}
		for _, pct := range pctCols {
			col := strconv.Itoa(pct)
			s := strings.TrimSpace(t.str(col))
			if s == "" {
				continue
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, t.errAt(col, "%q is not a number", s)
			}
			c.Alloc[pct] = v
		}
		out = append(out, c)
	}
	return out, nil
}
