package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// partialGangTrace: j1 holds a node, j2 needs both, j3 is short (see
// sim/jobs' TestStrategiesOnAPartialGang for the worked times).
const partialGangTrace = "job_id,submission_time,duration,num_gpu\nj1,0,100,8\nj2,1,100,16\nj3,2,10,8\n"

func TestJobsCommand(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "tiny.csv")
	if err := os.WriteFile(trace, []byte(partialGangTrace), 0o644); err != nil {
		t.Fatal(err)
	}
	series := filepath.Join(dir, "series.csv")
	var out, errOut bytes.Buffer
	args := []string{"jobs", "--trace", trace, "--nodes", "2", "--format", "json", "--sample-every", "50s", "--series", series}
	if err := run(args, &out, &errOut); err != nil {
		t.Fatalf("jobs: %v\n%s", err, errOut.String())
	}
	type row struct {
		Trace          string  `json:"trace"`
		Variant        string  `json:"variant"`
		Finished       int     `json:"finished"`
		WastedGPUHours float64 `json:"wastedGPUHours"`
		EndTime        int64   `json:"endTime"`
	}
	var rows []row
	dec := json.NewDecoder(&out)
	for dec.More() {
		var r row
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	if len(rows) != 3 {
		t.Fatalf("%d rows, want one per strategy", len(rows))
	}
	want := map[string]row{
		"gang":   {Trace: "tiny", Variant: "gang", Finished: 3, EndTime: 200},
		"nogang": {Trace: "tiny", Variant: "nogang", Finished: 3, WastedGPUHours: 8 * 99.0 / 3600, EndTime: 210},
		"fifo":   {Trace: "tiny", Variant: "fifo", Finished: 3, EndTime: 210},
	}
	for _, r := range rows {
		if r != want[r.Variant] {
			t.Errorf("row %+v, want %+v", r, want[r.Variant])
		}
	}
	csv, err := os.ReadFile(series)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(csv), "trace,strategy,hours,running_gpus,held_gpus\n") || !strings.Contains(string(csv), "tiny,nogang,0.01,8,8\n") {
		t.Errorf("series:\n%s", csv)
	}

	out.Reset()
	if err := run([]string{"jobs", "--trace", trace, "--nodes", "2", "--teams", "2", "--hold-after", "1h", "--strategy", "gang"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "gang+hold1h0m0s+quota2") || !strings.Contains(out.String(), "mean JCT h") {
		t.Errorf("table:\n%s", out.String())
	}
	out.Reset()
	args = []string{"jobs", "--trace", trace, "--nodes", "2", "--strategy", "queues,gang", "--queue-half-life", "1h", "--queue-guarantee-fraction", "0.5",
		"--team-shares"}
	if err := run(args, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"queues+hl1h0m0s+guar0.5", "Jain", "min recv/ent", "entitled GPU-h", "team-3"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	args = []string{"jobs", "--trace", trace, "--nodes", "2", "--strategy", "reserve", "--format", "json"}
	if err := run(args, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	// j2 (16 GPUs) is not due within the default wait: j3 backfills, as
	// under gang.
	if !strings.Contains(out.String(), `"variant":"reserve+est=user2x-miss0.2"`) || !strings.Contains(out.String(), `"endTime":200`) || !strings.Contains(out.String(), `"maxBigGangJCTHours":0.0552`) {
		t.Errorf("reserve json:\n%s", out.String())
	}
	out.Reset()
	args = []string{"jobs", "--trace", trace, "--nodes", "2", "--strategy", "reserve", "--format", "json",
		"--reserve-wait", "0s", "--reserve-wait-per-gpu", "1s", "--reserve-min-gpus", "9", "--reserve-preemptible=false", "--reserve-relative", "0", "--reserve-max", "2", "--reserve-by-age", "--reserve-order", "oldest"}
	if err := run(args, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	// j2 is due at t=17, after j3 started: nothing to evict.
	for _, want := range []string{`"variant":"reserve+min9+w0s+wpg1s+pre=false+rel0+max2+byage=true+oldest+est=user2x-miss0.2"`, `"evictions":0`, `"endTime":200`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("reserve json lacks %s:\n%s", want, out.String())
		}
	}
	// One replay per estimate model; none without estimates.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--estimates", "oracle,user3x-miss0"}, []string{`"variant":"reserve+est=oracle"`, `"variant":"reserve+est=user3x-miss0"`}},
		{[]string{"--consolidate-moves-per-minute", "4"}, []string{`"variant":"reserve+cons4+est=user2x-miss0.2"`}},
		{[]string{"--reserve-overdue-first", "--reserve-backlog", "0.5"}, []string{`"variant":"reserve+overdue=true+backlog0.5+est=user2x-miss0.2"`}},
		{[]string{"--estimates", "oracle,none", "--reserve-estimates=false", "--reserve-short-first=false", "--reserve-max-share", "0", "--reserve-undeclared", "1h"},
			[]string{`"variant":"reserve+easy=false+und1h0m0s+share0+sf=false"`}},
	} {
		out.Reset()
		args = append([]string{"jobs", "--trace", trace, "--nodes", "2", "--strategy", "reserve", "--format", "json"}, tc.args...)
		if err := run(args, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		if got := strings.Count(out.String(), `"variant"`); got != len(tc.want) {
			t.Errorf("%v: %d replays, want %d:\n%s", tc.args, got, len(tc.want), out.String())
		}
		for _, want := range tc.want {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v: json lacks %s:\n%s", tc.args, want, out.String())
			}
		}
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"bad fraction":       {[]string{"jobs", "--trace", trace, "--queue-guarantee-fraction", "1.5"}, "--queue-guarantee-fraction 1.5"},
		"bad half-life":      {[]string{"jobs", "--trace", trace, "--queue-half-life", "0s"}, "--queue-half-life 0s"},
		"bad history weight": {[]string{"jobs", "--trace", trace, "--queue-history-weight", "-1"}, "--queue-history-weight -1"},
		"no departments":     {[]string{"jobs", "--trace", trace, "--queue-departments", "0"}, "--queue-departments 0"},
		"no trace":           {[]string{"jobs"}, "--trace is required"},
		"missing trace":      {[]string{"jobs", "--trace", filepath.Join(dir, "nope.csv")}, "nope.csv"},
		"unknown strategy":   {[]string{"jobs", "--trace", trace, "--nodes", "2", "--strategy", "lottery"}, `unknown strategy "lottery"`},
		"bad reserve order":  {[]string{"jobs", "--trace", trace, "--reserve-order", "soonest"}, `order "soonest"`},
		"bad reserve min":    {[]string{"jobs", "--trace", trace, "--reserve-min-gpus", "0"}, "MinGPUs 0"},
		"bad estimates":      {[]string{"jobs", "--trace", trace, "--estimates", "psychic"}, `estimates "psychic"`},
		"bad consolidation":  {[]string{"jobs", "--trace", trace, "--consolidate-moves-per-minute", "-1"}, "--consolidate-moves-per-minute -1"},
		"bad max share":      {[]string{"jobs", "--trace", trace, "--reserve-max-share", "2"}, "MaxShare 2"},
		"bad format":         {[]string{"jobs", "--trace", trace, "--format", "xml"}, `--format "xml"`},
		"too small":          {[]string{"jobs", "--trace", trace, "--nodes", "1"}, "more than the cluster's 8"},
	} {
		t.Run(name, func(t *testing.T) { wantRunError(t, tc.args, tc.want) })
	}
}
