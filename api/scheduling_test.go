package api

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestGetGPUModels(t *testing.T) {
	tests := []struct {
		ann     map[string]string
		want    []string
		wantErr bool
	}{
		{ann: nil, want: nil},
		{ann: map[string]string{AnnotationGPUModel: "A100|H100"}, want: []string{"A100", "H100"}},
		{ann: map[string]string{AnnotationGPUModel: " A100 "}, want: []string{"A100"}},
		{ann: map[string]string{AnnotationGPUModel: ""}, wantErr: true},
		{ann: map[string]string{AnnotationGPUModel: "A100||H100"}, wantErr: true},
		// Commas are no separator: "A100,,L40S" matched no GPU.
		{ann: map[string]string{AnnotationGPUModel: "A100,,L40S"}, wantErr: true},
		{ann: map[string]string{AnnotationGPUModel: "A100|H100;L40S"}, wantErr: true},
	}
	for _, tc := range tests {
		got, err := GetGPUModels(tc.ann)
		if (err != nil) != tc.wantErr {
			t.Errorf("GetGPUModels(%v) error = %v, want error %v", tc.ann, err, tc.wantErr)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("GetGPUModels(%v) (-want +got):\n%s", tc.ann, diff)
		}
	}
}

func TestGetNVLinkRequired(t *testing.T) {
	tests := []struct {
		ann     map[string]string
		want    bool
		wantErr bool
	}{
		{ann: nil},
		{ann: map[string]string{AnnotationNVLink: NVLinkRequired}, want: true},
		{ann: map[string]string{AnnotationNVLink: NVLinkNone}},
		{ann: map[string]string{AnnotationNVLink: "yes"}, wantErr: true},
	}
	for _, tc := range tests {
		got, err := GetNVLinkRequired(tc.ann)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("GetNVLinkRequired(%v) = %v, %v; want %v, error %v", tc.ann, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestModelAllowed(t *testing.T) {
	const a100 = "NVIDIA A100-SXM4-40GB"
	for _, tc := range []struct {
		want []string
		ok   bool
	}{
		{nil, true},
		{[]string{"H100", "A100"}, true},
		{[]string{"H100", "A10"}, false},
	} {
		if got := ModelAllowed(a100, tc.want); got != tc.ok {
			t.Errorf("ModelAllowed(%q, %q) = %v, want %v", a100, tc.want, got, tc.ok)
		}
	}
}

func TestModelMatches(t *testing.T) {
	tests := []struct {
		model, want string
		match       bool
	}{
		{"NVIDIA A100-SXM4-40GB", "A100", true},
		{"NVIDIA A100-SXM4-40GB", "a100-sxm4", true},
		{"NVIDIA A100-SXM4-40GB", "A10", false},
		{"NVIDIA A10", "A10", true},
		{"NVIDIA H100 80GB HBM3", "H100", true},
		{"NVIDIA H100 80GB HBM3", "100", false},
		{"A100", " ", false},
	}
	for _, tc := range tests {
		if got := ModelMatches(tc.model, tc.want); got != tc.match {
			t.Errorf("ModelMatches(%q, %q) = %v, want %v", tc.model, tc.want, got, tc.match)
		}
	}
}
