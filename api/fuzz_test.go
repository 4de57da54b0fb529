package api_test

// Fuzz targets for every parser of an annotation, a CRD object or the node
// agent's configuration. Each checks properties, not only "no panic": an
// error names what was parsed, and a value that parses re-encodes to one
// that parses to the same value. Seeds are the table tests' good and bad
// values. `make fuzz` runs each in turn; `go test` runs the seeds.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/tessera-gpu/tessera/api"
)

// mustEncode returns v as JSON, bypassing the encoders' validation, so that
// invalid values can seed the corpus.
func mustEncode(f *testing.F, v any) string {
	f.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		f.Fatal(err)
	}
	return string(b)
}

// wantNamed fails unless err names the annotation (or field) name.
func wantNamed(t *testing.T, err error, name string) {
	t.Helper()
	if !strings.Contains(err.Error(), name) {
		t.Fatalf("error %q does not name %s", err, name)
	}
}

func FuzzParseAssignment(f *testing.F) {
	for _, a := range []*api.Assignment{
		assignment(),
		assignment(whole("train", api.GPURef{UUID: uuid0, Index: 0}, api.GPURef{UUID: uuid1, Index: 1})),
		assignment(shared("infer", api.GPURef{UUID: uuid1, Index: 1}, 4096, 30)),
		assignment(whole("a", api.GPURef{UUID: uuid0}), shared("b", api.GPURef{UUID: uuid1, Index: 1}, 0, 50)),
		assignment(whole("a", api.GPURef{UUID: "gpu0"})),
		assignment(shared("a", api.GPURef{UUID: uuid0}, 0, 101)),
		assignment(whole("a", api.GPURef{UUID: uuid0}), whole("a")),
		// Multi-GPU slices: valid, out of order, a GPU twice.
		assignment(api.ContainerAssignment{Name: "t", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid0}, Spread: []api.GPURef{{UUID: uuid1, Index: 1}}, MemoryMiB: 8192, Cores: 20}}),
		assignment(api.ContainerAssignment{Name: "t", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid1, Index: 1}, Spread: []api.GPURef{{UUID: uuid0}}, MemoryMiB: 8192}}),
		assignment(api.ContainerAssignment{Name: "t", Shared: &api.SharedGPU{GPU: api.GPURef{UUID: uuid0}, Spread: []api.GPURef{{UUID: uuid0, Index: 1}}, Cores: 20}}),
	} {
		f.Add(mustEncode(f, a))
	}
	const head = `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment",`
	for _, v := range []string{
		"", "{", "null", "[]", `""`,
		head + `"containers":[]} x`,
		head + `"containers":[],"extra":1}`,
		`{"apiVersion":"tessera.dev/v0","kind":"Assignment","containers":[]}`,
		head + `"containers":[{"name":""}]}`,
		head + `"containers":[{"name":"a","gpus":[{"uuid":"` + uuid0 + `","index":-1}]}]}`,
		head + `"containers":[{"name":"a","gpus":[{"uuid":"` + uuid0 + `","index":0}],"shared":{"gpu":{"uuid":"` + uuid0 + `","index":0},"cores":10}}]}`,
		head + `"containers":[{"name":"a","shared":{"gpu":{"uuid":"` + uuid0 + `","index":0}}}]}`,
		head + `"CONTAINERS":[{"Name":"a","shared":{"gpu":{"uuid":"` + uuid0 + `","index":1e0}, "memoryMiB": 1}}]}`,
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		a, err := api.ParseAssignment(value)
		got, ok, gerr := api.GetAssignment(map[string]string{api.AnnotationAssignment: value})
		if !ok || (err == nil) != (gerr == nil) {
			t.Fatalf("GetAssignment = %v, %v; ParseAssignment error %v", ok, gerr, err)
		}
		if err != nil {
			wantNamed(t, err, api.AnnotationAssignment)
			if a != nil || got != nil {
				t.Fatalf("a value with an error: %+v", a)
			}
			return
		}
		if err := a.Validate(); err != nil {
			t.Fatalf("a parsed assignment does not validate: %v", err)
		}
		enc, err := api.EncodeAssignment(a)
		if err != nil {
			t.Fatalf("EncodeAssignment of a parsed assignment: %v", err)
		}
		again, err := api.ParseAssignment(enc)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", enc, err)
		}
		// An empty list and an absent one ("gpus": []) are the same.
		if diff := cmp.Diff(a, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("re-encoded assignment differs (-parsed +re-parsed):\n%s", diff)
		}
		if enc2, _ := api.EncodeAssignment(again); enc2 != enc {
			t.Fatalf("encoding is not stable: %s then %s", enc, enc2)
		}
	})
}

func FuzzParseGangPlan(f *testing.F) {
	expires := time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)
	for _, p := range []api.GangPlan{
		{Gang: "train", Node: "n1", GPU: &api.GPURef{UUID: uuid0, Index: 3}, Expires: expires},
		{Gang: "train", Node: "n1", Expires: expires.In(time.FixedZone("x", -7*3600))},
		{Gang: "inf", Node: "n1", GPUs: []api.GPURef{{UUID: uuid0, Index: 3}}, Expires: expires},
		{Gang: "inf", Node: "n1", Expires: expires, Awaits: []types.UID{"uid-a", "uid-b"}, AwaitUntil: &expires},
	} {
		ann := map[string]string{}
		if err := api.SetGangPlan(ann, p); err != nil {
			f.Fatal(err)
		}
		f.Add(ann[api.AnnotationGangPlan])
	}
	for _, v := range []string{
		"{", "", "null",
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","gang":"g","node":"n","expires":"2026-11-22T01:00:00Z"}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","expires":"2026-11-22T01:00:00Z"}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n"}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"2026-11-22T01:00:00Z","extra":1}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"0001-01-01T01:00:00+01:00"}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","gang":"g","node":"n","expires":"9999-12-31T23:59:59.999999999-23:59","gpu":{"uuid":"x","index":0}}`,
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		p, err := api.ParseGangPlan(value)
		if err != nil {
			wantNamed(t, err, api.AnnotationGangPlan)
			return
		}
		if p.Gang == "" || p.Node == "" || p.Expires.IsZero() || p.APIVersion != api.Version || p.Kind != api.KindGangPlan {
			t.Fatalf("parsed an incomplete plan: %+v", p)
		}
		ann := map[string]string{}
		if err := api.SetGangPlan(ann, *p); err != nil {
			t.Fatalf("SetGangPlan of a parsed plan: %v", err)
		}
		again, ok, err := api.GetGangPlan(ann)
		if !ok || err != nil {
			t.Fatalf("re-parsing %s: %v", ann[api.AnnotationGangPlan], err)
		}
		if diff := cmp.Diff(p, again); diff != "" {
			t.Fatalf("re-encoded plan differs (-parsed +re-parsed):\n%s", diff)
		}
	})
}

// encodeLevels is the inverse of ParseTopologyLevels.
func encodeLevels(levels []api.TopologyLevel) string {
	parts := make([]string, len(levels))
	for i, l := range levels {
		parts[i] = l.Key
		if l.Required {
			parts[i] += ":required"
		}
	}
	return strings.Join(parts, ",")
}

func FuzzGangOf(f *testing.F) {
	for _, s := range []struct {
		label, gang, min, max, timeout, topology, volcano, volcano2                         string
		hasLabel, hasGang, hasMin, hasMax, hasTimeout, hasTopology, hasVolcano, hasVolcano2 bool
	}{
		{gang: "t", min: "2", max: "4", hasGang: true, hasMin: true, hasMax: true},
		{gang: "t", min: "3", max: "2", hasGang: true, hasMin: true, hasMax: true},
		{label: "t", max: "0", hasLabel: true, hasMax: true},
		{gang: "train", min: "4", timeout: "30", hasGang: true, hasMin: true, hasTimeout: true},
		{label: "train", hasLabel: true},
		{gang: "t", min: "2", topology: "nvidia.com/gpu.clique, rack:required", hasGang: true, hasMin: true, hasTopology: true},
		{gang: "t", hasGang: true},
		{gang: "t", min: "four", hasGang: true, hasMin: true},
		{gang: "t", min: "0", hasGang: true, hasMin: true},
		{gang: "t", min: "1", timeout: "-5", hasGang: true, hasMin: true, hasTimeout: true},
		{gang: "t", min: "1", timeout: "9223372036854775807", hasGang: true, hasMin: true, hasTimeout: true},
		{label: "a", gang: "b", min: "1", hasLabel: true, hasGang: true, hasMin: true},
		{label: " ", hasLabel: true},
		{gang: "t", min: "1", topology: "rack:always", hasGang: true, hasMin: true, hasTopology: true},
		{gang: "t", min: "1", topology: "rack,rack", hasGang: true, hasMin: true, hasTopology: true},
		{gang: "t", min: "1", topology: "rack :required, zone: preferred", hasGang: true, hasMin: true, hasTopology: true},
		{gang: "t", min: "+3", topology: ",", hasGang: true, hasMin: true, hasTopology: true},
		{gang: "t", min: "1", topology: "a b:required", hasGang: true, hasMin: true, hasTopology: true},
		{volcano: "train", hasVolcano: true},
		{volcano2: "train", hasVolcano2: true},
		{volcano: "train", volcano2: "train", gang: "train", min: "3", timeout: "30", hasVolcano: true, hasVolcano2: true, hasGang: true, hasMin: true, hasTimeout: true},
		{volcano: "a", volcano2: "b", hasVolcano: true, hasVolcano2: true},
		{volcano: "", hasVolcano: true},
		{label: "a", volcano: "a", hasLabel: true, hasVolcano: true},
		{volcano: "a", gang: "b", min: "1", hasVolcano: true, hasGang: true, hasMin: true},
		{volcano: "t", min: "0", topology: "rack:required", hasVolcano: true, hasMin: true, hasTopology: true},
		// Lax spellings of numbers, invalid names, gang-only annotations
		// without a gang.
		{gang: "t", min: " 2", hasGang: true, hasMin: true},
		{gang: "t", min: "02", max: "+4", timeout: " 30", hasGang: true, hasMin: true, hasMax: true, hasTimeout: true},
		{gang: "t", min: "2", timeout: "030", hasGang: true, hasMin: true, hasTimeout: true},
		{gang: "Not_A Valid/Name", min: "2", hasGang: true, hasMin: true},
		{label: "Train", hasLabel: true},
		{volcano: "a.b-c", min: "1", hasVolcano: true, hasMin: true},
		{min: "2", hasMin: true},
		{max: "2", timeout: "30", hasMax: true, hasTimeout: true},
		{topology: "rack", hasTopology: true},
	} {
		f.Add(s.label, s.gang, s.min, s.max, s.timeout, s.topology, s.volcano, s.volcano2, s.hasLabel, s.hasGang, s.hasMin, s.hasMax, s.hasTimeout, s.hasTopology, s.hasVolcano, s.hasVolcano2)
	}
	f.Fuzz(func(t *testing.T, label, gang, min, max, timeout, topology, volcano, volcano2 string, hasLabel, hasGang, hasMin, hasMax, hasTimeout, hasTopology, hasVolcano, hasVolcano2 bool) {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "worker-0", Labels: map[string]string{}, Annotations: map[string]string{}}}
		set := func(m map[string]string, on bool, k, v string) {
			if on {
				m[k] = v
			}
		}
		set(pod.Labels, hasLabel, api.LabelPodGroup, label)
		set(pod.Annotations, hasGang, api.AnnotationGang, gang)
		set(pod.Annotations, hasMin, api.AnnotationGangMinMember, min)
		set(pod.Annotations, hasMax, api.AnnotationGangMaxMember, max)
		set(pod.Annotations, hasTimeout, api.AnnotationGangTimeout, timeout)
		set(pod.Annotations, hasTopology, api.AnnotationGangTopology, topology)
		set(pod.Annotations, hasVolcano, api.AnnotationVolcanoGroupName, volcano)
		set(pod.Annotations, hasVolcano2, api.AnnotationVolcanoGroupNameV2, volcano2)

		g, ok, err := api.GangOf(pod)
		declared := hasLabel || hasGang || hasVolcano || hasVolcano2
		if gangOnly := hasMin || hasMax || hasTimeout || hasTopology; !declared && gangOnly && err == nil {
			t.Fatalf("gang-only annotations %v taken without a gang", pod.Annotations)
		}
		if ok != (declared || err != nil) {
			t.Fatalf("ok = %v, err %v for label %v, annotations %v (tessera), %v, %v (Volcano)", ok, err, hasLabel, hasGang, hasVolcano, hasVolcano2)
		}
		if err != nil {
			if !errors.Is(err, api.ErrInvalidGang) || !strings.Contains(err.Error(), "ml/worker-0") {
				t.Fatalf("error %v is not ErrInvalidGang naming the pod", err)
			}
			if !strings.Contains(err.Error(), api.Domain+"/") && !strings.Contains(err.Error(), api.LabelPodGroup) && !strings.Contains(err.Error(), "gang name") &&
				!strings.Contains(err.Error(), api.AnnotationVolcanoGroupName) && !strings.Contains(err.Error(), api.AnnotationVolcanoGroupNameV2) {
				t.Fatalf("error %v names neither the annotation nor the label", err)
			}
			return
		}
		if !ok {
			return
		}
		if strings.TrimSpace(g.Name) == "" || g.Timeout <= 0 || g.MinMember < 0 || (g.Source == api.GangFromAnnotations && g.MinMember < 1) || g.MaxMember < 0 || g.CheckSize() != nil {
			t.Fatalf("parsed an invalid gang: %+v", g)
		}
		if errs := validation.IsDNS1123Subdomain(g.Name); len(errs) > 0 {
			t.Fatalf("took the gang name %q: %v", g.Name, errs)
		}
		// Each number parses from its one plain spelling only.
		for _, n := range []struct {
			on        bool
			text, key string
			got       int64
		}{
			{hasMin, min, api.AnnotationGangMinMember, int64(g.MinMember)},
			{hasMax, max, api.AnnotationGangMaxMember, int64(g.MaxMember)},
			{hasTimeout, timeout, api.AnnotationGangTimeout, int64(g.Timeout / time.Second)},
		} {
			if n.on && n.text != fmt.Sprint(n.got) {
				t.Fatalf("%s=%q taken as %d: a spelling other than %q", n.key, n.text, n.got, fmt.Sprint(n.got))
			}
		}
		seen := map[string]bool{}
		for _, l := range g.Levels {
			if l.Key == "" || seen[l.Key] || strings.ContainsAny(l.Key, ":, ") {
				t.Fatalf("level %q of %+v is empty, repeated or not a label key", l.Key, g.Levels)
			}
			seen[l.Key] = true
		}
		// Re-encode what was parsed: the same gang.
		re := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "worker-0", Labels: map[string]string{}, Annotations: map[string]string{}}}
		switch g.Source {
		case api.GangFromPodGroup:
			re.Labels[api.LabelPodGroup] = g.Name
		case api.GangFromVolcano:
			re.Annotations[api.AnnotationVolcanoGroupName] = g.Name
		default:
			re.Annotations[api.AnnotationGang] = g.Name
		}
		if g.MinMember > 0 {
			re.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(g.MinMember)
		}
		if g.MaxMember > 0 {
			re.Annotations[api.AnnotationGangMaxMember] = fmt.Sprint(g.MaxMember)
		}
		if g.Timeout != api.DefaultGangTimeout || hasTimeout {
			re.Annotations[api.AnnotationGangTimeout] = fmt.Sprint(int64(g.Timeout / time.Second))
		}
		if g.Levels != nil {
			re.Annotations[api.AnnotationGangTopology] = encodeLevels(g.Levels)
		}
		again, ok, err := api.GangOf(re)
		if !ok || err != nil {
			t.Fatalf("re-encoded gang %v: %v", re.Annotations, err)
		}
		if diff := cmp.Diff(g, again); diff != "" {
			t.Fatalf("re-encoded gang differs (-parsed +re-parsed):\n%s", diff)
		}
	})
}

func FuzzParseTopologyLevels(f *testing.F) {
	for _, v := range []string{"nvidia.com/gpu.clique,topology.kubernetes.io/rack:required", "rack:always", "rack,rack", "", ",", "a:preferred", " a : required ", "a b", "a:", ":required"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		levels, err := api.ParseTopologyLevels(v)
		if err != nil {
			return
		}
		if len(levels) == 0 {
			t.Fatalf("%q parsed to no level", v)
		}
		again, err := api.ParseTopologyLevels(encodeLevels(levels))
		if err != nil {
			t.Fatalf("re-encoded %q: %v", encodeLevels(levels), err)
		}
		if diff := cmp.Diff(levels, again); diff != "" {
			t.Fatalf("re-encoded levels differ (-parsed +re-parsed):\n%s", diff)
		}
	})
}

func FuzzApplyPodGroup(f *testing.F) {
	f.Add(int64(4), int64(60), true, true, "", "")
	f.Add(int64(4), int64(0), true, false, "2", "")
	f.Add(int64(0), int64(60), true, true, "", "")
	f.Add(int64(1), int64(0), true, true, "", "")
	f.Add(int64(1), int64(9223372036854775807), true, true, "", "")
	f.Add(int64(1), int64(10), false, true, "", "7")
	f.Fuzz(func(t *testing.T, minMember, timeout int64, hasMin, hasTimeout bool, podMin, podTimeout string) {
		ann := map[string]string{}
		if podMin != "" {
			ann[api.AnnotationGangMinMember] = podMin
		}
		if podTimeout != "" {
			ann[api.AnnotationGangTimeout] = podTimeout
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "w", Labels: map[string]string{api.LabelPodGroup: "train"}, Annotations: ann}}
		g, _, err := api.GangOf(pod)
		if err != nil {
			return
		}
		spec := map[string]any{}
		if hasMin {
			spec["minMember"] = minMember
		}
		if hasTimeout {
			spec["scheduleTimeoutSeconds"] = timeout
		}
		pg := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		pg.SetNamespace("ml")
		pg.SetName("train")
		if err := g.ApplyPodGroup(pg, pod); err != nil {
			if !errors.Is(err, api.ErrInvalidGang) || !strings.Contains(err.Error(), "PodGroup ml/train") {
				t.Fatalf("error %v is not ErrInvalidGang naming the PodGroup", err)
			}
			return
		}
		if g.MinMember < 1 || g.Timeout <= 0 {
			t.Fatalf("applied an invalid PodGroup: %+v", g)
		}
	})
}

func FuzzGetGPUModels(f *testing.F) {
	for _, v := range []string{"A100|H100", " A100 ", "A100||H100", "", " ", "|", "NVIDIA A100-SXM4-40GB"} {
		f.Add(v, "NVIDIA A100-SXM4-40GB")
	}
	f.Add("100", "NVIDIA H100 80GB HBM3")
	f.Add("a100-sxm4", "NVIDIA A100-SXM4-40GB")
	f.Fuzz(func(t *testing.T, value, model string) {
		models, err := api.GetGPUModels(map[string]string{api.AnnotationGPUModel: value})
		if err != nil {
			wantNamed(t, err, api.AnnotationGPUModel)
			return
		}
		if len(models) == 0 {
			t.Fatalf("%q parsed to no model", value)
		}
		for _, m := range models {
			if m == "" || m != strings.TrimSpace(m) || strings.Contains(m, "|") {
				t.Fatalf("model %q of %q", m, value)
			}
			if api.ModelMatches(model, m) && !strings.Contains(strings.ToUpper(model), strings.ToUpper(m)) {
				t.Fatalf("ModelMatches(%q, %q) but the model does not contain the name", model, m)
			}
		}
		again, err := api.GPUModels(strings.Join(models, "|"))
		if err != nil || !cmp.Equal(models, again) {
			t.Fatalf("re-encoded %v: %v, %v", models, again, err)
		}
		if m, _ := api.GetGPUModels(nil); m != nil {
			t.Fatalf("no annotation: %v", m)
		}
	})
}

func FuzzGetNVLinkRequired(f *testing.F) {
	for _, v := range []string{"required", "false", "", " required ", "true", "Required"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		req, err := api.GetNVLinkRequired(map[string]string{api.AnnotationNVLink: value})
		switch strings.TrimSpace(value) {
		case api.NVLinkRequired:
			if !req || err != nil {
				t.Fatalf("%q: %v, %v; want required", value, req, err)
			}
		case api.NVLinkNone, "":
			if req || err != nil {
				t.Fatalf("%q: %v, %v; want not required", value, req, err)
			}
		default:
			if req || err == nil {
				t.Fatalf("%q: %v, %v; want an error", value, req, err)
			}
			wantNamed(t, err, api.AnnotationNVLink)
		}
	})
}

func FuzzNUMAAlignmentDisabled(f *testing.F) {
	for _, v := range []string{"false", "disabled", "true", "False", "", " false"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		want := value == "false" || value == "disabled"
		if got := api.NUMAAlignmentDisabled(map[string]string{api.AnnotationNUMAAlignment: value}); got != want {
			t.Fatalf("NUMAAlignmentDisabled(%q) = %v", value, got)
		}
		if api.NUMAAlignmentDisabled(map[string]string{"other": value}) {
			t.Fatalf("another annotation %q disables alignment", value)
		}
	})
}

func FuzzParseGPUInventory(f *testing.F) {
	f.Add(mustEncode(f, inventory()))
	for _, m := range []func(*api.GPUInventory){
		func(i *api.GPUInventory) { i.APIVersion = "v1" },
		func(i *api.GPUInventory) { i.MemoryUnitMiB = 0 },
		func(i *api.GPUInventory) { i.Resources = []string{"nvidia.com/gpu"} },
		func(i *api.GPUInventory) { i.GPUs[1].UUID = uuid0 },
		func(i *api.GPUInventory) { i.GPUs[0].NUMANode = -2 },
		func(i *api.GPUInventory) { i.GPUs[0].Reason = "x" },
		func(i *api.GPUInventory) { i.Links = i.Links[:1] },
		func(i *api.GPUInventory) { i.Links[0][0] = "NV1" },
		func(i *api.GPUInventory) { i.Links[0][1] = "NV2" },
		func(i *api.GPUInventory) { i.Links[1] = []string{} },
		func(i *api.GPUInventory) { i.NVLinkCliques = [][]int{{0, 7}} },
		func(i *api.GPUInventory) { i.GPUs, i.Links, i.NVLinkCliques = nil, nil, nil },
		func(i *api.GPUInventory) {
			i.WithheldFromWhole, i.WithheldFromShared = []string{uuid0}, []string{uuid1}
		},
		func(i *api.GPUInventory) { i.WithheldFromWhole = []string{"GPU-ffffffff"} },
		func(i *api.GPUInventory) { i.WithheldFromShared = []string{uuid1, uuid1} },
	} {
		f.Add(mustEncode(f, inventory(m)))
	}
	f.Add(`{"apiVersion":"tessera.dev/v1alpha1","kind":"GPUInventory","bogus":true}`)
	f.Fuzz(func(t *testing.T, value string) {
		inv, err := api.ParseGPUInventory(value)
		if err != nil {
			wantNamed(t, err, api.AnnotationGPUInventory)
			return
		}
		enc, err := api.EncodeGPUInventory(inv)
		if err != nil {
			t.Fatalf("EncodeGPUInventory of a parsed inventory: %v", err)
		}
		again, err := api.ParseGPUInventory(enc)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", enc, err)
		}
		if diff := cmp.Diff(inv, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("re-encoded inventory differs (-parsed +re-parsed):\n%s", diff)
		}
	})
}

func FuzzElasticQuota(f *testing.F) {
	f.Add("16", "32", "320", int64(64), true)
	f.Add("lots", "1", "", int64(0), false)
	f.Add("8", "4", "1", int64(1), true)
	f.Add("0.5", "1e3", "-1", int64(-1), true)
	f.Add("1Ki", "1024", "100m", int64(1), false)
	f.Add("9223372036854775807", "9223372036854775808", "1E18", int64(9223372036854775807), true)
	f.Fuzz(func(t *testing.T, minGPU, maxGPU, minMem string, maxMem int64, asInt bool) {
		var mm any = fmt.Sprint(maxMem)
		if asInt {
			mm = maxMem
		}
		spec := map[string]any{
			"min": map[string]any{string(api.ResourceGPU): minGPU, string(api.ResourceGPUMemory): minMem},
			"max": map[string]any{string(api.ResourceGPU): maxGPU, string(api.ResourceGPUMemory): mm},
		}
		u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
		u.SetNamespace("team-a")
		u.SetName("quota")
		q, err := api.ElasticQuotaFromUnstructured(u)
		if err != nil {
			if !strings.Contains(err.Error(), "ElasticQuota team-a/quota") {
				t.Fatalf("error %v does not name the object", err)
			}
			return
		}
		for _, l := range []corev1.ResourceList{q.Min, q.Max} {
			for name, v := range l {
				if v.Sign() < 0 {
					t.Fatalf("%s: negative %s", name, v.String())
				}
			}
		}
		for name, min := range q.Min {
			if max, ok := q.Max[name]; ok && min.Cmp(max) > 0 {
				t.Fatalf("%s: min %s above max %s", name, min.String(), max.String())
			}
		}
		// Re-encode with the quantities' canonical strings.
		enc := map[string]any{}
		for field, l := range map[string]corev1.ResourceList{"min": q.Min, "max": q.Max} {
			m := map[string]any{}
			for name, v := range l {
				m[string(name)] = v.String()
			}
			enc[field] = m
		}
		u2 := &unstructured.Unstructured{Object: map[string]any{"spec": enc}}
		u2.SetNamespace("team-a")
		u2.SetName("quota")
		again, err := api.ElasticQuotaFromUnstructured(u2)
		if err != nil {
			t.Fatalf("re-encoded quota %v: %v", enc, err)
		}
		quantities := cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })
		if diff := cmp.Diff(q, again, quantities); diff != "" {
			t.Fatalf("re-encoded quota differs (-parsed +re-parsed):\n%s", diff)
		}
	})
}

func FuzzLoadNodeAgentConfig(f *testing.F) {
	const head = "apiVersion: tessera.dev/v1alpha1\nkind: NodeAgentConfig\n"
	for _, s := range []string{
		head,
		head + `resources: [tessera.dev/gpu, tessera.dev/gpu-core]
memoryUnitMiB: 512
memoryReserveMiB: 1024
ignoredXIDs: []
deviceListStrategy: [envvar, cdi-annotations]
cdiKind: example.com/gpu
cdiDeviceName: index
healthCheckInterval: 5s
xidRecoveryDelay: 1m
kubeletSyncInterval: 3s
allocationGrace: 30s
nri:
  nonGPUContainers: leave
  nonGPUExemptNamespaces: [gpu-operator]
`,
		"", "apiVersion: v1\nkind: NodeAgentConfig\n", head + "memoryUnit: 3\n", head + "resources: [nvidia.com/gpu]\n",
		head + "deviceListStrategy: [envvar, volume-mounts]\n", head + "cdiKind: gpu\n", head + "healthCheckInterval: -1s\n",
		head + "xidRecoveryDelay: soon\n", head + "memoryUnitMiB: -1\n", head + "nri:\n  nonGPUContainers: all\n",
		head + "nri:\n  nonGPUExemptNamespaces: [a, a]\n", `{"apiVersion":"tessera.dev/v1alpha1","kind":"NodeAgentConfig","ignoredXIDs":[1,2]}`,
		head + "a: &a [*a]\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := api.LoadNodeAgentConfig(data, "cfg.yaml")
		if err != nil {
			wantNamed(t, err, "cfg.yaml")
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("a loaded config does not validate: %v", err)
		}
		out, err := yaml.Marshal(c)
		if err != nil {
			t.Fatalf("marshalling a loaded config: %v", err)
		}
		again, err := api.LoadNodeAgentConfig(out, "re-encoded")
		if err != nil {
			t.Fatalf("re-loading\n%s: %v", out, err)
		}
		if diff := cmp.Diff(c, again); diff != "" {
			t.Fatalf("re-encoded config differs (-loaded +re-loaded):\n%s", diff)
		}
	})
}

// fuzzSealer is the fuzz targets' Sealer; otherSealer has another key.
func fuzzSealer(t testing.TB, b byte) *api.Sealer {
	t.Helper()
	s, err := api.NewSealer([]byte(strings.Repeat(string(rune('a'+b)), api.MinSealKeyBytes)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// FuzzSealerVerify: a seal Tessera made verifies for its pod, name and value
// only; any other byte of the value, the UID, the name or the seal fails;
// an arbitrary annotation map verifies only where its seal is the one Seal
// makes.
func FuzzSealerVerify(f *testing.F) {
	f.Add("uid-1", api.AnnotationAssignment, `{"apiVersion":"tessera.dev/v1alpha1","kind":"Assignment","containers":[]}`, "v1.AAAA", uint(0), byte(1))
	f.Add("", api.AnnotationGangPlan, "", "", uint(3), byte(0x80))
	f.Add("uid-2", "x", "y", "v1.!!!", uint(42), byte(0xff))
	f.Add("uid-3", api.AnnotationAssignment, "value", "v0.xyz", uint(1000), byte(2))
	// The last character of this seal carries two unused bits: flipping
	// one gave another encoding of the same MAC that verified.
	f.Add("uid", "n", "v", "", uint(45), byte(0x02))
	f.Fuzz(func(t *testing.T, uid, name, value, seal string, pos uint, flip byte) {
		s, other := fuzzSealer(t, 0), fuzzSealer(t, 1)
		u := types.UID(uid)
		good := s.Seal(u, name, value)

		// An arbitrary seal verifies only when it is the one Seal makes.
		ann := map[string]string{name: value, name + "-seal": seal}
		if v, found, err := s.Verify(u, ann, name); err == nil {
			if !found || v != value || seal != good {
				t.Fatalf("Verify accepted seal %q for %q=%q on %q (Seal gives %q)", seal, name, value, uid, good)
			}
		} else if !errors.Is(err, api.ErrUnsealed) || !found {
			t.Fatalf("Verify of a wrong seal: found=%v err=%v; want ErrUnsealed", found, err)
		}

		// Seal then Verify round-trips.
		ann = map[string]string{name: value, name + "-seal": good}
		if v, found, err := s.Verify(u, ann, name); err != nil || !found || v != value {
			t.Fatalf("Verify(Seal) = %q, %v, %v", v, found, err)
		}
		if _, _, err := other.Verify(u, ann, name); !errors.Is(err, api.ErrUnsealed) {
			t.Fatalf("another key verified the seal: %v", err)
		}

		// Changing any byte of the value, the UID or the seal fails.
		if flip == 0 {
			flip = 1
		}
		mutate := func(s string) string {
			if s == "" {
				return string([]byte{flip})
			}
			b := []byte(s)
			b[pos%uint(len(b))] ^= flip
			return string(b)
		}
		for what, ann := range map[string]map[string]string{
			"value": {name: mutate(value), name + "-seal": good},
			"seal":  {name: value, name + "-seal": mutate(good)},
		} {
			if _, _, err := s.Verify(u, ann, name); !errors.Is(err, api.ErrUnsealed) {
				t.Fatalf("changed %s verified: %v", what, err)
			}
		}
		if _, _, err := s.Verify(types.UID(mutate(uid)), ann, name); !errors.Is(err, api.ErrUnsealed) {
			t.Fatalf("another pod's UID verified: %v", err)
		}
		if n2 := mutate(name); n2 != name+"-seal" {
			moved := map[string]string{n2: value, n2 + "-seal": good}
			if _, _, err := s.Verify(u, moved, n2); !errors.Is(err, api.ErrUnsealed) {
				t.Fatalf("the seal of %q verified for %q: %v", name, n2, err)
			}
		}
	})
}

// FuzzSealerAssignment: whatever a sealed value holds, Assignment either
// returns a valid assignment or an error naming the annotation; an
// unsealed or wrongly sealed value is never parsed.
func FuzzSealerAssignment(f *testing.F) {
	f.Add("uid-1", mustEncode(f, assignment(shared("c", api.GPURef{UUID: uuid0}, 1024, 10))), true)
	f.Add("uid-1", "{", true)
	f.Add("uid-1", mustEncode(f, assignment()), false)
	f.Fuzz(func(t *testing.T, uid, value string, sealed bool) {
		s := fuzzSealer(t, 0)
		u := types.UID(uid)
		ann := map[string]string{api.AnnotationAssignment: value}
		if sealed {
			ann[api.AnnotationAssignmentSeal] = s.Seal(u, api.AnnotationAssignment, value)
		} else {
			ann[api.AnnotationAssignmentSeal] = fuzzSealer(t, 1).Seal(u, api.AnnotationAssignment, value)
		}
		a, found, err := s.Assignment(u, ann)
		if !found {
			t.Fatal("found = false for a present annotation")
		}
		if !sealed {
			if !errors.Is(err, api.ErrUnsealed) || a != nil {
				t.Fatalf("unsealed value: %+v, %v; want ErrUnsealed", a, err)
			}
			return
		}
		want, perr := api.ParseAssignment(value)
		if (err == nil) != (perr == nil) || errors.Is(err, api.ErrUnsealed) {
			t.Fatalf("sealed value: Assignment error %v, ParseAssignment error %v", err, perr)
		}
		if err != nil {
			wantNamed(t, err, api.AnnotationAssignment)
			return
		}
		if diff := cmp.Diff(want, a); diff != "" {
			t.Fatalf("Assignment differs from ParseAssignment (-want +got):\n%s", diff)
		}
		// AssignmentAnnotations seals what it encodes: reading it back
		// gives the same assignment.
		re, err := s.AssignmentAnnotations(u, a)
		if err != nil {
			t.Fatalf("AssignmentAnnotations of a valid assignment: %v", err)
		}
		if again, _, err := s.Assignment(u, re); err != nil || !cmp.Equal(a, again, cmpopts.EquateEmpty()) {
			t.Fatalf("re-sealed assignment: %+v, %v", again, err)
		}
	})
}

func FuzzParseExpectedRuntime(f *testing.F) {
	for _, v := range []string{"90m", "2h30m", "36h", "45s", "8784h", "8784h1s", "", "0s", "-1h", " 1h", "1.5h", "500ms", "1d", "3600", "1H", "1h0m1s"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		d, err := api.ParseExpectedRuntime(value)
		if err != nil {
			wantNamed(t, err, api.AnnotationExpectedRuntime)
			if d != 0 {
				t.Fatalf("%q: error %v with a duration %v", value, err, d)
			}
			return
		}
		if d <= 0 || d > api.MaxExpectedRuntime || d%time.Second != 0 {
			t.Fatalf("%q parsed to %v: want whole seconds in (0, %v]", value, d, api.MaxExpectedRuntime)
		}
		again, err := api.ParseExpectedRuntime(api.FormatExpectedRuntime(d))
		if err != nil || again != d {
			t.Fatalf("%q -> %v -> %q -> %v, %v", value, d, api.FormatExpectedRuntime(d), again, err)
		}
		got, ok, err := api.GetExpectedRuntime(map[string]string{api.AnnotationExpectedRuntime: value})
		if !ok || err != nil || got != d {
			t.Fatalf("GetExpectedRuntime(%q) = %v, %v, %v; want %v", value, got, ok, err, d)
		}
	})
}

func FuzzParseGPUCount(f *testing.F) {
	for _, s := range []string{"1", "2", "4", "16", "", "0", "17", "02", " 2", "+2", "-1", "2.0", "2e0", "two", "9223372036854775808"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, value string) {
		n, err := api.ParseGPUCount(value)
		if err != nil {
			wantNamed(t, err, api.AnnotationGPUCount)
			return
		}
		if n < 1 || n > api.MaxGPUCount {
			t.Fatalf("ParseGPUCount(%q) = %d, outside 1..%d", value, n, api.MaxGPUCount)
		}
		// A count parses only from its one canonical spelling.
		if value != fmt.Sprint(n) {
			t.Fatalf("ParseGPUCount(%q) = %d: accepted a spelling other than %q", value, n, fmt.Sprint(n))
		}
		if got, set, err := api.GetGPUCount(map[string]string{api.AnnotationGPUCount: value}); got != n || !set || err != nil {
			t.Fatalf("GetGPUCount(%q) = %d, %v, %v; ParseGPUCount said %d", value, got, set, err, n)
		}
	})
}

func FuzzParseDecimal(f *testing.F) {
	for _, s := range []string{"1", "0", "2", "16", "30", "", "00", "02", " 2", "2 ", "+2", "-1", "2.0", "2e0", "0x2", "２", "9223372036854775807", "9223372036854775808", "99999999999999999999"} {
		f.Add(s, int64(0), int64(math.MaxInt64))
		f.Add(s, int64(1), int64(16))
	}
	f.Fuzz(func(t *testing.T, value string, lo, hi int64) {
		if lo < 0 || hi < lo {
			return
		}
		n, err := api.ParseDecimal(value, lo, hi)
		if err != nil {
			if n != 0 || err.Error() == "" {
				t.Fatalf("ParseDecimal(%q, %d, %d) = %d, %q", value, lo, hi, n, err)
			}
			return
		}
		if n < lo || n > hi {
			t.Fatalf("ParseDecimal(%q, %d, %d) = %d, outside", value, lo, hi, n)
		}
		if value != strconv.FormatInt(n, 10) {
			t.Fatalf("ParseDecimal(%q) = %d: accepted a spelling other than %q", value, n, strconv.FormatInt(n, 10))
		}
	})
}

func FuzzParseReservations(f *testing.F) {
	since := time.Date(2026, 11, 25, 9, 0, 0, 0, time.UTC)
	good, err := api.EncodeReservations([]api.ReservationRecord{
		{Workload: "gang team-a/train", UIDs: []types.UID{"u1", "u2"}, Since: &since, Nodes: []string{"n1", "n2"}},
		{Workload: "pod team-b/solo", UIDs: []types.UID{"u3"}, NotBefore: &since},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	for _, v := range []string{
		"{", "", "null", "[]",
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"GangPlan","reservations":[]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[{"workload":"","uids":["u"]}]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[{"workload":"w","uids":[]}]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[{"workload":"w","uids":["u"]},{"workload":"w","uids":["v"]}]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[{"workload":"w","uids":["u"],"nodes":[""]}]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[{"workload":"w","uids":["u"],"since":"yesterday"}]}`,
		`{"apiVersion":"tessera.dev/v1alpha1","kind":"Reservations","reservations":[],"extra":1}`,
	} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, value string) {
		recs, err := api.ParseReservations(value)
		if err != nil {
			wantNamed(t, err, api.ReservationsDataKey)
			return
		}
		for _, r := range recs {
			if r.Workload == "" || len(r.UIDs) == 0 {
				t.Fatalf("parsed an incomplete record: %+v", r)
			}
		}
		enc, err := api.EncodeReservations(recs)
		if err != nil {
			t.Fatalf("EncodeReservations of parsed records: %v", err)
		}
		again, err := api.ParseReservations(enc)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", enc, err)
		}
		if diff := cmp.Diff(recs, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("round trip changed the records (-parsed +again):\n%s", diff)
		}
	})
}
