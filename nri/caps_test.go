package nri

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tessera-gpu/tessera/api"
)

const migMinors = `config 1
monitor 2
gpu0/gi1/access 12
gpu0/gi1/ci0/access 13
gpu0/gi2/access 21
gpu0/gi2/ci0/access 22
gpu1/gi1/access 111
gpu1/gi1/ci0/access 112

gpu1/gi3/access 130
gpu1/gi3/ci0/access 131
`

func TestParseMIGMinors(t *testing.T) {
	got, err := ParseMIGMinors(strings.NewReader(migMinors))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 || got["gpu0/gi1/ci0/access"] != 13 || got["config"] != 1 || got["gpu1/gi3/access"] != 130 {
		t.Errorf("ParseMIGMinors = %v", got)
	}
	for _, tc := range []struct{ in, want string }{
		{"gpu0/gi1/access", `line 1: "gpu0/gi1/access" is not "<name> <minor>"`},
		{"gpu0/gi1/access 12 13", "line 1"},
		{"config 1\ngpu0/gi1/access x", `line 2: "x" is not a device minor`},
		{"gpu0/gi1/access -1", "is not a device minor"},
		{"a 1\na 2", "line 2: a is listed twice"},
	} {
		if _, err := ParseMIGMinors(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseMIGMinors(%q) = %v, want an error containing %q", tc.in, err, tc.want)
		}
	}
}

func FuzzParseMIGMinors(f *testing.F) {
	f.Add(migMinors)
	f.Add("gpu0/gi1/access 12\n")
	f.Add("a 1\na 1")
	f.Add(" \n\t\n")
	f.Fuzz(func(t *testing.T, in string) {
		got, err := ParseMIGMinors(strings.NewReader(in))
		if err != nil {
			return
		}
		// Whatever parses has names without blanks and minors in range,
		// and parses again the same from its own rendering.
		var b strings.Builder
		for name, minor := range got {
			if name == "" || strings.ContainsAny(name, " \t\n") || minor < 0 || minor > 1<<20 {
				t.Fatalf("parsed %q -> %d", name, minor)
			}
			b.WriteString(name + " " + strconv.FormatInt(minor, 10) + "\n")
		}
		again, err := ParseMIGMinors(strings.NewReader(b.String()))
		if err != nil || !cmp.Equal(got, again) {
			t.Fatalf("rendering %v parses as %v, %v", got, again, err)
		}
	})
}

func TestReadMIGCaps(t *testing.T) {
	root := t.TempDir()
	devices := "Character devices:\n195 nvidia\n237 nvidia-caps\n508 nvidia-uvm\n\nBlock devices:\n8 sd\n"
	if err := os.WriteFile(filepath.Join(root, "devices"), []byte(devices), 0o644); err != nil {
		t.Fatal(err)
	}
	// The major without the minors file: unknown, no error.
	caps, err := ReadMIGCaps(root)
	if err != nil || caps.Major != -1 {
		t.Errorf("ReadMIGCaps without mig-minors = %+v, %v; want unknown", caps, err)
	}
	if err := os.MkdirAll(filepath.Join(root, "driver", "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, migMinorsFile), []byte(migMinors), 0o644); err != nil {
		t.Fatal(err)
	}
	caps, err = ReadMIGCaps(root)
	if err != nil || caps.Major != 237 || caps.Minors["gpu1/gi1/ci0/access"] != 112 {
		t.Errorf("ReadMIGCaps = %+v, %v", caps, err)
	}
	if err := os.WriteFile(filepath.Join(root, migMinorsFile), []byte("bad"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadMIGCaps(root); err == nil || !strings.Contains(err.Error(), "mig-minors: line 1") {
		t.Errorf("ReadMIGCaps of a bad file = %v, want an error naming it", err)
	}
	// No nvidia-caps major: unknown, no error.
	if err := os.WriteFile(filepath.Join(root, "devices"), []byte("Character devices:\n195 nvidia\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if caps, err := ReadMIGCaps(root); err != nil || caps.Major != -1 {
		t.Errorf("ReadMIGCaps without the major = %+v, %v", caps, err)
	}
}

// Without CDI, a MIG container gets its instance's nvidia-caps access
// nodes (GPU instance and compute instance) and no other; with CDI, none
// (its CDI spec brings them); a missing minor refuses the container.
func TestDecideMIGCaps(t *testing.T) {
	minors, err := ParseMIGMinors(strings.NewReader(migMinors))
	if err != nil {
		t.Fatal(err)
	}
	caps := MIGCaps{Major: 237, Minors: minors}
	node := func() *Node {
		n := migNode()
		n.GPUs[0].Minor, n.GPUs[1].Minor = 0, 1
		n.GPUs[0].MIG[0].GPUInstanceID = 2 // mig0a: gpu0/gi2
		n.GPUs[1].MIG[1].GPUInstanceID = 3 // mig1b: gpu1/gi3
		n.GPUs[1].MIG[0].GPUInstanceID = 9 // mig1a: not listed by the driver
		return n
	}
	opts := testOptions(t)
	opts.MIGCaps = caps
	req := Request{Pod: pod(nil), Container: Container{Name: "c", DeviceNodes: []DeviceNode{
		{Path: "/dev/nvidia-caps/nvidia-cap12", Type: "c", Major: 237, Minor: 12},
	}}, Devices: Devices{MIG: []MIGDevice{mig(mig1b, "1g.5gb"), mig(mig0a, "1g.5gb")}}}
	d, err := Decide(opts, node(), req)
	if err != nil {
		t.Fatal(err)
	}
	capNode := func(m int64) DeviceNode {
		return DeviceNode{Path: "/dev/nvidia-caps/nvidia-cap" + strconv.FormatInt(m, 10), Type: "c", Major: 237, Minor: m}
	}
	wantNodes := append(gpuNodes(0, 1), capNode(21), capNode(22), capNode(130), capNode(131))
	if diff := cmp.Diff(wantNodes, d.Adjustment.AddDeviceNodes); diff != "" {
		t.Errorf("device nodes (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"/dev/nvidia-caps/nvidia-cap12"}, d.Adjustment.RemoveDeviceNodes); diff != "" {
		t.Errorf("removed nodes (-want +got):\n%s", diff)
	}
	wantRules := append(gpuRules(0, 1), CgroupRule{Type: "c", Major: i64(237), Access: "rwm"})
	for _, m := range []int64{21, 22, 130, 131} {
		wantRules = append(wantRules, CgroupRule{Allow: true, Type: "c", Major: i64(237), Minor: i64(m), Access: "rw"})
	}
	if diff := cmp.Diff(wantRules, d.Adjustment.CgroupRules); diff != "" {
		t.Errorf("cgroup rules (-want +got):\n%s", diff)
	}

	// CDI: the MIG devices' CDI specs carry their caps.
	cdi := opts
	cdi.CDI = true
	d, err = Decide(cdi, node(), req)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Adjustment.AddDeviceNodes) != 0 || len(d.Adjustment.CgroupRules) != len(gpuRules(0, 1)) {
		t.Errorf("with CDI: nodes %v, rules %v", d.Adjustment.AddDeviceNodes, d.Adjustment.CgroupRules)
	}
	if diff := cmp.Diff([]string{api.DefaultCDIKind + "=" + mig0a, api.DefaultCDIKind + "=" + mig1b}, d.Adjustment.CDIDevices); diff != "" {
		t.Errorf("with CDI: CDI devices (-want +got):\n%s", diff)
	}

	// A MIG instance the driver lists no access minor for.
	req.Devices.MIG = []MIGDevice{mig(mig1a, "3g.20gb")}
	if _, err := Decide(opts, node(), req); err == nil || !strings.Contains(err.Error(), "no nvidia-caps minor for gpu1/gi9/access") {
		t.Errorf("Decide without the instance's caps = %v, want refused", err)
	}
}
