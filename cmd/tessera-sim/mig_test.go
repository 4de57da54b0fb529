package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunMIG(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	plot := filepath.Join(dir, "mig.svg")
	var stdout, stderr bytes.Buffer
	err := run([]string{"mig", "--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"),
		"--seeds", "1-3", "--workers", "2", "--plot", plot}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run mig: %v\nstderr:\n%s", err, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"workload pods on A100-SXM4-40GB MIG, 3 seeds", "mig-firstfit", "mig-frag", "mig-fgd-firstfit", "mig-fgd ", "7g.40gb:", "fgd (no MIG)"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(stderr.String(), "15 simulations in") {
		t.Errorf("stderr: %s", stderr.String())
	}
	svg, err := os.ReadFile(plot)
	if err != nil || !bytes.Contains(svg, []byte("mig-fgd")) || !bytes.Contains(svg, []byte("fgd (no MIG)")) {
		t.Errorf("plot: %v, mentions mig-fgd: %v, fgd (no MIG): %v", err, bytes.Contains(svg, []byte("mig-fgd")), bytes.Contains(svg, []byte("fgd (no MIG)")))
	}
	// Without the baseline.
	stdout.Reset()
	stderr.Reset()
	if err := run([]string{"mig", "--nodes", filepath.Join(dir, "nodes.csv"), "--pods", filepath.Join(dir, "pods.csv"),
		"--seeds", "1", "--baseline", "", "--policy", "fgd", "--quiet"}, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stdout.String(), "no MIG") || strings.Contains(stdout.String(), "mig-frag") || !strings.Contains(stdout.String(), "mig-fgd") {
		t.Errorf("--baseline '' --policy fgd:\n%s", stdout.String())
	}
}

func TestRunMIGBadFlags(t *testing.T) {
	dir := writeFiles(t, map[string]string{"nodes.csv": testNodes, "pods.csv": testPods})
	nodes, pods := filepath.Join(dir, "nodes.csv"), filepath.Join(dir, "pods.csv")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pods", pods}, "--nodes is required"},
		{[]string{"--nodes", nodes}, "--pods is required"},
		{[]string{"--nodes", nodes, "--pods", pods, "--policy", "bestfit"}, `unknown MIG policy "bestfit"`},
		{[]string{"--nodes", nodes, "--pods", pods, "--mig-model", "T4"}, `--mig-model "T4"`},
		{[]string{"--nodes", nodes, "--pods", pods, "--seeds", "x"}, "--seeds"},
		{[]string{"--nodes", nodes, "--pods", pods, "--baseline", "nope"}, "--baseline"},
		{[]string{"--nodes", nodes, "--pods", filepath.Join(dir, "missing.csv")}, "missing.csv"},
	} {
		wantRunError(t, append([]string{"mig"}, tc.args...), tc.want)
	}
}
