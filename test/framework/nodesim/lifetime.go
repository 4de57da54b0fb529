package nodesim

import (
	"math"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
)

// The simulated containers run nothing. A container whose command is a
// plain sleep ends as that sleep would, so that Jobs complete and short
// pods leave on their own:
//
//	command: ["sleep", "30"]                  (or args: ["sleep", "30"])
//	command: ["sh", "-c", "sleep 1.5m"]       (sh, bash, /bin/sh, /bin/bash)
//
// The duration is GNU sleep's: a number with an optional suffix s, m, h
// or d ("infinity" never ends). Any other command runs until the pod is
// deleted.

// maxRun bounds a sleep the simulator honours (longer: runs until deleted).
const maxRun = 365 * 24 * time.Hour

// ContainerRunsFor is how long container c runs before it exits with code
// 0, when its command is a plain sleep; ok is false for a container that
// runs until it is stopped.
func ContainerRunsFor(c *v1.Container) (d time.Duration, ok bool) {
	argv := append(append([]string{}, c.Command...), c.Args...)
	if len(argv) == 3 && isShell(argv[0]) && argv[1] == "-c" {
		argv = strings.Fields(argv[2])
	}
	if len(argv) != 2 || (argv[0] != "sleep" && argv[0] != "/bin/sleep" && argv[0] != "/usr/bin/sleep") {
		return 0, false
	}
	return parseSleep(argv[1])
}

func isShell(s string) bool {
	switch s {
	case "sh", "/bin/sh", "bash", "/bin/bash", "/usr/bin/bash":
		return true
	}
	return false
}

// parseSleep reads one GNU sleep operand: a non-negative decimal number
// with an optional unit suffix (s, m, h, d).
func parseSleep(s string) (time.Duration, bool) {
	unit := time.Second
	switch {
	case strings.HasSuffix(s, "s"):
		s = strings.TrimSuffix(s, "s")
	case strings.HasSuffix(s, "m"):
		s, unit = strings.TrimSuffix(s, "m"), time.Minute
	case strings.HasSuffix(s, "h"):
		s, unit = strings.TrimSuffix(s, "h"), time.Hour
	case strings.HasSuffix(s, "d"):
		s, unit = strings.TrimSuffix(s, "d"), 24*time.Hour
	}
	if s == "" || strings.ContainsAny(s, "+-eExXpP_") {
		return 0, false // signs, exponents, hex, infinity and NaN are not durations here
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f*float64(unit) > float64(maxRun) {
		return 0, false
	}
	return time.Duration(f * float64(unit)), true
}

// PodRunsFor is how long pod runs before it succeeds: the longest of its
// containers' sleeps, when every container sleeps and the pod is not
// restarted when they exit (restartPolicy Never or OnFailure); ok is false
// for a pod that runs until it is deleted.
func PodRunsFor(pod *v1.Pod) (d time.Duration, ok bool) {
	if pod.Spec.RestartPolicy == v1.RestartPolicyAlways || pod.Spec.RestartPolicy == "" || len(pod.Spec.Containers) == 0 {
		return 0, false
	}
	for i := range pod.Spec.Containers {
		c, ok := ContainerRunsFor(&pod.Spec.Containers[i])
		if !ok {
			return 0, false
		}
		d = max(d, c)
	}
	return d, true
}
