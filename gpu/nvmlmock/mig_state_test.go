package nvmlmock_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpu/nvmlmock"
)

func migLayout(t *testing.T, g gpu.Interface, i int) (profiles, uuids []string) {
	t.Helper()
	info, err := g.MIG(i)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range info.Instances {
		profiles = append(profiles, in.Profile)
		uuids = append(uuids, in.UUID)
	}
	return profiles, uuids
}

func startMock(t *testing.T, state string) gpu.Interface {
	t.Helper()
	m := nvmlmock.Builtin(nvmlmock.DGXA100MIGName)
	if state != "" {
		if err := m.PersistMIG(state); err != nil {
			t.Fatal(err)
		}
	}
	g := gpu.NewNVML(m.NVML())
	if err := g.Init(); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestPersistMIG: a repartition survives a restart of the machine's user
// (a new Machine from the same profile) when the state is kept in a file,
// as the driver keeps it; instances created after the restart get UUIDs
// not used before. Without the file the profile's layout comes back.
func TestPersistMIG(t *testing.T) {
	state := filepath.Join(t.TempDir(), "mig-state.json")
	g := startMock(t, state)
	if err := g.SetMIGLayout(2, []gpu.MIGSpec{{Profile: "7g.40gb", Start: 0, Size: 8}}); err != nil {
		t.Fatal(err)
	}
	want, wantUUIDs := migLayout(t, g, 2)
	if strings.Join(want, ",") != "7g.40gb" {
		t.Fatalf("GPU 2 after SetMIGLayout: %v", want)
	}

	// Restarted without the file: the layout is the profile's.
	if got, _ := migLayout(t, startMock(t, ""), 2); strings.Join(got, ",") != "3g.20gb,2g.10gb,1g.5gb" {
		t.Fatalf("GPU 2 without the state file: %v", got)
	}

	// Restarted with it: as left.
	again := startMock(t, state)
	got, gotUUIDs := migLayout(t, again, 2)
	if strings.Join(got, ",") != "7g.40gb" || strings.Join(gotUUIDs, ",") != strings.Join(wantUUIDs, ",") {
		t.Fatalf("GPU 2 after a restart: %v %v, want %v %v", got, gotUUIDs, want, wantUUIDs)
	}
	if got, _ := migLayout(t, again, 0); len(got) != 7 {
		t.Fatalf("GPU 0 after a restart: %v", got)
	}
	// A new repartition after the restart: new UUIDs, and saved too.
	if err := again.SetMIGLayout(2, []gpu.MIGSpec{{Profile: "4g.20gb", Start: 0, Size: 4}, {Profile: "3g.20gb", Start: 4, Size: 4}}); err != nil {
		t.Fatal(err)
	}
	_, newUUIDs := migLayout(t, again, 2)
	for _, u := range newUUIDs {
		if u == wantUUIDs[0] {
			t.Fatalf("a UUID used before the restart was given again: %s", u)
		}
	}
	if got, gotUUIDs := migLayout(t, startMock(t, state), 2); strings.Join(got, ",") != "4g.20gb,3g.20gb" || strings.Join(gotUUIDs, ",") != strings.Join(newUUIDs, ",") {
		t.Fatalf("GPU 2 after a second restart: %v %v", got, gotUUIDs)
	}
}

func TestPersistMIGBadFile(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"unknown field": `{"apiVersion":"tessera.dev/v1alpha1","kind":"MockMIGState","gpus":[],"x":1}`,
		"kind":          `{"apiVersion":"tessera.dev/v1alpha1","kind":"Other","gpus":[]}`,
		"overlap": `{"apiVersion":"tessera.dev/v1alpha1","kind":"MockMIGState","gpus":[{"uuid":"` + nvmlmock.Builtin(nvmlmock.DGXA100MIGName).UUID(2) + `","created":0,"instances":[` +
			`{"uuid":"MIG-11111111-1111-1111-1111-111111111111","profile":"4g.20gb","start":0,"size":4,"gpuInstanceID":1,"compute":true},` +
			`{"uuid":"MIG-22222222-2222-2222-2222-222222222222","profile":"2g.10gb","start":2,"size":2,"gpuInstanceID":2,"compute":true}]}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := nvmlmock.Builtin(nvmlmock.DGXA100MIGName).PersistMIG(p); err == nil {
				t.Fatal("a bad state file was accepted")
			}
		})
	}
}
