package nodesim

import (
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
)

func TestContainerRunsFor(t *testing.T) {
	for _, tc := range []struct {
		name          string
		command, args []string
		want          time.Duration
		ok            bool
	}{
		{"sleep seconds", []string{"sleep", "30"}, nil, 30 * time.Second, true},
		{"in args", nil, []string{"sleep", "2.5"}, 2500 * time.Millisecond, true},
		{"split", []string{"/bin/sleep"}, []string{"1m"}, time.Minute, true},
		{"shell", []string{"sh", "-c", "sleep 1.5h"}, nil, 90 * time.Minute, true},
		{"bash in args", []string{"/bin/bash"}, []string{"-c", " sleep  2d "}, 48 * time.Hour, true},
		{"zero", []string{"sleep", "0"}, nil, 0, true},
		{"suffix s", []string{"sleep", "5s"}, nil, 5 * time.Second, true},
		{"no command: the image's", nil, nil, 0, false},
		{"other command", []string{"python", "train.py"}, nil, 0, false},
		{"sleep then more", []string{"sh", "-c", "sleep 5; python train.py"}, nil, 0, false},
		{"two operands", []string{"sleep", "1", "2"}, nil, 0, false},
		{"infinity", []string{"sleep", "infinity"}, nil, 0, false},
		{"negative", []string{"sleep", "-1"}, nil, 0, false},
		{"exponent", []string{"sleep", "1e3"}, nil, 0, false},
		{"hex", []string{"sleep", "0x10"}, nil, 0, false},
		{"garbage", []string{"sleep", "soon"}, nil, 0, false},
		{"bare unit", []string{"sleep", "m"}, nil, 0, false},
		{"beyond a year", []string{"sleep", "400d"}, nil, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ContainerRunsFor(&v1.Container{Command: tc.command, Args: tc.args})
			if got != tc.want || ok != tc.ok {
				t.Errorf("ContainerRunsFor(%q %q) = %v, %v; want %v, %v", tc.command, tc.args, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestPodRunsFor(t *testing.T) {
	sleep := func(s string) v1.Container { return v1.Container{Name: "c" + s, Command: []string{"sleep", s}} }
	pod := func(policy v1.RestartPolicy, cs ...v1.Container) *v1.Pod {
		return &v1.Pod{Spec: v1.PodSpec{RestartPolicy: policy, Containers: cs}}
	}
	for _, tc := range []struct {
		name string
		pod  *v1.Pod
		want time.Duration
		ok   bool
	}{
		{"Never: the longest sleep", pod(v1.RestartPolicyNever, sleep("5"), sleep("30")), 30 * time.Second, true},
		{"OnFailure", pod(v1.RestartPolicyOnFailure, sleep("5")), 5 * time.Second, true},
		{"Always: restarted, runs on", pod(v1.RestartPolicyAlways, sleep("5")), 0, false},
		{"unset is Always", pod("", sleep("5")), 0, false},
		{"one container runs on", pod(v1.RestartPolicyNever, sleep("5"), v1.Container{Name: "server"}), 0, false},
		{"no containers", pod(v1.RestartPolicyNever), 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, ok := PodRunsFor(tc.pod); got != tc.want || ok != tc.ok {
				t.Errorf("PodRunsFor = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func FuzzContainerRunsFor(f *testing.F) {
	for _, s := range []string{"30", "2.5m", "1.5h", "2d", "infinity", "-1", "1e3", "0x10", "", "s", "9999999999999d", "NaN"} {
		f.Add("sleep", s, "")
		f.Add("sh", "-c", "sleep "+s)
	}
	f.Fuzz(func(t *testing.T, a, b, c string) {
		for _, argv := range [][]string{{a, b}, {a, b, c}} {
			d, ok := ContainerRunsFor(&v1.Container{Command: argv})
			if !ok && d != 0 {
				t.Fatalf("%q: not ok but %v", argv, d)
			}
			if ok && (d < 0 || d > maxRun) {
				t.Fatalf("%q: %v outside 0..%v", argv, d, maxRun)
			}
		}
	})
}
