package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/allocator"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/sim"
)

func TestApportion(t *testing.T) {
	for _, tc := range []struct {
		counts []int
		total  int
		want   []int
	}{
		{[]int{549, 387, 107}, 0, []int{0, 0, 0}},
		{[]int{10, 10}, 20, []int{10, 10}},
		{[]int{10, 10}, 99, []int{10, 10}},                             // capped at the counts
		{[]int{6, 3, 1}, 5, []int{3, 2, 0}},                            // quotas 3, 1.5, .5: the larger group wins the tie
		{[]int{1, 1, 1}, 2, []int{1, 1, 0}},                            // equal remainders and counts: the earlier groups
		{[]int{549, 387, 107, 39, 2}, 298, []int{151, 106, 29, 11, 1}}, // 150.92, 106.39, 29.42, 10.72, 0.55
		{[]int{5, 0, 5}, 3, []int{2, 0, 1}},
	} {
		got := apportion(tc.counts, tc.total)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("apportion(%v, %d) = %v, want %v", tc.counts, tc.total, got, tc.want)
		}
		sum := 0
		for i, g := range got {
			sum += g
			if g > tc.counts[i] {
				t.Errorf("apportion(%v, %d): group %d gets %d of %d", tc.counts, tc.total, i, g, tc.counts[i])
			}
		}
	}
}

// synthNodes is a trace cluster of 8-GPU and 2-GPU nodes (named so that
// name order interleaves the types).
func synthNodes(eights, twos int) []sim.NodeSpec {
	var out []sim.NodeSpec
	for i := range eights {
		out = append(out, sim.NodeSpec{Name: fmt.Sprintf("node-%03d", 2*i), CPUMilli: 96000, MemMiB: 393216, GPUs: 8, Model: "G2"})
	}
	for i := range twos {
		out = append(out, sim.NodeSpec{Name: fmt.Sprintf("node-%03d", 2*i+1), CPUMilli: 104000, MemMiB: 524288, GPUs: 2, Model: "T4"})
	}
	return out
}

func TestShapeCluster(t *testing.T) {
	for _, tc := range []struct {
		name          string
		eights, twos  int
		demandMilli   int64
		wantNodes     int
		wantE, wantT  int // 8-GPU and 2-GPU nodes
		wantGPUs      int
		wantFirstName string
	}{
		// 10 x 8 + 10 x 2 = 100 GPUs; half the demand -> half of each type.
		{"half", 10, 10, 50_000, 10, 5, 5, 50, "node-000"},
		{"all", 10, 10, 100_000, 20, 10, 10, 100, "node-000"},
		{"more than the trace", 10, 10, 500_000, 20, 10, 10, 100, "node-000"},
		// 21 GPUs: 2 nodes (1 + 1: 10 GPUs) or 4 (2 + 2: 20 GPUs); 4 is
		// closer.
		{"closest", 10, 10, 21_000, 4, 2, 2, 20, "node-000"},
		// A tie (9 GPUs: one 8-GPU node, or one node of each type with 10)
		// goes to the smaller cluster.
		{"tie", 10, 10, 9_000, 1, 1, 0, 8, "node-000"},
		{"one type", 0, 6, 4_100, 2, 0, 2, 4, "node-001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := shapeCluster(synthNodes(tc.eights, tc.twos), tc.demandMilli)
			if err != nil {
				t.Fatal(err)
			}
			e, tw, gpus := 0, 0, 0
			for i, n := range got {
				if i > 0 && got[i-1].Name >= n.Name {
					t.Errorf("nodes not sorted by name: %s before %s", got[i-1].Name, n.Name)
				}
				switch n.GPUs {
				case 8:
					e++
				case 2:
					tw++
				}
				gpus += n.GPUs
			}
			if len(got) != tc.wantNodes || e != tc.wantE || tw != tc.wantT || gpus != tc.wantGPUs || got[0].Name != tc.wantFirstName {
				t.Errorf("%d nodes (%d of 8 GPUs, %d of 2), %d GPUs, first %s; want %d (%d, %d), %d, %s",
					len(got), e, tw, gpus, got[0].Name, tc.wantNodes, tc.wantE, tc.wantT, tc.wantGPUs, tc.wantFirstName)
			}
		})
	}
	if _, err := shapeCluster(nil, 1000); err == nil {
		t.Error("shapeCluster(no nodes) succeeded")
	}
}

func synthTrace() *sim.Trace {
	tr := &sim.Trace{Workload: "synth", Nodes: synthNodes(4, 4)}
	for i := range 40 {
		var r allocator.Request
		switch i % 4 {
		case 0:
			r = allocator.Request{CPUMilli: 4000, MemMiB: 8192, GPUs: 1}
		case 1:
			r = allocator.Request{CPUMilli: 2000, MemMiB: 4096, GPUMilli: 470}
		case 2:
			r = allocator.Request{CPUMilli: 1000, MemMiB: 1024}
		case 3:
			r = allocator.Request{CPUMilli: 8000, MemMiB: 16384, GPUs: 2}
		}
		tr.Pods = append(tr.Pods, sim.PodSpec{Name: fmt.Sprintf("pod-%02d", i), Request: r})
	}
	return tr
}

func TestSampleTrace(t *testing.T) {
	tr := synthTrace()
	for _, tc := range []struct {
		n       int
		seed    int64
		wantErr bool
	}{
		{10, 42, false},
		{10, 43, false},
		{40, 42, false},
		{0, 42, true},
		{41, 42, true},
	} {
		s, err := sampleTrace(tr, tc.n, tc.seed)
		if (err != nil) != tc.wantErr {
			t.Errorf("sampleTrace(%d, %d): err = %v, want an error: %v", tc.n, tc.seed, err, tc.wantErr)
			continue
		}
		if err != nil {
			continue
		}
		again, _ := sampleTrace(tr, tc.n, tc.seed)
		if !reflect.DeepEqual(s.pods, again.pods) || !reflect.DeepEqual(s.nodes, again.nodes) {
			t.Errorf("sampleTrace(%d, %d) differs between two calls", tc.n, tc.seed)
		}
		if len(s.pods) != tc.n {
			t.Errorf("sampleTrace(%d, %d): %d pods", tc.n, tc.seed, len(s.pods))
		}
		var demand int64
		seen := map[string]bool{}
		for i, p := range s.pods {
			if seen[p.Name] {
				t.Errorf("pod %s sampled twice", p.Name)
			}
			seen[p.Name] = true
			if i > 0 && s.pods[i-1].Name >= p.Name {
				t.Errorf("sample not in the trace's order: %s before %s", s.pods[i-1].Name, p.Name)
			}
			demand += p.Request.TotalGPUMilli()
		}
		if demand != s.demandMilli {
			t.Errorf("demand %d, want %d", s.demandMilli, demand)
		}
		if tc.n == len(tr.Pods) && !reflect.DeepEqual(s.pods, tr.Pods) {
			t.Error("the whole pod list sampled is not the pod list")
		}
	}
	a, _ := sampleTrace(tr, 10, 42)
	b, _ := sampleTrace(tr, 10, 43)
	if reflect.DeepEqual(a.pods, b.pods) {
		t.Error("seeds 42 and 43 drew the same sample")
	}
}

func TestTraceGPULimits(t *testing.T) {
	share := allocator.Request{CPUMilli: 6000, MemMiB: 12288, GPUMilli: 465}
	two := allocator.Request{GPUs: 2}
	cpu := allocator.Request{CPUMilli: 1000}
	for _, tc := range []struct {
		system    string
		r         allocator.Request
		want      map[v1.ResourceName]int64
		wantName  string
		wantMilli int64 // allocatedMilli
	}{
		{sysTessera, share, map[v1.ResourceName]int64{api.ResourceGPUCore: 47}, "share465", 470},
		{sysPlugin, share, map[v1.ResourceName]int64{api.ResourceGPUCore: 47}, "share465", 470},
		{sysHAMi, share, map[v1.ResourceName]int64{hamiResourceGPU: 1, hamiResourceCores: 47, hamiResourceMemPercent: 47}, "share465", 470},
		{sysKube, share, map[v1.ResourceName]int64{api.ResourceGPU: 1}, "share465-as-1gpu", 1000},
		{sysSP, share, map[v1.ResourceName]int64{api.ResourceGPU: 1}, "share465-as-1gpu", 1000},
		{sysTessera, two, map[v1.ResourceName]int64{api.ResourceGPU: 2}, "2gpu", 2000},
		{sysPlugin, two, map[v1.ResourceName]int64{api.ResourceGPU: 2}, "2gpu", 2000},
		{sysHAMi, two, map[v1.ResourceName]int64{hamiResourceGPU: 2}, "2gpu", 2000},
		{sysSP, two, map[v1.ResourceName]int64{api.ResourceGPU: 2}, "2gpu", 2000},
		{sysHAMi, cpu, map[v1.ResourceName]int64{}, "cpu", 0},
	} {
		limits, name := traceGPULimits(tc.system, tc.r)
		got := map[v1.ResourceName]int64{}
		for k, q := range limits {
			got[k] = q.Value()
		}
		if !reflect.DeepEqual(got, tc.want) || name != tc.wantName {
			t.Errorf("%s %+v: %v %q, want %v %q", tc.system, tc.r, got, name, tc.want, tc.wantName)
		}
		pod := tracePod(tc.system, "ns", "sched", "run", 7, sim.PodSpec{Name: "p", Request: tc.r})
		if m := allocatedMilli(pod); m != tc.wantMilli {
			t.Errorf("%s %+v: allocatedMilli = %d, want %d", tc.system, tc.r, m, tc.wantMilli)
		}
		if c := pod.Spec.Containers[0].Resources.Requests[v1.ResourceCPU]; c.MilliValue() != tc.r.CPUMilli {
			t.Errorf("%s %+v: CPU request %s", tc.system, tc.r, c.String())
		}
		if pod.Annotations[traceIndexAnnotation] != "7" {
			t.Errorf("%s: index annotation %q", tc.system, pod.Annotations[traceIndexAnnotation])
		}
	}
}

// TestTraceOutcome checks the metric: the bound pods' GPU requests as the
// system was asked against the cluster's GPUs, through sim.BinEvents.
func TestTraceOutcome(t *testing.T) {
	// 2 nodes x 2 GPUs; pods: 1 GPU, a 500-milli share, a 250-milli
	// share, CPU only, 2 GPUs. Demand 1000+500+250+2000 = 3750 of 4000:
	// 93.75 % arrived, rounded to 94.
	s := &traceSample{
		trace: &sim.Trace{Workload: "synth"},
		nodes: []sim.NodeSpec{{Name: "a", CPUMilli: 8000, MemMiB: 8192, GPUs: 2}, {Name: "b", CPUMilli: 8000, MemMiB: 8192, GPUs: 2}},
		pods: []sim.PodSpec{
			{Name: "whole", Request: allocator.Request{GPUs: 1}},
			{Name: "half", Request: allocator.Request{GPUMilli: 500}},
			{Name: "quarter", Request: allocator.Request{GPUMilli: 250}},
			{Name: "cpu", Request: allocator.Request{CPUMilli: 100}},
			{Name: "two", Request: allocator.Request{GPUs: 2}},
		},
		demandMilli: 3750,
	}
	podsOf := func(system string, bound ...int) []v1.Pod {
		var out []v1.Pod
		for i, p := range s.pods {
			pod := tracePod(system, "ns", "sched", "run", i, p)
			for _, b := range bound {
				if b == i {
					pod.Spec.NodeName = "a"
				}
			}
			out = append(out, *pod)
		}
		return out
	}
	for _, tc := range []struct {
		name        string
		pods        []v1.Pod
		placed      int
		pending     [3]int
		alloc       int64
		demand      int64
		unallocated float64
	}{
		// tessera places all: 3750 of 4000 allocated.
		{"tessera all", podsOf(sysTessera, 0, 1, 2, 3, 4), 5, [3]int{}, 3750, 3750, 6.25},
		{"tessera-plugin all", podsOf(sysPlugin, 0, 1, 2, 3, 4), 5, [3]int{}, 3750, 3750, 6.25},
		// HAMi without the 2-GPU pod: 1750 of 4000.
		{"hami", podsOf(sysHAMi, 0, 1, 2, 3), 4, [3]int{allocator.Whole: 1}, 1750, 1750, 56.25},
		// kube-scheduler: the shares took a whole GPU each, the 2-GPU pod
		// found none: 3000 allocated, 1750 of the trace's demand placed.
		{"kube", podsOf(sysKube, 0, 1, 2, 3), 4, [3]int{allocator.Whole: 1}, 3000, 1750, 25},
		{"none", podsOf(sysSP), 0, [3]int{allocator.CPUOnly: 1, allocator.Shared: 2, allocator.Whole: 2}, 0, 0, 100},
	} {
		o, err := traceOutcomeOf(s, tc.pods)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if o.placed != tc.placed || o.pendingBy != tc.pending || o.allocMilli != tc.alloc || o.demandMilli != tc.demand ||
			o.point.UnallocatedPct != tc.unallocated || o.point.ArrivedPct != 94 {
			t.Errorf("%s: placed %d pending %v alloc %d demand %d point %+v; want %d %v %d %d unallocated %.2f at 94%%",
				tc.name, o.placed, o.pendingBy, o.allocMilli, o.demandMilli, o.point, tc.placed, tc.pending, tc.alloc, tc.demand, tc.unallocated)
		}
	}
	missing := podsOf(sysTessera)[:4]
	if _, err := traceOutcomeOf(s, missing); err == nil {
		t.Error("a missing pod was not an error")
	}
	dup := append(podsOf(sysTessera)[:4], podsOf(sysTessera)[0])
	if _, err := traceOutcomeOf(s, dup); err == nil {
		t.Error("a repeated pod was not an error")
	}

	// The simulator's replay of the same pods, the 2-GPU pod first: it
	// takes a node, and the others have one place each; 3750 of 4000.
	first := append([]sim.PodSpec{s.pods[4]}, s.pods[:4]...)
	ss := &traceSample{trace: &sim.Trace{Workload: "synth", Pods: first}, nodes: s.nodes, pods: first, demandMilli: s.demandMilli}
	for _, sp := range simPolicies() {
		o, err := sp.simulate(ss)
		if err != nil {
			t.Fatal(err)
		}
		if o.placed != 5 || o.allocMilli != 3750 || o.point.UnallocatedPct != 6.25 || o.point.ArrivedPct != 94 {
			t.Errorf("simulated %s: placed %d, allocated %d, point %+v", sp.name, o.placed, o.allocMilli, o.point)
		}
	}
}

// traceDirTB is the Alibaba trace next to the repository; a test that needs
// it fails under CI=true when it is missing and is skipped elsewhere
// (../shared/traces/README.md).
func traceDirTB(tb testing.TB) string {
	tb.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "..", "shared", "traces", "alibaba-gpu-v2023"))
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "openb_node_list_gpu_node.csv")); err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("the Alibaba GPU trace is missing at %s and CI=true: %v", dir, err)
		}
		tb.Skipf("the Alibaba GPU trace is not at %s (%v); skipping (under CI=true this fails)", dir, err)
	}
	return dir
}

// TestTraceSampleDefault draws the benchmark's default sample from the real
// trace: the pod list must be in creation order (the replay's arrival
// order relies on it), and the cluster must keep the trace's node mix and
// match the sample's GPU request.
func TestTraceSampleDefault(t *testing.T) {
	dir := traceDirTB(t)
	pods := filepath.Join(dir, "openb_pod_list_default.csv")
	f, err := os.Open(pods)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := -1
	for i, h := range rows[0] {
		if h == "creation_time" {
			col = i
		}
	}
	if col < 0 {
		t.Fatalf("%s has no creation_time column", pods)
	}
	prev := int64(-1)
	for i, r := range rows[1:] {
		ct, err := strconv.ParseInt(r[col], 10, 64)
		if err != nil || ct < prev {
			t.Fatalf("%s row %d: creation_time %q before %d: the pod list is not in creation order", pods, i+2, r[col], prev)
		}
		prev = ct
	}

	tr, err := sim.LoadTrace(filepath.Join(dir, "openb_node_list_gpu_node.csv"), pods)
	if err != nil {
		t.Fatal(err)
	}
	s, err := sampleTrace(tr, 2000, 42)
	if err != nil {
		t.Fatal(err)
	}
	arrived := float64(s.demandMilli) / float64(s.gpus()) / 10
	if arrived < 99.5 || arrived > 100.5 {
		t.Errorf("the sample asks for %.2f%% of the cluster's GPUs, want 100 ± 0.5", arrived)
	}
	// Each node type's share of the cluster is its share of the trace's
	// nodes, within one node.
	count := func(nodes []sim.NodeSpec) map[string]int {
		m := map[string]int{}
		for _, n := range nodes {
			m[fmt.Sprintf("%s/%d/%d/%d", n.Model, n.GPUs, n.CPUMilli, n.MemMiB)]++
		}
		return m
	}
	all, got := count(tr.Nodes), count(s.nodes)
	for k, n := range all {
		want := float64(n) * float64(len(s.nodes)) / float64(len(tr.Nodes))
		if d := float64(got[k]) - want; d <= -1 || d >= 1 {
			t.Errorf("node type %s: %d nodes, want %.2f", k, got[k], want)
		}
	}
	t.Logf("sample: %d pods, %.1f GPUs asked; cluster: %d nodes, %d GPUs (%.2f%% arrived)", len(s.pods), float64(s.demandMilli)/1000, len(s.nodes), s.gpus(), arrived)
}

func TestCheckAssignments(t *testing.T) {
	ref := func(i int) api.GPURef { return api.GPURef{UUID: gpuUUID("n", i), Index: i} }
	pod := func(r allocator.Request, bound bool, cs ...api.ContainerAssignment) v1.Pod {
		p := tracePod(sysTessera, "ns", "sched", "run", 0, sim.PodSpec{Name: "p", Request: r})
		if bound {
			p.Spec.NodeName = "n"
		}
		if len(cs) > 0 {
			a := api.NewAssignment()
			a.Containers = cs
			if err := api.SetAssignment(p.Annotations, a); err != nil {
				t.Fatal(err)
			}
		}
		return *p
	}
	whole := func(is ...int) api.ContainerAssignment {
		c := api.ContainerAssignment{Name: "main"}
		for _, i := range is {
			c.GPUs = append(c.GPUs, ref(i))
		}
		return c
	}
	slice := func(i int, cores int64) api.ContainerAssignment {
		return api.ContainerAssignment{Name: "main", Shared: &api.SharedGPU{GPU: ref(i), MemoryMiB: 256 * cores, Cores: cores}}
	}
	one, two, share := allocator.Request{GPUs: 1}, allocator.Request{GPUs: 2}, allocator.Request{GPUMilli: 600}
	for _, tc := range []struct {
		name string
		pods []v1.Pod
		want assignmentCheck
	}{
		{"clean", []v1.Pod{pod(two, true, whole(0, 1)), pod(share, true, slice(2, 60)), pod(share, true, slice(3, 60)), pod(allocator.Request{GPUMilli: 400}, true, slice(2, 40))},
			assignmentCheck{gpus: 4}},
		{"two whole pods on a GPU", []v1.Pod{pod(one, true, whole(0)), pod(two, true, whole(0, 1))}, assignmentCheck{gpus: 2, overcommitted: 1}},
		{"whole and a slice", []v1.Pod{pod(one, true, whole(0)), pod(share, true, slice(0, 60))}, assignmentCheck{gpus: 1, overcommitted: 1}},
		{"slices over 100 cores", []v1.Pod{pod(share, true, slice(0, 60)), pod(share, true, slice(0, 60))}, assignmentCheck{gpus: 1, overcommitted: 1}},
		{"unrecorded", []v1.Pod{pod(one, true), pod(share, true), pod(one, false), pod(allocator.Request{CPUMilli: 1}, true)},
			assignmentCheck{wholeUnrecorded: 1, sliceUnplaced: 1}},
	} {
		got, err := checkAssignments(tc.pods)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if (got.overcommit != "") != (tc.want.overcommitted > 0) {
			t.Errorf("%s: over-committed GPUs named %q", tc.name, got.overcommit)
		}
		if tc.name == "whole and a slice" && !strings.HasSuffix(got.overcommit, "-0000: run-00000-1gpu (whole), run-00000-share600 (60 cores)") {
			t.Errorf("%s: over-committed GPUs named %q", tc.name, got.overcommit)
		}
		got.overcommit = ""
		if *got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, *got, tc.want)
		}
	}
}
