package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// boundTrace is 16 nodes of 8 GPUs and pods of at most one GPU: every
// arrived percentage has arrivals.
func boundTrace() (nodes, pods string) {
	var n, p strings.Builder
	n.WriteString("sn,cpu_milli,memory_mib,gpu,model\n")
	for i := range 16 {
		fmt.Fprintf(&n, "n%d,96000,393216,8,G2\n", i)
	}
	p.WriteString("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n")
	for i, milli := range []int{1000, 810, 500, 230, 470, 1000, 320, 650} {
		fmt.Fprintf(&p, "p%d,4000,8192,1,%d,\n", i, milli)
	}
	return n.String(), p.String()
}

func TestRunBound(t *testing.T) {
	nodes, pods := boundTrace()
	dir := writeFiles(t, map[string]string{"nodes.csv": nodes, "pods.csv": pods})
	var stdout, stderr bytes.Buffer
	err := run([]string{"bound", "--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"),
		"--seeds", "1-3", "--per-seed"}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run bound: %v\nstderr:\n%s", err, stderr.String())
	}
	seeds := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "pods" {
			t.Fatalf("line %q: want the workload, the seeds and the bound", line)
		}
		seeds[f[1]] = true
	}
	for _, want := range []string{"1", "2", "3", "1-3"} {
		if !seeds[want] {
			t.Errorf("no line for seeds %s:\n%s", want, stdout.String())
		}
	}
}

func TestRunBoundBadFlags(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	nodes, pods := filepath.Join(dir, "nodes.csv"), filepath.Join(dir, "pods.csv")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pods", pods}, "--nodes is required"},
		{[]string{"--nodes", nodes}, "--pods is required"},
		{[]string{"--nodes", nodes, "--pods", pods, "--arrived", "0"}, "--arrived 0"},
		{[]string{"--nodes", nodes, "--pods", pods, "--arrived", "131"}, "--arrived 131"},
		{[]string{"--nodes", nodes, "--pods", pods, "--ratio", "0"}, "--ratio 0"},
		{[]string{"--nodes", nodes, "--pods", pods, "--seeds", "x"}, "--seeds"},
		{[]string{"--nodes", nodes, "--pods", filepath.Join(dir, "missing.csv")}, "missing.csv"},
		{[]string{"--nodes", nodes, "--pods", pods, "extra"}, `unexpected argument "extra"`},
	} {
		wantRunError(t, append([]string{"bound"}, tc.args...), tc.want)
	}
}
