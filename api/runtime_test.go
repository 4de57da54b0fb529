package api

import (
	"strings"
	"testing"
	"time"
)

func TestParseExpectedRuntime(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  string
	}{
		{"90m", 90 * time.Minute, ""},
		{"2h30m", 150 * time.Minute, ""},
		{"36h", 36 * time.Hour, ""},
		{"45s", 45 * time.Second, ""},
		{"8784h", MaxExpectedRuntime, ""},
		{"8784h1s", 0, "longer than"},
		{"", 0, "empty"},
		{"0s", 0, "not above 0"},
		{"0h", 0, "not above 0"},
		{"-1h", 0, "not a duration"},
		{"+1h", 0, "not a duration"},
		{" 1h", 0, "not a duration"},
		{"1h ", 0, "not a duration"},
		{"1.5h", 0, "not a duration"},
		{"500ms", 0, "not a duration"},
		{"1d", 0, "not a duration"},
		{"3600", 0, "not a duration"},
		{"h", 0, "not a duration"},
		{"1H", 0, "not a duration"},
		{"99999999999999999999h", 0, "not a duration"},
	}
	for _, tc := range tests {
		got, err := ParseExpectedRuntime(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), AnnotationExpectedRuntime) {
				t.Errorf("ParseExpectedRuntime(%q) = %v, %v; want an error naming the annotation with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseExpectedRuntime(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatExpectedRuntime(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{90 * time.Minute, "1h30m"},
		{36 * time.Hour, "36h"},
		{45 * time.Second, "45s"},
		{time.Hour + time.Second, "1h0m1s"},
		{time.Minute + 1500*time.Millisecond, "1m1s"},
	} {
		got := FormatExpectedRuntime(tc.d)
		if got != tc.want {
			t.Errorf("FormatExpectedRuntime(%v) = %q, want %q", tc.d, got, tc.want)
		}
		if back, err := ParseExpectedRuntime(got); err != nil || back != tc.d.Truncate(time.Second) {
			t.Errorf("%q parses to %v, %v", got, back, err)
		}
	}
}

func TestGetExpectedRuntimeAndPreemptible(t *testing.T) {
	if d, ok, err := GetExpectedRuntime(map[string]string{"other": "1h"}); ok || err != nil || d != 0 {
		t.Errorf("absent: %v, %v, %v", d, ok, err)
	}
	if d, ok, err := GetExpectedRuntime(map[string]string{AnnotationExpectedRuntime: "2h"}); !ok || err != nil || d != 2*time.Hour {
		t.Errorf("2h: %v, %v, %v", d, ok, err)
	}
	if _, ok, err := GetExpectedRuntime(map[string]string{AnnotationExpectedRuntime: "2 hours"}); ok || err == nil {
		t.Errorf("2 hours: ok %v, err %v; want an error", ok, err)
	}
	for _, tc := range []struct {
		ann  map[string]string
		want bool
		err  bool
	}{
		{nil, false, false},
		{map[string]string{AnnotationPreemptible: "true"}, true, false},
		{map[string]string{AnnotationPreemptible: "false"}, false, false},
		{map[string]string{AnnotationPreemptible: "True"}, false, true},
		{map[string]string{AnnotationPreemptible: "yes"}, false, true},
		{map[string]string{AnnotationPreemptible: ""}, false, true},
	} {
		got, err := GetPreemptible(tc.ann)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("GetPreemptible(%v) = %v, %v; want %v, error %v", tc.ann, got, err, tc.want, tc.err)
		}
	}
}
