package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/tessera-gpu/tessera/allocator"
)

const nodesCSV = `sn,cpu_milli,memory_mib,gpu,model
n-b,32000,131072,2,T4
n-a,64000,262144,4,A100
n-c,16000,65536,0,
`

const podsCSV = `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos
p-0,4000,8192,0,0,,LS
p-1,2000,4096,1,500,,BE
p-2,8000,16384,2,1000,A100|T4,LS
p-3,1000,1024,1,1000,,LS
p-4,1000,1024,1,1200,|T4|,LS
`

func TestReadNodesAndPods(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV), "nodes.csv")
	if err != nil {
		t.Fatal(err)
	}
	wantNodes := []NodeSpec{
		{Name: "n-b", CPUMilli: 32000, MemMiB: 131072, GPUs: 2, Model: "T4"},
		{Name: "n-a", CPUMilli: 64000, MemMiB: 262144, GPUs: 4, Model: "A100"},
		{Name: "n-c", CPUMilli: 16000, MemMiB: 65536},
	}
	if d := cmp.Diff(wantNodes, nodes); d != "" {
		t.Errorf("nodes (-want +got):\n%s", d)
	}
	pods, err := ReadPods(strings.NewReader(podsCSV), "pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	wantPods := []PodSpec{
		{Name: "p-0", Request: allocator.Request{CPUMilli: 4000, MemMiB: 8192}},
		{Name: "p-1", Request: allocator.Request{CPUMilli: 2000, MemMiB: 4096, GPUMilli: 500}},
		{Name: "p-2", Request: allocator.Request{CPUMilli: 8000, MemMiB: 16384, GPUs: 2, Models: []string{"A100", "T4"}}},
		{Name: "p-3", Request: allocator.Request{CPUMilli: 1000, MemMiB: 1024, GPUs: 1}},
		// gpu_milli above 1000 is clamped, as the artifact's converter does;
		// empty model names are dropped.
		{Name: "p-4", Request: allocator.Request{CPUMilli: 1000, MemMiB: 1024, GPUs: 1, Models: []string{"T4"}}},
	}
	if d := cmp.Diff(wantPods, pods); d != "" {
		t.Errorf("pods (-want +got):\n%s", d)
	}
	// The multigpu variants have only the first five columns.
	short := "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,1,300\n"
	if pods, err := ReadPods(strings.NewReader(short), "short.csv"); err != nil || pods[0].Request.GPUMilli != 300 {
		t.Errorf("five-column pod list: %+v, %v", pods, err)
	}
}

func TestReadErrors(t *testing.T) {
	tests := []struct {
		name, input string
		pods        bool
		want        string // substring of the error
	}{
		{"empty file", "", false, "nodes.csv: empty file"},
		{"missing column", "sn,cpu_milli,memory_mib,gpu\nn,1,1,1\n", false, `nodes.csv:1: missing column "model"`},
		{"not an integer", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nm,12x,1,1,T4\n", false, `nodes.csv:3:3: column "cpu_milli": "12x" is not an integer`},
		{"negative", "sn,cpu_milli,memory_mib,gpu,model\nn,1,-5,1,T4\n", false, `nodes.csv:2:5: column "memory_mib": negative value -5`},
		{"duplicate node", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nn,1,1,1,T4\n", false, `nodes.csv:3:1: column "sn": duplicate node "n" (first on line 2)`},
		{"gpus without model", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n", false, `column "model": node with 2 GPUs has no GPU model`},
		{"too many gpus", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1,65,X\n", false, `column "gpu": 65 GPUs`},
		{"wrong field count", "sn,cpu_milli,memory_mib,gpu,model\nn,1,1\n", false, "nodes.csv:2:"},
		{"bad quote", "sn,cpu_milli,memory_mib,gpu,model\nn,\"1,1,1,T4\n", false, "nodes.csv:2:"},
		{"no rows", "sn,cpu_milli,memory_mib,gpu,model\n", false, "nodes.csv: no nodes"},
		{"share of several gpus", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n", true, `pods.csv:2:9: column "gpu_milli": gpu_milli 500 with num_gpu 2`},
		{"gpus with zero milli", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n", true, `column "gpu_milli": pod asks for 1 GPUs with gpu_milli 0`},
		{"empty value", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,,1,1,0\n", true, `pods.csv:2:3: column "cpu_milli": empty value`},
		{"empty pod name", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n,1,1,0,0\n", true, `column "name": empty pod name`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.pods {
				_, err = ReadPods(strings.NewReader(tc.input), "pods.csv")
			} else {
				_, err = ReadNodes(strings.NewReader(tc.input), "nodes.csv")
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestLoadTraceMissingFile(t *testing.T) {
	dir := t.TempDir()
	nodes := filepath.Join(dir, "nodes.csv")
	if err := os.WriteFile(nodes, []byte(nodesCSV), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "nope.csv")
	if _, err := LoadTrace(nodes, missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("LoadTrace with a missing pod list: %v", err)
	}
	if _, err := LoadTrace(missing, nodes); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("LoadTrace with a missing node list: %v", err)
	}
	if got := WorkloadName("/x/openb_pod_list_default.csv"); got != "openb_pod_list_default" {
		t.Errorf("WorkloadName = %q", got)
	}
}
