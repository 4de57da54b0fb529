package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/allocator"
)

func TestParseSeeds(t *testing.T) {
	tests := map[string][]int64{
		"42-51":     {42, 43, 44, 45, 46, 47, 48, 49, 50, 51},
		"42":        {42},
		"1,3-4, 9 ": {1, 3, 4, 9},
		// Found writing FuzzParseSeeds: counting past the largest seed
		// wrapped around and never ended.
		"9223372036854775807":                     {9223372036854775807},
		"9223372036854775806-9223372036854775807": {9223372036854775806, 9223372036854775807},
	}
	for in, want := range tests {
		got, err := ParseSeeds(in)
		if err != nil || !cmp.Equal(got, want) {
			t.Errorf("ParseSeeds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "x", "5-3", "1-x", ",", "0-1000000"} {
		if _, err := ParseSeeds(bad); err == nil {
			t.Errorf("ParseSeeds(%q) accepted", bad)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	got, err := ParsePolicies(" FGD,bestfit ")
	if err != nil || !cmp.Equal(got, []string{"fgd", "bestfit"}) {
		t.Errorf("ParsePolicies = %v, %v", got, err)
	}
	_, err = ParsePolicies("fgd,tetris")
	if !errors.Is(err, allocator.ErrUnknownPolicy) || !strings.Contains(err.Error(), "tetris") {
		t.Errorf("unknown policy error: %v", err)
	}
	if _, err := ParsePolicies(" , "); err == nil {
		t.Errorf("empty policy list accepted")
	}
}

func TestRunAll(t *testing.T) {
	tr := synthTrace(2)
	jobs := Jobs([]*Trace{tr}, []string{"bestfit", "dotprod"}, []int64{5, 6, 7}, Config{})
	calls := 0
	res, err := RunAll(t.Context(), jobs, 2, func(done, total int, r *Result) {
		calls++
		if done != calls || total != len(jobs) {
			t.Errorf("progress(%d, %d) after %d calls", done, total, calls)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != len(jobs) || len(res) != len(jobs) {
		t.Fatalf("%d progress calls, %d results, want %d", calls, len(res), len(jobs))
	}
	for i, r := range res {
		if r.Policy != jobs[i].Config.Policy || r.Seed != jobs[i].Config.Seed {
			t.Errorf("result %d is %s/%d, want %s/%d", i, r.Policy, r.Seed, jobs[i].Config.Policy, jobs[i].Config.Seed)
		}
	}
	bad := append(jobs, Job{Trace: tr, Config: Config{Policy: "bestfit", Plan: PlanOptions{Ratio: -1}}})
	if _, err := RunAll(t.Context(), bad, 2, nil); err == nil {
		t.Errorf("RunAll ignored a failing job")
	}
}
