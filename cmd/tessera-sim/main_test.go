package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testNodes = `sn,cpu_milli,memory_mib,gpu,model
n0,96000,393216,8,G2
n1,96000,393216,8,G2
n2,104000,524288,2,T4
n3,104000,524288,2,T4
`

const testPods = `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec
p0,4000,8192,1,500,
p1,8000,16384,1,1000,
p2,12000,16384,0,0,
p3,2000,4096,1,810,
p4,16000,32768,2,1000,T4
p5,3000,4096,1,230,
`

// wantRunError runs tessera-sim with args and wants an error that says
// want.
func wantRunError(t *testing.T, args []string, want string) {
	t.Helper()
	if err := run(args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("tessera-sim %v: error %v, want one containing %q", args, err, want)
	}
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRunJSON(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	plot := filepath.Join(dir, "out.svg")
	var stdout, stderr bytes.Buffer
	err := run([]string{"--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"),
		"--policy", "fgd,tessera", "--seeds", "1-2", "--workers", "2", "--format", "json", "--plot", plot}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	seen := map[string]bool{}
	for _, l := range lines {
		var rec struct {
			Policy         *string  `json:"policy"`
			Workload       *string  `json:"workload"`
			Seed           *int64   `json:"seed"`
			ArrivedPct     *int     `json:"arrivedPct"`
			AllocPct       *float64 `json:"allocPct"`
			UnallocatedPct *float64 `json:"unallocatedPct"`
			FragPct        *float64 `json:"fragPct"`
		}
		dec := json.NewDecoder(strings.NewReader(l))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("bad JSON line %q: %v", l, err)
		}
		if rec.Policy == nil || rec.Workload == nil || rec.Seed == nil || rec.ArrivedPct == nil || rec.AllocPct == nil || rec.UnallocatedPct == nil || rec.FragPct == nil {
			t.Fatalf("JSON line %q lacks a field", l)
		}
		if *rec.Workload != "pods" {
			t.Errorf("workload %q, want pods", *rec.Workload)
		}
		seen[*rec.Policy] = true
	}
	if !seen["fgd"] || !seen["tessera"] || len(seen) != 2 {
		t.Errorf("policies in output: %v", seen)
	}
	if !strings.Contains(stderr.String(), "[4/4") {
		t.Errorf("no progress on stderr:\n%s", stderr.String())
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.Contains(svg, []byte("<polyline")) {
		t.Errorf("plot not written: %v", err)
	}
}

func TestRunTableAndCSV(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	args := []string{"--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"), "--policy", "bestfit", "--seeds", "3", "--quiet"}
	var out, errOut bytes.Buffer
	if err := run(append(args, "--format", "table", "--tie-break", "name"), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "workload pods, 1 seeds (3)") || !strings.Contains(out.String(), "\nbestfit ") || errOut.Len() != 0 {
		t.Errorf("table:\n%s\nstderr:\n%s", out.String(), errOut.String())
	}
	out.Reset()
	if err := run(append(args, "--format", "csv"), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "policy,workload,seed,arrivedPct,allocPct,unallocatedPct,fragPct\nbestfit,pods,3,") {
		t.Errorf("csv:\n%s", out.String())
	}
}

func TestRunBadInput(t *testing.T) {
	dir := writeFiles(t, map[string]string{
		"nodes.csv":    testNodes,
		"pods.csv":     testPods,
		"badpods.csv":  "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,4000,8192,1,500\np1,lots,1,0,0\n",
		"badquote.csv": "sn,cpu_milli,memory_mib,gpu,model\nn0,\"96000,1,1,G2\n",
	})
	nodes, pods := filepath.Join(dir, "nodes.csv"), filepath.Join(dir, "pods.csv")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no nodes flag", []string{"--pods", pods}, "--nodes is required"},
		{"no pods flag", []string{"--nodes", nodes}, "--pods is required"},
		{"missing file", []string{"--nodes", nodes, "--pods", filepath.Join(dir, "nope.csv")}, "nope.csv: no such file"},
		{"malformed value", []string{"--nodes", nodes, "--pods", filepath.Join(dir, "badpods.csv")}, `badpods.csv:3:4: column "cpu_milli": "lots" is not an integer`},
		{"malformed csv", []string{"--nodes", filepath.Join(dir, "badquote.csv"), "--pods", pods}, "badquote.csv:2:"},
		{"unknown policy", []string{"--nodes", nodes, "--pods", pods, "--policy", "fgd,tetris"}, `--policy: unknown policy "tetris"`},
		{"bad seeds", []string{"--nodes", nodes, "--pods", pods, "--seeds", "9-1"}, "--seeds: seed range \"9-1\" is reversed"},
		{"bad format", []string{"--nodes", nodes, "--pods", pods, "--format", "yaml"}, `--format "yaml"`},
		{"bad tie-break", []string{"--nodes", nodes, "--pods", pods, "--tie-break", "coin"}, "--tie-break"},
		{"bad tessera weights", []string{"--nodes", nodes, "--pods", pods, "--tessera-weights", "strand=lots"}, `--tessera-weights: tessera weights "strand=lots"`},
		{"bad workers", []string{"--nodes", nodes, "--pods", pods, "--workers", "0"}, "--workers 0"},
		{"unknown flag", []string{"--nodes", nodes, "--pods", pods, "--colour"}, "flag provided but not defined"},
		{"stray argument", []string{"--nodes", nodes, "--pods", pods, "extra"}, `unexpected argument "extra"`},
		{"bad plot path", []string{"--nodes", nodes, "--pods", pods, "--policy", "bestfit", "--seeds", "1", "--quiet", "--plot", filepath.Join(dir, "no", "such", "dir.svg")}, "plot:"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(tc.args, &out, &errOut)
			if err == nil || !strings.Contains(err.Error()+errOut.String(), tc.want) {
				t.Errorf("run(%v) = %v (stderr %q), want an error containing %q", tc.args, err, errOut.String(), tc.want)
			}
		})
	}
	var out, errOut bytes.Buffer
	if err := run([]string{"-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "usage: tessera-sim") {
		t.Errorf("-h: %v, %q", err, errOut.String())
	}
}

// --tessera-weights reaches the policy: with every weight 0 all nodes tie
// and the placements (so the curves) differ from the default tuning's.
func TestRunTesseraWeights(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	args := []string{"--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"), "--policy", "tessera", "--seeds", "1-3", "--quiet", "--format", "csv"}
	out := func(extra ...string) string {
		var stdout, stderr bytes.Buffer
		if err := run(append(append([]string(nil), args...), extra...), &stdout, &stderr); err != nil {
			t.Fatalf("run %v: %v\n%s", extra, err, stderr.String())
		}
		return stdout.String()
	}
	def := out()
	if same := out("--tessera-weights", "frag=1,strand=4,gap=0.5,gapcomp=0.05,model=2"); same != def {
		t.Errorf("the default weights spelled out give another result")
	}
	if zero := out("--tessera-weights", "frag=0,strand=0,gap=0,model=0"); zero == def {
		t.Errorf("all-zero weights give the default result: the flag does not reach the policy")
	}
}
