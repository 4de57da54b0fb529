package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

func TestSummarize(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := summarize(d, 2)
	if s.calls != 100 || s.errors != 2 || s.p50 != 50*time.Millisecond || s.p99 != 99*time.Millisecond ||
		s.max != 100*time.Millisecond || s.mean != 50500*time.Microsecond {
		t.Errorf("summarize = %+v", s)
	}
	if e := summarize(nil, 0); e.calls != 0 || e.p99 != 0 {
		t.Errorf("summarize(nil) = %+v", e)
	}
}

func TestHAMiRegisterAnnotation(t *testing.T) {
	raw, err := hamiRegister("bench-node-00001")
	if err != nil {
		t.Fatal(err)
	}
	var devs []map[string]any
	if err := json.Unmarshal([]byte(raw), &devs); err != nil {
		t.Fatal(err)
	}
	if len(devs) != gpusPerNode {
		t.Fatalf("%d devices, want %d", len(devs), gpusPerNode)
	}
	if devs[3]["id"] != gpuUUID("bench-node-00001", 3) || devs[3]["devmem"] != float64(gpuMemMiB) ||
		devs[3]["count"] != float64(hamiSplitCount) || devs[3]["health"] != true || devs[3]["type"] != gpuModel {
		t.Errorf("device 3 = %v", devs[3])
	}
	n, err := peerNode("bench-node-00001")
	if err != nil {
		t.Fatal(err)
	}
	if q := n.Status.Allocatable[hamiResourceGPU]; q.Value() != gpusPerNode*hamiSplitCount {
		t.Errorf("allocatable %s = %s", hamiResourceGPU, q.String())
	}
}

func TestPeerSchedulerConfigs(t *testing.T) {
	for name, text := range map[string]string{
		"hami":              hamiSchedulerConfig("http://127.0.0.1:1", "hami-scheduler"),
		"scheduler-plugins": spSchedulerConfig("/tmp/kubeconfig"),
	} {
		var cfg map[string]any
		if err := yaml.UnmarshalStrict([]byte(text), &cfg); err != nil {
			t.Errorf("%s: %v\n%s", name, err, text)
			continue
		}
		if cfg["kind"] != "KubeSchedulerConfiguration" {
			t.Errorf("%s: kind %v", name, cfg["kind"])
		}
	}
	if !strings.Contains(hamiSchedulerConfig("http://x", "p"), "{name: nvidia.com/gpucores, ignoredByScheduler: true}") {
		t.Error("HAMi config does not hand nvidia.com/gpucores to the extender")
	}
}

func TestPeerPods(t *testing.T) {
	p := peerPod(sysHAMi, "ns", "hami-scheduler", "r", 1, shapeOf(wlMixed, 1))
	lim := p.Spec.Containers[0].Resources.Limits
	if lim.Name(hamiResourceGPU, "").Value() != 1 || lim.Name(hamiResourceMem, "").Value() != 10*memUnitMiB || lim.Name(hamiResourceCores, "").Value() != 25 {
		t.Errorf("HAMi slice limits %v", lim)
	}
	p = peerPod(sysSP, "ns", spProfile, "r", 3, shapeOf(wlWhole, 3))
	if q := p.Spec.Containers[0].Resources.Limits.Name("tessera.dev/gpu", ""); q.Value() != 4 || p.Labels[runLabel] != "r" {
		t.Errorf("whole pod 3: %v %v", p.Spec.Containers[0].Resources.Limits, p.Labels)
	}
}

func TestPeersSVG(t *testing.T) {
	c := &config{nodes: []int{200}, pods: 200, peers: peerConfig{systems: allSystems, workloads: allWorkloads, gangMembers: []int{16}, gangGPUs: 8}}
	results := []peerResult{
		{nodes: 200, system: sysKube, workload: wlWhole, res: runResult{pods: 200, boundIn: 2 * time.Second}},
		{nodes: 200, system: sysHAMi, workload: wlMixed, err: io.EOF},
		{nodes: 200, system: sysTessera, workload: wlGang, gangMembers: 16, gangs: []time.Duration{time.Second, 3 * time.Second}},
		{nodes: 200, system: sysPlugin, workload: wlMixed, res: runResult{pods: 200, boundIn: 4 * time.Second}},
	}
	svg := peersSVG(c, results)
	dec := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("not XML: %v\n%s", err, svg)
		}
	}
	for _, want := range []string{">100<", ">failed<", ">2.00<", ">50.0<", systemColor[sysPlugin], ">" + systemLabel[sysPlugin] + "<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
}

// TestPeerSystems checks what each system is given: tessera-plugin runs
// what tessera runs (Tessera's resources, slices, gangs all or nothing,
// the gang gate), and every system has a label, a colour and a run name
// of its own.
func TestPeerSystems(t *testing.T) {
	short, colour := map[string]bool{}, map[string]bool{}
	for _, s := range allSystems {
		if systemLabel[s] == "" || systemColor[s] == "" {
			t.Errorf("%s: label %q, colour %q", s, systemLabel[s], systemColor[s])
		}
		if short[shortName(s)] || colour[systemColor[s]] {
			t.Errorf("%s: run name %q or colour %s taken", s, shortName(s), systemColor[s])
		}
		short[shortName(s)], colour[systemColor[s]] = true, true
	}
	for _, tc := range []struct {
		system                             string
		tessera, shares, mixed, gangsWhole bool
	}{
		{sysKube, false, false, false, false},
		{sysTessera, true, true, true, true},
		{sysPlugin, true, true, true, true},
		{sysHAMi, false, true, true, false},
		{sysSP, false, false, false, true},
	} {
		if isTessera(tc.system) != tc.tessera || sharesGPU(tc.system) != tc.shares || supports(tc.system, wlMixed) != tc.mixed ||
			allOrNothing(tc.system) != tc.gangsWhole || !supports(tc.system, wlWhole) || !supports(tc.system, wlGang) {
			t.Errorf("%s: isTessera %v, sharesGPU %v, mixed %v, all or nothing %v; want %+v", tc.system,
				isTessera(tc.system), sharesGPU(tc.system), supports(tc.system, wlMixed), allOrNothing(tc.system), tc)
		}
	}
	// The same pod for tessera and tessera-plugin but for the scheduler.
	for i := range 8 {
		a := peerPod(sysTessera, "ns", "s", "r", i, shapeOf(wlMixed, i))
		b := peerPod(sysPlugin, "ns", "s", "r", i, shapeOf(wlMixed, i))
		if !reflect.DeepEqual(a, b) {
			t.Errorf("pod %d: tessera %+v, tessera-plugin %+v", i, a.Spec, b.Spec)
		}
	}
}

func TestPluginFlags(t *testing.T) {
	got := pluginFlags("/k", "127.0.0.1:1", []string{"--filter-shortlist=0"})
	want := []string{"--kubeconfig=/k", "--listen=127.0.0.1:1", "--policy=binpack", "--filter-shortlist=0"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("pluginFlags = %q, want %q", got, want)
	}
}

// TestReportLatencyPlugin checks that tessera-plugin, which calls the
// extender in process, gets "-" for the verbs (not zeros), and that the
// placements read from the extender's /metrics are reported for both
// Tessera systems.
func TestReportLatencyPlugin(t *testing.T) {
	c := &config{peers: peerConfig{gangGPUs: 8}}
	results := []peerResult{
		{nodes: 10, system: sysTessera, workload: wlWhole, latency: map[string]latencySummary{"filter": summarize([]time.Duration{time.Millisecond}, 0)},
			placements: map[string]float64{"whole": 100}},
		{nodes: 10, system: sysPlugin, workload: wlWhole, placements: map[string]float64{"whole": 98, "shared": 2}},
		{nodes: 10, system: sysKube, workload: wlWhole},
	}
	var b strings.Builder
	reportLatency(&b, c, results)
	out := b.String()
	var rows []string // the table rows, fields single-spaced
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "10" {
			rows = append(rows, strings.Join(f, " "))
		}
	}
	want := []string{
		"10 tessera whole filter 1 0 1.00ms 1.00ms 1.00ms 1.00ms",
		"10 tessera-plugin whole - - - - - - -",
		// placements: the total, then the kinds sorted (shared, whole).
		"10 tessera whole 100 0 100",
		"10 tessera-plugin whole 100 2 98",
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows %q, want %q\n%s", rows, want, out)
	}
}
