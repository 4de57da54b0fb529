package api

import (
	"fmt"
	"strings"
	"time"
)

// Run-time hints for reservations with backfill (allocator/reserve,
// extender reservations). Both are written by the tenant on a pod; a gang
// has an expected run time when every member declares one (the longest
// counts) and is preemptible when every member is marked so. They are
// hints, not limits: nothing stops a pod at its expected run time.
const (
	// AnnotationExpectedRuntime is how long the pod expects to run once
	// started, a Go duration of whole seconds in hours, minutes and
	// seconds ("90m", "2h30m", "36h"), above 0 and at most
	// MaxExpectedRuntime. A pod that waits behind a reservation may start
	// on the reservation's GPUs when, by this estimate, it ends before the
	// reservation starts; if it is still running past its estimate when
	// the reservation can otherwise start, it is evicted. So an estimate
	// that is too short hurts only the pod that declared it; one that is
	// too long only makes it wait for room outside the reservation.
	AnnotationExpectedRuntime = Domain + "/expected-runtime"
	// AnnotationPreemptible, "true" or "false" (the default), lets a pod
	// start on a reservation's GPUs whatever its run time: it is evicted
	// when the reservation fills (the reservation's workload could
	// otherwise start there).
	AnnotationPreemptible = Domain + "/preemptible"

	// MaxExpectedRuntime is the longest expected run time (a year).
	MaxExpectedRuntime = 366 * 24 * time.Hour
)

// ParseExpectedRuntime parses an AnnotationExpectedRuntime value strictly:
// a Go duration of whole seconds using only the units h, m and s, above 0
// and at most MaxExpectedRuntime, without spaces or a sign.
func ParseExpectedRuntime(v string) (time.Duration, error) {
	bad := func(why string) (time.Duration, error) {
		return 0, fmt.Errorf("annotation %s: %q %s", AnnotationExpectedRuntime, v, why)
	}
	if v == "" {
		return bad("is empty; want a duration such as 90m or 36h")
	}
	for _, r := range v {
		if !strings.ContainsRune("0123456789hms", r) {
			return bad("is not a duration of hours, minutes and seconds such as 90m or 2h30m")
		}
	}
	if strings.Contains(v, "ms") {
		return bad("is not a duration of hours, minutes and seconds such as 90m or 2h30m")
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return bad("is not a duration of hours, minutes and seconds such as 90m or 2h30m")
	}
	switch {
	case d <= 0:
		return bad("is not above 0")
	case d > MaxExpectedRuntime:
		return bad(fmt.Sprintf("is longer than %s", MaxExpectedRuntime))
	}
	return d, nil
}

// FormatExpectedRuntime is the annotation value of d (whole seconds, as
// ParseExpectedRuntime reads it).
func FormatExpectedRuntime(d time.Duration) string {
	d = d.Truncate(time.Second)
	s := d.String() // e.g. 2h30m0s
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// GetExpectedRuntime reads a pod's AnnotationExpectedRuntime; ok is false
// when it has none.
func GetExpectedRuntime(annotations map[string]string) (d time.Duration, ok bool, err error) {
	v, ok := annotations[AnnotationExpectedRuntime]
	if !ok {
		return 0, false, nil
	}
	d, err = ParseExpectedRuntime(v)
	if err != nil {
		return 0, false, err
	}
	return d, true, nil
}

// GetPreemptible reads a pod's AnnotationPreemptible: false when absent,
// an error for anything but "true" or "false".
func GetPreemptible(annotations map[string]string) (bool, error) {
	v, ok := annotations[AnnotationPreemptible]
	if !ok {
		return false, nil
	}
	switch v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("annotation %s: %q is neither \"true\" nor \"false\"", AnnotationPreemptible, v)
}

// CheckRuntimeHints reports the first malformed run-time hint among a
// pod's annotations (AnnotationExpectedRuntime, AnnotationPreemptible);
// nil when both are absent or well formed.
func CheckRuntimeHints(annotations map[string]string) error {
	if _, _, err := GetExpectedRuntime(annotations); err != nil {
		return err
	}
	_, err := GetPreemptible(annotations)
	return err
}
