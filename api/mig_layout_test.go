package api

import (
	"strings"
	"testing"
)

func TestParseMIGLayoutRequest(t *testing.T) {
	good := `{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutRequest","generation":3,"gpus":[{"uuid":"GPU-0123abcd","instances":[{"profile":"4g.20gb","start":0,"size":4},{"profile":"3g.20gb","start":4,"size":4}]}],"pod":{"namespace":"ns","name":"p","uid":"u-1"}}`
	r, err := ParseMIGLayoutRequest(good)
	if err != nil {
		t.Fatal(err)
	}
	if r.Generation != 3 || r.Pod == nil || r.Pod.String() != "ns/p" || r.Pod.UID != "u-1" || len(r.GPUs) != 1 || len(r.GPUs[0].Instances) != 2 || r.GPUs[0].Instances[1].Start != 4 {
		t.Fatalf("parsed %+v", r)
	}
	enc, err := EncodeMIGLayoutRequest(r)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ParseMIGLayoutRequest(enc); err != nil || again.GPUs[0].UUID != "GPU-0123abcd" {
		t.Fatalf("round trip: %v %+v", err, again)
	}
	for _, tc := range []struct{ name, value, want string }{
		{"unknown field", strings.Replace(good, `"generation":3`, `"generation":3,"x":1`, 1), `unknown field "x"`},
		{"version", strings.Replace(good, "v1alpha1", "v0", 1), "apiVersion"},
		{"kind", strings.Replace(good, "MIGLayoutRequest", "Pod", 1), "kind"},
		{"generation", strings.Replace(good, `"generation":3`, `"generation":0`, 1), "generation: must be positive"},
		{"uuid", strings.Replace(good, "GPU-0123abcd", "MIG-0123", 1), "gpus[0].uuid"},
		{"twice", strings.Replace(good, `]}]`, `]},{"uuid":"GPU-0123abcd","instances":[]}]`, 1), "twice"},
		{"no pod", strings.Replace(good, `,"pod":{"namespace":"ns","name":"p","uid":"u-1"}`, ``, 1), "pod: required"},
		{"null pod", strings.Replace(good, `"pod":{"namespace":"ns","name":"p","uid":"u-1"}`, `"pod":null`, 1), "pod: required"},
		{"pod without uid", strings.Replace(good, `,"uid":"u-1"`, ``, 1), "pod.uid"},
		{"pod field", strings.Replace(good, `"uid":"u-1"`, `"uid":"u-1","node":"x"`, 1), `unknown field "node"`},
		{"profile", strings.Replace(good, "4g.20gb", "4g.20gb+me", 1), "gpus[0].instances[0].profile"},
		{"overlap", strings.Replace(good, `"start":4,"size":4`, `"start":2,"size":2`, 1), "overlap"},
		{"placement", strings.Replace(good, `"start":4,"size":4`, `"start":5,"size":4`, 1), "is not a placement"},
		{"trailing", good + " x", "trailing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMIGLayoutRequest(tc.value)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseMIGLayoutStatus(t *testing.T) {
	s, err := ParseMIGLayoutStatus(`{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutStatus","generation":2,"state":"Refused","message":"GPU 2 has a tenant"}`)
	if err != nil || s.State != MIGLayoutRefused || s.Generation != 2 {
		t.Fatalf("%v %+v", err, s)
	}
	if _, err := ParseMIGLayoutStatus(`{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutStatus","generation":2,"state":"Done"}`); err == nil || !strings.Contains(err.Error(), "state") {
		t.Fatalf("bad state: %v", err)
	}
}

func FuzzParseMIGLayoutRequest(f *testing.F) {
	f.Add(`{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutRequest","generation":1,"gpus":[{"uuid":"GPU-1","instances":[{"profile":"1g.5gb","start":6,"size":1}]}],"pod":{"namespace":"ns","name":"p","uid":"u"}}`)
	f.Add(`{"apiVersion":"tessera.dev/v1alpha1","kind":"MIGLayoutRequest","generation":1,"gpus":[{"uuid":"GPU-1","instances":[{"profile":"1g.5gb","start":6,"size":1}]}]}`)
	f.Add(`{}`)
	f.Fuzz(func(t *testing.T, value string) {
		r, err := ParseMIGLayoutRequest(value)
		if err != nil {
			return
		}
		enc, err := EncodeMIGLayoutRequest(r)
		if err != nil {
			t.Fatalf("a parsed request does not encode: %v", err)
		}
		if _, err := ParseMIGLayoutRequest(enc); err != nil {
			t.Fatalf("an encoded request does not parse: %v", err)
		}
	})
}
