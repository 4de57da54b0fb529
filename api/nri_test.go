package api

import "testing"

func TestNUMAAlignmentDisabled(t *testing.T) {
	for _, tc := range []struct {
		annotations map[string]string
		want        bool
	}{
		{nil, false},
		{map[string]string{AnnotationNUMAAlignment: "false"}, true},
		{map[string]string{AnnotationNUMAAlignment: "disabled"}, true},
		{map[string]string{AnnotationNUMAAlignment: "true"}, false},
		{map[string]string{AnnotationNUMAAlignment: "False"}, false},
		{map[string]string{"other": "false"}, false},
	} {
		if got := NUMAAlignmentDisabled(tc.annotations); got != tc.want {
			t.Errorf("NUMAAlignmentDisabled(%v) = %v, want %v", tc.annotations, got, tc.want)
		}
	}
}
