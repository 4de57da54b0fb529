package api

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func elasticQuota(spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetNamespace("team-a")
	u.SetName("quota")
	return u
}

func TestElasticQuotaFromUnstructured(t *testing.T) {
	q, err := ElasticQuotaFromUnstructured(elasticQuota(map[string]any{
		"min": map[string]any{string(ResourceGPU): "16", string(ResourceGPUMemory): int64(320)},
		"max": map[string]any{string(ResourceGPU): "32"},
	}))
	if err != nil {
		t.Fatal(err)
	}
	if got := q.Min[ResourceGPU]; got.Cmp(resource.MustParse("16")) != 0 {
		t.Errorf("min gpu = %s, want 16", got.String())
	}
	if got := q.Min[ResourceGPUMemory]; got.Value() != 320 {
		t.Errorf("min gpu-memory = %s, want 320", got.String())
	}
	if got := q.Max[ResourceGPU]; got.Value() != 32 {
		t.Errorf("max gpu = %s, want 32", got.String())
	}
	tests := map[string]struct {
		spec    map[string]any
		wantErr string
	}{
		"garbage quantity": {map[string]any{"min": map[string]any{"tessera.dev/gpu": "lots"}}, `spec.min.tessera.dev/gpu: "lots"`},
		"negative":         {map[string]any{"max": map[string]any{"tessera.dev/gpu": "-1"}}, "negative"},
		"min above max":    {map[string]any{"min": map[string]any{"tessera.dev/gpu": "8"}, "max": map[string]any{"tessera.dev/gpu": "4"}}, "spec.min.tessera.dev/gpu (8) is above spec.max.tessera.dev/gpu (4)"},
		"min not a map":    {map[string]any{"min": "16"}, "spec.min"},
		"not a quantity":   {map[string]any{"min": map[string]any{"tessera.dev/gpu": true}}, "is not a quantity"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := ElasticQuotaFromUnstructured(elasticQuota(tc.spec))
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "team-a/quota") {
				t.Errorf("error = %v, want it to name the object and contain %q", err, tc.wantErr)
			}
		})
	}
}

func TestQuotaRequeueAnnotation(t *testing.T) {
	patch := QuotaRequeuePatch("team-a/gpus@42")
	var obj struct {
		Metadata struct {
			Annotations map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(patch, &obj); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	got, ok := QuotaRequeue(obj.Metadata.Annotations)
	if !ok || got != "team-a/gpus@42" {
		t.Errorf("patch %s sets %q (%v), want team-a/gpus@42", patch, got, ok)
	}
	if _, ok := QuotaRequeue(map[string]string{AnnotationGang: "g"}); ok {
		t.Error("found a requeue annotation on a pod without one")
	}
}
