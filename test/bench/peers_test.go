package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
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
	for _, want := range []string{">100<", ">failed<", ">2.00<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("plot lacks %q", want)
		}
	}
}
