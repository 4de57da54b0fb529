package api

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func testSealer(t *testing.T, b byte) *Sealer {
	t.Helper()
	s, err := NewSealer([]byte(strings.Repeat(string(rune('a'+b)), MinSealKeyBytes)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestNewSealerRefusesShortKeys(t *testing.T) {
	if _, err := NewSealer(make([]byte, MinSealKeyBytes-1)); err == nil {
		t.Fatal("a 31-byte key was accepted")
	}
}

func TestSealedAssignmentRoundTrip(t *testing.T) {
	s := testSealer(t, 0)
	a := NewAssignment()
	a.Containers = append(a.Containers, ContainerAssignment{Name: "c", Shared: &SharedGPU{GPU: GPURef{UUID: "GPU-00000000-0000-0000-0000-00000000000a", Index: 0}, MemoryMiB: 1024, Cores: 10}})
	ann, err := s.AssignmentAnnotations("uid-1", a)
	if err != nil {
		t.Fatal(err)
	}
	got, found, err := s.Assignment("uid-1", ann)
	if !found || err != nil || got.Containers[0].Shared.MemoryMiB != 1024 {
		t.Fatalf("Assignment = %+v, %v, %v", got, found, err)
	}
	if _, found, err := s.Assignment("uid-1", map[string]string{}); found || err != nil {
		t.Fatalf("no annotation: found=%v err=%v", found, err)
	}
}

func TestUnsealedDecisionsAreRefused(t *testing.T) {
	s := testSealer(t, 0)
	a := NewAssignment()
	a.Containers = append(a.Containers, ContainerAssignment{Name: "c", GPUs: []GPURef{{UUID: "GPU-00000000-0000-0000-0000-00000000000a", Index: 0}}})
	good, err := s.AssignmentAnnotations("uid-1", a)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := s.GangPlanAnnotations("uid-1", GangPlan{Gang: "g", Node: "n", Expires: time.Unix(1e9, 0)})
	if err != nil {
		t.Fatal(err)
	}
	with := func(base map[string]string, k, v string) map[string]string {
		out := map[string]string{}
		for kk, vv := range base {
			out[kk] = vv
		}
		if v == "" {
			delete(out, k)
		} else {
			out[k] = v
		}
		return out
	}
	other := testSealer(t, 1)
	forged, _ := other.AssignmentAnnotations("uid-1", a)
	tests := []struct {
		name string
		uid  types.UID
		ann  map[string]string
		read func(*Sealer, types.UID, map[string]string) error
	}{
		{"no seal", "uid-1", with(good, AnnotationAssignmentSeal, ""), readAssignment},
		{"other pod's seal", "uid-2", good, readAssignment},
		{"other key", "uid-1", forged, readAssignment},
		{"value changed", "uid-1", with(good, AnnotationAssignment, strings.Replace(good[AnnotationAssignment], "GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b", 1)), readAssignment},
		{"garbage seal", "uid-1", with(good, AnnotationAssignmentSeal, "v1.!!!"), readAssignment},
		{"old version", "uid-1", with(good, AnnotationAssignmentSeal, "v0."+strings.TrimPrefix(good[AnnotationAssignmentSeal], "v1.")), readAssignment},
		{"assignment seal on a plan", "uid-1", with(plan, AnnotationGangPlanSeal, good[AnnotationAssignmentSeal]), readPlan},
		{"plan without seal", "uid-1", with(plan, AnnotationGangPlanSeal, ""), readPlan},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.read(s, tc.uid, tc.ann)
			if !errors.Is(err, ErrUnsealed) {
				t.Fatalf("err = %v, want ErrUnsealed", err)
			}
		})
	}
	if err := readPlan(s, "uid-1", plan); err != nil {
		t.Fatalf("sealed plan: %v", err)
	}
}

func readAssignment(s *Sealer, uid types.UID, ann map[string]string) error {
	_, _, err := s.Assignment(uid, ann)
	return err
}

func readPlan(s *Sealer, uid types.UID, ann map[string]string) error {
	_, _, err := s.GangPlan(uid, ann)
	return err
}

func TestStateAnnotations(t *testing.T) {
	for _, k := range []string{AnnotationAssignment, AnnotationAssignmentSeal, AnnotationGangPlan, AnnotationGangPlanSeal} {
		if !IsStateAnnotation(k) {
			t.Errorf("%s is not a state annotation", k)
		}
	}
	if IsStateAnnotation(AnnotationGang) {
		t.Errorf("%s (the user's request) is a state annotation", AnnotationGang)
	}
}

func TestGuardedAnnotations(t *testing.T) {
	for _, k := range append(StateAnnotations(), AnnotationQuotaRequeue) {
		if !IsGuardedAnnotation(k) {
			t.Errorf("%s is not guarded", k)
		}
	}
	if IsStateAnnotation(AnnotationQuotaRequeue) {
		t.Errorf("%s (no decision) is a state annotation: it would be sanitized as an unsealed decision", AnnotationQuotaRequeue)
	}
	if IsGuardedAnnotation(AnnotationGang) {
		t.Errorf("%s (the user's request) is guarded", AnnotationGang)
	}
	// GuardedAnnotations returns a fresh slice: appending to it leaves
	// StateAnnotations as it was.
	g := GuardedAnnotations()
	g[0] = "x"
	if StateAnnotations()[0] != AnnotationAssignment {
		t.Error("GuardedAnnotations shares StateAnnotations' array")
	}
}
