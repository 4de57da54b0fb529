package preferred

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

const (
	memR  = api.ResourceGPUMemory
	coreR = api.ResourceGPUCore
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// slicePod is a pod created at t0+sec whose one container "c" asks for
// mem memory units and cores cores of gpus.
func slicePod(name string, sec int, mem, cores int64, gpus ...string) devices.SlicePod {
	return devices.SlicePod{
		Namespace: "ns", Name: name, UID: "uid-" + name, Created: t0.Add(time.Duration(sec) * time.Second),
		Containers: []devices.SliceContainer{{Name: "c", Units: units(mem, cores), GPUs: gpus}},
	}
}

func units(mem, cores int64) map[corev1.ResourceName]int64 {
	u := map[corev1.ResourceName]int64{}
	if mem > 0 {
		u[memR] = mem
	}
	if cores > 0 {
		u[coreR] = cores
	}
	return u
}

func listed(names ...string) map[PodKey]bool {
	m := map[PodKey]bool{}
	for _, n := range names {
		m[PodKey{"ns", n}] = true
	}
	return m
}

// byName: the containers (pod/container) hold devices of r, by pod name.
func byName(r corev1.ResourceName, keys ...[2]string) map[AllocKey]bool {
	m := map[AllocKey]bool{}
	for _, k := range keys {
		m[AllocKey{Namespace: "ns", Name: k[0], Container: k[1], Resource: r}] = true
	}
	return m
}

func TestAdmitting(t *testing.T) {
	const g0, g1, g2, g7 = "GPU-0", "GPU-1", "GPU-2", "GPU-7"
	withInit := devices.SlicePod{Namespace: "ns", Name: "init", UID: "uid-init", Created: t0, Containers: []devices.SliceContainer{
		{Name: "setup", Init: true, Units: units(4, 0), GPUs: []string{g2}},
		{Name: "side", Units: units(2, 0), GPUs: []string{g1}},
		{Name: "main", Units: units(4, 10), GPUs: []string{g2}},
	}}
	for _, tc := range []struct {
		name string
		r    corev1.ResourceName
		size int
		pods []devices.SlicePod
		view KubeletView
		want string // pod/container, "" for no answer
		gpus []string
	}{
		{name: "no slices", r: memR, size: 8},
		{name: "one slice", r: memR, size: 8, pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7)}, want: "a/c", gpus: []string{g7}},
		{name: "the oldest of equal slices", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("b", 1, 8, 20, g0), slicePod("a", 2, 8, 20, g7)}, want: "b/c", gpus: []string{g0}},
		{name: "same second: by name", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("b", 0, 8, 20, g0), slicePod("a", 0, 8, 20, g7)}, want: "a/c", gpus: []string{g7}},
		{name: "the oldest that matches the size", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("old", 0, 4, 20, g0), slicePod("new", 5, 8, 20, g7)}, want: "new/c", gpus: []string{g7}},
		{name: "the resource matters: a memory-only slice is not a core call", r: coreR, size: 20,
			pods: []devices.SlicePod{slicePod("old", 0, 8, 0, g0), slicePod("new", 5, 8, 20, g7)}, want: "new/c", gpus: []string{g7}},
		{name: "nothing matches", r: memR, size: 3,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g0), slicePod("b", 1, 4, 20, g7)}},
		{name: "a pod whose units the kubelet allocated is not the one", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7), slicePod("b", 1, 8, 20, g0)},
			view: KubeletView{Allocated: byName(memR, [2]string{"a", "c"})}, want: "b/c", gpus: []string{g0}},
		{name: "its cores not yet: still the one for cores", r: coreR, size: 20,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7), slicePod("b", 1, 8, 20, g0)},
			view: KubeletView{Allocated: byName(memR, [2]string{"a", "c"})}, want: "a/c", gpus: []string{g7}},
		{name: "allocated by UID (the checkpoint)", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7), slicePod("b", 1, 8, 20, g0)},
			view: KubeletView{Allocated: map[AllocKey]bool{{UID: "uid-a", Container: "c", Resource: memR}: true}}, want: "b/c", gpus: []string{g0}},
		{name: "a pod the kubelet does not list yet is not the one", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7), slicePod("b", 1, 8, 20, g0)},
			view: KubeletView{Listed: listed("b"), Allocated: map[AllocKey]bool{}}, want: "b/c", gpus: []string{g0}},
		{name: "listed, all allocated: none", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("a", 0, 8, 20, g7)},
			view: KubeletView{Listed: listed("a"), Allocated: byName(memR, [2]string{"a", "c"})}},
		{name: "trust filter dropped the assignment: no answer", r: memR, size: 8,
			pods: []devices.SlicePod{slicePod("forged", 0, 8, 20), slicePod("b", 1, 8, 20, g0)}},
		{name: "multi-GPU slice: its GPUs", r: memR, size: 16,
			pods: []devices.SlicePod{slicePod("m", 0, 16, 40, g1, g2)}, want: "m/c", gpus: []string{g1, g2}},
		{name: "init container first", r: memR, size: 4, pods: []devices.SlicePod{withInit}, want: "init/setup", gpus: []string{g2}},
		{name: "then the sidecar", r: memR, size: 2, pods: []devices.SlicePod{withInit}, want: "init/side", gpus: []string{g1}},
		{name: "init units passed on once a later container holds some", r: memR, size: 4, pods: []devices.SlicePod{withInit},
			view: KubeletView{Allocated: byName(memR, [2]string{"init", "side"})}, want: "init/main", gpus: []string{g2}},
		{name: "the checkpoint lists the init container's units", r: memR, size: 2, pods: []devices.SlicePod{withInit},
			view: KubeletView{Allocated: map[AllocKey]bool{{UID: "uid-init", Container: "setup", Resource: memR}: true}}, want: "init/side", gpus: []string{g1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Admitting(tc.r, tc.size, tc.pods, tc.view)
			if tc.want == "" {
				if ok {
					t.Fatalf("Admitting = %+v, want none", got)
				}
				return
			}
			if !ok {
				t.Fatalf("Admitting: none, want %s", tc.want)
			}
			if g := got.Name + "/" + got.Container; g != tc.want {
				t.Errorf("Admitting = %s, want %s", g, tc.want)
			}
			if diff := cmp.Diff(tc.gpus, got.GPUs); diff != "" {
				t.Errorf("GPUs (-want +got):\n%s", diff)
			}
		})
	}
}

func TestUnitsOn(t *testing.T) {
	const a, b, c = "GPU-aaaa0000", "GPU-bbbb0000", "GPU-cccc0000"
	mem := func(u string, n int) string { return devices.DeviceID(memR, u, n) }
	// per GPU: a has 10 free, b 4, c 6.
	avail := unitIDs("", map[string][]int{a: seq(0, 10), b: seq(20, 24), c: seq(0, 6)})
	for _, tc := range []struct {
		name   string
		must   []string
		size   int
		target []string
		rank   map[string]int
		want   map[string]int // units per GPU
	}{
		{"the target before the best fit", nil, 4, []string{c}, nil, map[string]int{c: 4}},
		{"the target above every rank", nil, 4, []string{a}, map[string]int{b: 3, c: 2}, map[string]int{a: 4}},
		{"a target too small is filled, then the ranks", nil, 8, []string{c}, map[string]int{a: 1}, map[string]int{c: 6, a: 2}},
		{"must-include first", []string{mem(b, 20)}, 4, []string{c}, nil, map[string]int{b: 4}},
		{"multi-GPU: even split", nil, 8, []string{a, c}, nil, map[string]int{a: 4, c: 4}},
		{"multi-GPU: a GPU too small: packed on the targets", nil, 10, []string{b, c}, nil, map[string]int{c: 6, b: 4}},
		{"multi-GPU: uneven size: packed on the targets", nil, 5, []string{a, c}, nil, map[string]int{c: 5}},
		{"multi-GPU with must-include: packed", []string{mem(a, 0)}, 4, []string{a, c}, nil, map[string]int{a: 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := UnitsOn(memR, avail, tc.must, tc.size, tc.target, tc.rank)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, perGPU(t, memR, got)); diff != "" {
				t.Errorf("units per GPU (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := UnitsOn(memR, []string{"junk"}, nil, 2, []string{a, b}, nil); err == nil {
		t.Error("malformed available unit gave no error")
	}
}

// The burst on the demo cluster: four 8-unit slices and a later one, on
// GPUs 7 and 0, admitted by the kubelet one at a time in creation order
// (each listed once it is being admitted, holding its units after). Every
// slice's units come from its own GPU; with the GPUs of all unstarted
// slices ranked alike (before), r-s1's came from GPU 0 and ag-s1's from
// GPU 7.
func TestBurstUnitsLandOnTheAssignedGPUs(t *testing.T) {
	const g0, g7 = "GPU-0000", "GPU-7777"
	pods := []devices.SlicePod{
		slicePod("r-s1", 0, 8, 20, g7),
		slicePod("r-s2", 0, 8, 20, g0),
		slicePod("r-s3", 1, 8, 20, g0),
		slicePod("r-s4", 1, 8, 20, g0),
		slicePod("ag-s1", 3, 8, 20, g0),
	}
	free := map[corev1.ResourceName]map[string][]int{
		memR:  {g0: seq(0, 39), g7: seq(0, 39)},
		coreR: {g0: seq(0, 100), g7: seq(0, 100)},
	}
	view := KubeletView{Listed: map[PodKey]bool{}, Allocated: map[AllocKey]bool{}}
	for _, p := range pods { // the kubelet's order
		view.Listed[PodKey{p.Namespace, p.Name}] = true
		for _, r := range []corev1.ResourceName{coreR, memR} {
			var avail []string
			for uuid, ns := range free[r] {
				for _, n := range ns {
					avail = append(avail, devices.DeviceID(r, uuid, n))
				}
			}
			size := int(p.Containers[0].Units[r])
			rank := map[string]int{g0: 3, g7: 3} // both unstarted
			var got []string
			var err error
			if adm, ok := Admitting(r, size, pods, view); ok {
				got, err = UnitsOn(r, avail, nil, size, adm.GPUs, rank)
			} else {
				got, err = Units(r, avail, nil, size, rank)
			}
			if err != nil || len(got) != size {
				t.Fatalf("%s %s: %v, %v", p.Name, r, got, err)
			}
			for _, id := range got {
				uuid, n, _ := devices.ParseDeviceID(r, id)
				if uuid != p.Containers[0].GPUs[0] {
					t.Errorf("%s: %s unit %s is not of its GPU %s", p.Name, r, id, p.Containers[0].GPUs[0])
				}
				for i, m := range free[r][uuid] {
					if m == n {
						free[r][uuid] = append(free[r][uuid][:i:i], free[r][uuid][i+1:]...)
						break
					}
				}
			}
			view.Allocated[AllocKey{Namespace: p.Namespace, Name: p.Name, Container: "c", Resource: r}] = true
		}
	}
}
