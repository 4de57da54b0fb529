package nvmlmock

// Fuzz targets for the parser of mock machine profiles (--nvml=mock:FILE).
// They check properties, not only "no panic"; `go test` runs the seeds.

import (
	"path"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
)

// nvlinksOf is the number of NVLinks GPU i of p has, direct and into the
// NVSwitch fabric, counted without overflow: it stops above
// api.MaxNVLinksPerGPU.
func nvlinksOf(p *api.MockMachine, i int) int {
	n := 0
	if p.NVSwitch.Covers(i) {
		n = p.NVSwitch.LinksPerGPU
	}
	if i < len(p.NVLinks) {
		for _, c := range p.NVLinks[i] {
			if c < 0 || c > api.MaxNVLinksPerGPU || n > api.MaxNVLinksPerGPU {
				return api.MaxNVLinksPerGPU + 1
			}
			n += c
		}
	}
	return n
}

// FuzzParse checks that Parse either fails with an error naming the source
// and returns no profile, or returns a profile that validates, gives no GPU
// more NVLinks than NVML has, writes back as YAML that parses to the same
// profile, and builds a machine (New) or says clearly why not.
func FuzzParse(f *testing.F) {
	for _, name := range ProfileNames() {
		data, err := builtin.ReadFile(path.Join("profiles", name+".yaml"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(validProfile))
	for _, r := range [][2]string{
		{"memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:01", "memory: 1024, numaNode: 0, pciBusID: \"0000:01"},
		{"numaNode: 0, pciBusID: \"0000:02", "numaNode: -1, pciBusID: \"0000:02"},
		{`"0000:02:00.0"`, `"00000000:01:00.0"`},
		{"[2, 0]\npcie", "[1, 0]\npcie"},
		{"[0, 2]\n  - [2, 0]", "[0, 18]\n  - [18, 0]"},
		{"[0, 2]\n  - [2, 0]", "[0, 19]\n  - [19, 0]"},
		{"[X, PIX]\n  - [PIX, X]", "[X, SYS]\n  - [SYS, X]"},
		{`cpus: "0-3"`, `cpus: "0-3,8,10-11"`},
		{`cpus: "0-3"`, `cpus: "3-0"`},
		{"nvlinks:", "nvswitch: {switches: 2, linksPerGPU: 12, gpus: [1]}\nnvlinks:"},
		{"- {model: M, memoryMiB: 1024, numaNode: 0, pciBusID: \"0000:02:00.0\"}", "- {model: M, memoryMiB: 40960, numaNode: 0, pciBusID: \"0000:02:00.0\", mig: {instances: [{profile: 1g.5gb, start: 0, size: 1}]}}"},
		{"apiVersion:", "apiVersion: ["},
		// The total of a row overflowed and passed.
		{"nvlinks:\n  - [0, 2]\n  - [2, 0]", "nvswitch: {switches: 1, linksPerGPU: 18}\nnvlinks:\n  - [0, 9223372036854775800]\n  - [9223372036854775800, 0]"},
	} {
		f.Add([]byte(strings.Replace(validProfile, r[0], r[1], 1)))
	}
	f.Add([]byte(`{"apiVersion":"tessera.dev/v1alpha1","kind":"MockMachine","name":"one","numaNodes":[],` +
		`"gpus":[{"model":"M","memoryMiB":2048,"numaNode":-1,"pciBusID":"00000000:3B:00.0","uuid":"GPU-11111111-2222-3333-4444-555555555555"}]}`))
	f.Add([]byte(""))
	f.Add([]byte(" \n"))
	f.Add([]byte("null"))
	f.Add([]byte("[]"))
	const source = "machine.yaml"
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data, source)
		if err != nil {
			if p != nil {
				t.Fatalf("profile %+v with error %v", p, err)
			}
			if !strings.HasPrefix(err.Error(), "mock machine "+source+": ") {
				t.Fatalf("error %q does not name the source", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("a parsed profile does not validate: %v", err)
		}
		for i := range p.GPUs {
			if n := nvlinksOf(p, i); n > api.MaxNVLinksPerGPU {
				t.Fatalf("GPU %d has more than %d NVLinks: nvlinks %v, nvswitch %+v", i, api.MaxNVLinksPerGPU, p.NVLinks, p.NVSwitch)
			}
		}
		enc, err := yaml.Marshal(p)
		if err != nil {
			t.Fatalf("writing a parsed profile: %v", err)
		}
		again, err := Parse(enc, source)
		if err != nil {
			t.Fatalf("re-parsing\n%s: %v", enc, err)
		}
		if diff := cmp.Diff(p, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("re-parsed profile differs (-parsed +re-parsed):\n%s", diff)
		}
		if _, err := New(p); err != nil && !strings.HasPrefix(err.Error(), "mock machine "+p.Name+": ") {
			t.Fatalf("New: error %q does not name the machine", err)
		}
	})
}
