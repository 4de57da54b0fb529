package verbs_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// fakeCore records the pods it is given and answers each verb.
type fakeCore struct {
	pods []*corev1.Pod
	err  error
}

func (c *fakeCore) FilterArgs(_ context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult {
	c.pods = append(c.pods, args.Pod)
	res := &extenderv1.ExtenderFilterResult{NodeNames: args.NodeNames}
	if c.err != nil {
		res.Error = c.err.Error()
	}
	return res
}

func (c *fakeCore) PrioritizeArgs(_ context.Context, args *extenderv1.ExtenderArgs, cpuOnly bool) (extenderv1.HostPriorityList, error) {
	c.pods = append(c.pods, args.Pod)
	score := int64(1)
	if cpuOnly {
		score = 2
	}
	return extenderv1.HostPriorityList{{Host: "n", Score: score}}, c.err
}

func (c *fakeCore) Bind(context.Context, *extenderv1.ExtenderBindingArgs) error { return c.err }

func (c *fakeCore) PreemptArgs(_ context.Context, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, error) {
	c.pods = append(c.pods, args.Pod)
	for _, v := range args.NodeNameToVictims {
		if v != nil {
			c.pods = append(c.pods, v.Pods...)
		}
	}
	return &extenderv1.ExtenderPreemptionResult{}, c.err
}

type fakeMetrics struct{ observed, failed []string }

func (m *fakeMetrics) Observe(verb string, _ time.Time) { m.observed = append(m.observed, verb) }
func (m *fakeMetrics) Failed(verb string)               { m.failed = append(m.failed, verb) }

func serve(t *testing.T, core verbs.Core, m verbs.Metrics) *http.ServeMux {
	t.Helper()
	mux := http.NewServeMux()
	(&verbs.Handler{Core: core, Metrics: m}).Register(mux)
	return mux
}

func post(t *testing.T, h http.Handler, path, body string) (int, map[string]any) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	var reply map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &reply); err != nil {
		// prioritize answers a list
		var list []any
		if lerr := json.Unmarshal(rec.Body.Bytes(), &list); lerr != nil {
			t.Fatalf("%s: reply is not JSON: %v: %s", path, err, rec.Body)
		}
	}
	return rec.Code, reply
}

// TestMalformedBody: every verb answers a body that does not decode with
// 400 and a JSON error naming it, counts a failure, and never calls the
// core.
func TestMalformedBody(t *testing.T) {
	core, m := &fakeCore{}, &fakeMetrics{}
	mux := serve(t, core, m)
	paths := []string{verbs.PathFilter, verbs.PathPrioritize, verbs.PathPrioritizeCPU, verbs.PathBind, verbs.PathPreempt}
	for _, path := range paths {
		code, reply := post(t, mux, path, `{"Pod": [`)
		if code != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", path, code)
		}
		msg, _ := reply["Error"].(string)
		if e, ok := reply["error"].(string); ok {
			msg = e
		}
		if !strings.Contains(msg, "malformed request body") {
			t.Errorf("%s: reply %v names no malformed body", path, reply)
		}
	}
	if len(core.pods) != 0 {
		t.Errorf("the core was called %d times", len(core.pods))
	}
	if len(m.failed) != len(paths) || len(m.observed) != len(paths) {
		t.Errorf("metrics: failed %v, observed %v", m.failed, m.observed)
	}
}

// TestTrustAndErrors: the pods of the arguments lose the state annotations
// Tessera did not seal before the core sees them, and a core's error is
// the reply's.
func TestTrustAndErrors(t *testing.T) {
	pod := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "u",
			Annotations: map[string]string{api.AnnotationAssignment: `{"forged":true}`}}}
	}
	args, _ := json.Marshal(&extenderv1.ExtenderArgs{Pod: pod(), NodeNames: &[]string{"n"}})
	pargs, _ := json.Marshal(&extenderv1.ExtenderPreemptionArgs{Pod: pod(), NodeNameToVictims: map[string]*extenderv1.Victims{"n": {Pods: []*corev1.Pod{pod()}}}})
	core, m := &fakeCore{}, &fakeMetrics{}
	mux := serve(t, core, m)
	for _, c := range []struct{ path, body string }{{verbs.PathFilter, string(args)}, {verbs.PathPrioritize, string(args)}, {verbs.PathPreempt, string(pargs)}} {
		if code, _ := post(t, mux, c.path, c.body); code != http.StatusOK {
			t.Errorf("%s: status %d", c.path, code)
		}
	}
	if len(core.pods) != 4 {
		t.Fatalf("the core saw %d pods, want 4", len(core.pods))
	}
	for _, p := range core.pods {
		if _, ok := p.Annotations[api.AnnotationAssignment]; ok {
			t.Errorf("an unsealed assignment reached the core: %v", p.Annotations)
		}
	}
	core.err = errors.New("no")
	if code, reply := post(t, mux, verbs.PathBind, `{"podName":"p","node":"n"}`); code != http.StatusOK || reply["Error"] != "no" {
		t.Errorf("bind: %d %v, want 200 with the error", code, reply)
	}
	if code, reply := post(t, mux, verbs.PathPrioritize, string(args)); code != http.StatusBadRequest || reply["error"] != "no" {
		t.Errorf("prioritize: %d %v, want 400 with the error", code, reply)
	}
	if len(m.failed) != 2 {
		t.Errorf("failed %v, want bind and prioritize", m.failed)
	}
}

func TestUntilReady(t *testing.T) {
	ready := false
	h := verbs.UntilReady(func() bool { return ready }, serve(t, &fakeCore{}, nil))
	body := `{"Pod":{},"NodeNames":["n"]}`
	if code, reply := post(t, h, verbs.PathFilter, body); code != http.StatusServiceUnavailable || !strings.Contains(reply["error"].(string), "not synced") {
		t.Errorf("before ready: %d %v", code, reply)
	}
	ready = true
	if code, _ := post(t, h, verbs.PathFilter, body); code != http.StatusOK {
		t.Errorf("when ready: %d", code)
	}
}

// FuzzBodies: whatever the body, every verb answers JSON, 200 or 400 (a
// body that does not decode names itself as malformed), and never panics.
func FuzzBodies(f *testing.F) {
	for _, seed := range []string{``, `{}`, `{"Pod": [`, `null`, `{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n"]}`,
		`{"podName":"p","node":"n"}`, `{"NodeNameToVictims":{"n":{"Pods":[null]}}}`, `{"NodeNameToVictims":{"n":null}}`} {
		f.Add(seed)
	}
	paths := []string{verbs.PathFilter, verbs.PathPrioritize, verbs.PathPrioritizeCPU, verbs.PathBind, verbs.PathPreempt}
	f.Fuzz(func(t *testing.T, body string) {
		mux := http.NewServeMux()
		(&verbs.Handler{Core: &fakeCore{}}).Register(mux)
		for _, path := range paths {
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
			if rec.Code != http.StatusOK && rec.Code != http.StatusBadRequest {
				t.Fatalf("%s: status %d", path, rec.Code)
			}
			if !json.Valid(rec.Body.Bytes()) {
				t.Fatalf("%s: reply is not JSON: %q", path, rec.Body)
			}
			if rec.Code == http.StatusBadRequest && !strings.Contains(rec.Body.String(), "malformed request body") {
				t.Fatalf("%s: 400 without naming the body: %s", path, rec.Body)
			}
		}
	})
}
