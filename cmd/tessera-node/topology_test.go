package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMain lets the tests run this binary's main as a child process.
func TestMain(m *testing.M) {
	if os.Getenv("TESSERA_NODE_RUN_MAIN") == "1" {
		os.Args = append([]string{"tessera-node"}, strings.Fields(os.Getenv("TESSERA_NODE_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// contract is the JSON contract of `tessera-node topology`, decoded without
// the topology package's types so a renamed field fails here.
type contract struct {
	GPUs []struct {
		Index     *int    `json:"index"`
		UUID      *string `json:"uuid"`
		Model     *string `json:"model"`
		MemoryMiB *int    `json:"memoryMiB"`
		NUMANode  *int    `json:"numaNode"`
		PCIBusID  *string `json:"pciBusID"`
	} `json:"gpus"`
	Links [][]struct {
		Type    string `json:"type"`
		NVLinks *int   `json:"nvlinks"`
	} `json:"links"`
	NVLinkCliques [][]int `json:"nvlinkCliques"`
	NUMANodes     []struct {
		ID   *int    `json:"id"`
		CPUs *string `json:"cpus"`
	} `json:"numaNodes"`
}

func runTopologyJSON(t *testing.T, args ...string) contract {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), append([]string{"topology"}, args...), &stdout, &stderr); err != nil {
		t.Fatalf("topology %v: %v (stderr: %s)", args, err, stderr.String())
	}
	// Decoded leniently: the model may carry more fields than the contract;
	// the pointer fields make a missing contract field visible.
	var c contract
	if err := json.Unmarshal(stdout.Bytes(), &c); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	return c
}

func TestTopologyContract(t *testing.T) {
	tests := []struct {
		machine       string
		wantGPUs      int
		wantMemoryMiB int
		wantNUMA      []int
		wantCliques   [][]int
		// pairs maps "i-j" to the expected link type for a few pairs.
		pairs map[string]string
		// nvlinks maps "i-j" to the expected NVLink count.
		nvlinks map[string]int
	}{
		{
			machine:       "dgx-a100",
			wantGPUs:      8,
			wantMemoryMiB: 40960,
			wantNUMA:      []int{0, 0, 0, 0, 1, 1, 1, 1},
			wantCliques:   [][]int{{0, 1, 2, 3, 4, 5, 6, 7}},
			pairs:         map[string]string{"0-0": "self", "0-7": "nvswitch", "3-4": "nvswitch"},
			nvlinks:       map[string]int{"0-7": 12, "0-0": 0},
		},
		{
			machine:       "dgx-1v",
			wantGPUs:      8,
			wantMemoryMiB: 32768,
			wantNUMA:      []int{0, 0, 0, 0, 1, 1, 1, 1},
			wantCliques:   [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 4}, {1, 5}, {2, 6}, {3, 7}},
			pairs:         map[string]string{"0-1": "nvlink", "0-3": "nvlink", "0-5": "cross-socket", "1-4": "cross-socket", "2-6": "nvlink"},
			nvlinks:       map[string]int{"0-1": 1, "0-2": 1, "0-3": 2, "0-4": 2, "0-5": 0, "1-5": 2, "2-6": 1, "3-7": 1, "6-7": 2, "1-6": 0},
		},
		{
			machine:       "pcie-2numa",
			wantGPUs:      4,
			wantMemoryMiB: 49152,
			wantNUMA:      []int{0, 0, 1, 1},
			wantCliques:   [][]int{{0}, {1}, {2}, {3}},
			pairs:         map[string]string{"0-1": "pcie-switch", "2-3": "pcie-switch", "0-2": "cross-socket", "1-3": "cross-socket"},
			nvlinks:       map[string]int{"0-1": 0, "2-3": 0, "0-3": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.machine, func(t *testing.T) {
			c := runTopologyJSON(t, "--nvml=mock:"+tc.machine)
			if len(c.GPUs) != tc.wantGPUs {
				t.Fatalf("%d gpus, want %d", len(c.GPUs), tc.wantGPUs)
			}
			var numa []int
			for i, g := range c.GPUs {
				if g.Index == nil || g.UUID == nil || g.Model == nil || g.MemoryMiB == nil || g.NUMANode == nil || g.PCIBusID == nil {
					t.Fatalf("gpus[%d] lacks a contract field: %+v", i, g)
				}
				if *g.Index != i || !strings.HasPrefix(*g.UUID, "GPU-") || *g.MemoryMiB != tc.wantMemoryMiB {
					t.Errorf("gpus[%d] = index %d uuid %q memory %d", i, *g.Index, *g.UUID, *g.MemoryMiB)
				}
				numa = append(numa, *g.NUMANode)
			}
			if diff := cmp.Diff(tc.wantNUMA, numa); diff != "" {
				t.Errorf("numaNode per GPU (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantCliques, c.NVLinkCliques); diff != "" {
				t.Errorf("nvlinkCliques (-want +got):\n%s", diff)
			}
			if len(c.NUMANodes) != 2 || c.NUMANodes[0].ID == nil || c.NUMANodes[0].CPUs == nil || *c.NUMANodes[1].ID != 1 {
				t.Errorf("numaNodes = %+v, want ids 0 and 1 with cpus", c.NUMANodes)
			}
			if len(c.Links) != tc.wantGPUs {
				t.Fatalf("links has %d rows, want %d", len(c.Links), tc.wantGPUs)
			}
			for pair, want := range tc.pairs {
				i, j := parsePair(t, pair)
				if got := c.Links[i][j].Type; got != want {
					t.Errorf("links[%d][%d].type = %q, want %q", i, j, got, want)
				}
			}
			for pair, want := range tc.nvlinks {
				i, j := parsePair(t, pair)
				if l := c.Links[i][j]; l.NVLinks == nil || *l.NVLinks != want {
					t.Errorf("links[%d][%d].nvlinks = %v, want %d", i, j, l.NVLinks, want)
				}
			}
			// Every pair is typed, symmetric, and self exactly on the diagonal.
			types := map[string]bool{}
			for i := range c.Links {
				for j := range c.Links[i] {
					l := c.Links[i][j]
					types[l.Type] = true
					if (l.Type == "self") != (i == j) {
						t.Errorf("links[%d][%d].type = %q", i, j, l.Type)
					}
					if c.Links[j][i].Type != l.Type {
						t.Errorf("links[%d][%d] = %q but links[%d][%d] = %q", i, j, l.Type, j, i, c.Links[j][i].Type)
					}
				}
			}
			for typ := range types {
				switch typ {
				case "nvlink", "nvswitch", "pcie-switch", "pcie-host-bridge", "cross-socket", "self":
				default:
					t.Errorf("link type %q is not in the contract", typ)
				}
			}
		})
	}
}

func TestTopologyFromMockFileWithSysfsRoot(t *testing.T) {
	dir := t.TempDir()
	machine := filepath.Join(dir, "m.yaml")
	profile := `apiVersion: tessera.dev/v1alpha1
kind: MockMachine
name: lab
numaNodes: [{id: 0, cpus: "0-7"}]
gpus:
  - {model: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 0, pciBusID: "0000:1b:00.0"}
  - {model: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: 0, pciBusID: "0000:43:00.0"}
nvlinks: [[0, 18], [18, 0]]
`
	if err := os.WriteFile(machine, []byte(profile), 0o644); err != nil {
		t.Fatal(err)
	}
	// A sysfs root of our own that lacks the GPUs' numa_node files.
	sysfs := filepath.Join(dir, "sys")
	if err := os.MkdirAll(filepath.Join(sysfs, "devices/system/node/node0"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sysfs, "devices/system/node/node0/cpulist"), []byte("0-7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := runTopologyJSON(t, "--nvml=mock:"+machine, "--sysfs-root", sysfs)
	if got := *c.GPUs[0].NUMANode; got != -1 {
		t.Errorf("numaNode without a numa_node file = %d, want -1", got)
	}
	if l := c.Links[0][1]; l.Type != "nvlink" || *l.NVLinks != 18 {
		t.Errorf("links[0][1] = %s/%d, want nvlink/18", l.Type, *l.NVLinks)
	}
	if diff := cmp.Diff([][]int{{0, 1}}, c.NVLinkCliques); diff != "" {
		t.Errorf("nvlinkCliques (-want +got):\n%s", diff)
	}
}

// TestExitsWithOneClearLine runs the real binary's main in a child process.
func TestExitsWithOneClearLine(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: tessera.dev/v1alpha1\nkind: MockMachine\nname: x\nnumaNodes: []\ngpus:\n  - {model: M, memoryMiB: -1, numaNode: 0, pciBusID: \"0000:01:00.0\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    string
		wantErr []string
	}{
		// No GPU on this machine: the real backend must fail cleanly. (On a
		// machine with a driver this case would succeed, so it is skipped
		// there rather than reported wrongly.)
		{"no driver", "topology --nvml=real", []string{"libnvidia-ml.so.1"}},
		{"unknown machine", "topology --nvml=mock:nowhere", []string{`unknown mock machine "nowhere"`}},
		{"malformed machine file", "topology --nvml=mock:" + bad, []string{"mock machine " + bad, "memoryMiB"}},
		{"unknown command", "frobnicate", []string{`unknown command "frobnicate"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "no driver" && hasNVML() {
				t.Skip("this machine has libnvidia-ml.so.1")
			}
			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "TESSERA_NODE_RUN_MAIN=1", "TESSERA_NODE_ARGS="+tc.args)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if exit, ok := err.(*exec.ExitError); !ok || exit.ExitCode() == 0 {
				t.Fatalf("exit = %v, want a non-zero exit", err)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout = %q, want nothing", stdout.String())
			}
			// The usage text may precede it; the error itself is one line.
			lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n")
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, "tessera-node: ") {
				t.Errorf("last stderr line = %q, want it to start with tessera-node:", last)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(last, want) {
					t.Errorf("stderr line %q does not contain %q", last, want)
				}
			}
			if tc.name != "unknown command" && len(lines) != 1 {
				t.Errorf("stderr has %d lines, want 1:\n%s", len(lines), stderr.String())
			}
		})
	}
}

func hasNVML() bool {
	for _, dir := range []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib/aarch64-linux-gnu"} {
		if _, err := os.Stat(filepath.Join(dir, "libnvidia-ml.so.1")); err == nil {
			return true
		}
	}
	return false
}

func parsePair(t *testing.T, pair string) (int, int) {
	t.Helper()
	a, b, ok := strings.Cut(pair, "-")
	if !ok {
		t.Fatalf("bad pair %q", pair)
	}
	return atoi(t, a), atoi(t, b)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			t.Fatalf("bad number %q", s)
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// The MIG part of the topology contract, in JSON and text, on the mock
// DGX A100 with MIG (issue 20).
func TestTopologyMIG(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"topology", "--nvml=mock:dgx-a100-mig"}, &stdout, &stderr); err != nil {
		t.Fatalf("topology: %v (stderr: %s)", err, stderr.String())
	}
	var c struct {
		GPUs []struct {
			MIG *struct {
				Instances []struct {
					UUID      string `json:"uuid"`
					Profile   string `json:"profile"`
					Start     *int   `json:"start"`
					Size      int    `json:"size"`
					MemoryMiB int    `json:"memoryMiB"`
				} `json:"instances"`
			} `json:"mig"`
		} `json:"gpus"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	var got []string
	for i, g := range c.GPUs {
		if g.MIG == nil {
			got = append(got, "whole")
			continue
		}
		var parts []string
		for _, in := range g.MIG.Instances {
			if !strings.HasPrefix(in.UUID, "MIG-") || in.Start == nil || in.MemoryMiB == 0 {
				t.Errorf("GPU %d instance %+v", i, in)
				continue
			}
			parts = append(parts, in.Profile)
		}
		got = append(got, strings.Join(parts, ","))
	}
	seven := strings.TrimSuffix(strings.Repeat("1g.5gb,", 7), ",")
	mixed := "3g.20gb,2g.10gb,1g.5gb"
	want := []string{seven, seven, mixed, mixed, "whole", "whole", "whole", "whole"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MIG layouts (-want +got):\n%s", diff)
	}

	stdout.Reset()
	if err := run(context.Background(), []string{"topology", "--nvml=mock:dgx-a100-mig", "--output=text"}, &stdout, &stderr); err != nil {
		t.Fatalf("topology --output=text: %v", err)
	}
	text := stdout.String()
	if n := strings.Count(text, "MIG 1g.5gb"); n != 16 {
		t.Errorf("text output lists %d 1g.5gb instances, want 16:\n%s", n, text)
	}
	for _, s := range []string{"on, 7 instances", "MIG 3g.20gb", "slices 0-3", "slices 4-5", "off"} {
		if !strings.Contains(text, s) {
			t.Errorf("text output lacks %q:\n%s", s, text)
		}
	}
	if err := run(context.Background(), []string{"topology", "--nvml=mock:dgx-a100", "--output=yaml"}, &stdout, &stderr); err == nil {
		t.Error("--output=yaml accepted")
	}
}
