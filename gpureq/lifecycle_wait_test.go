package gpureq

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestNotWaiting(t *testing.T) {
	pod := func(uid, node string, deleting bool) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}
		p.UID, p.Spec.NodeName = types.UID("u"+uid), node
		if deleting {
			now := metav1.NewTime(time.Unix(0, 0))
			p.DeletionTimestamp = &now
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"waits", pod("1", "", false), ""},
		{"gone", nil, "its pod ns/p is gone"},
		{"another pod of the name", pod("2", "", false), "its pod ns/p (UID u1) is gone; a new pod has the name"},
		{"being deleted", pod("1", "", true), "its pod ns/p is being deleted or has ended"},
		{"placed", pod("1", "n1", false), "its pod ns/p was placed on node n1"},
	} {
		if got := NotWaiting("ns/p", "u1", tc.pod); got != tc.want {
			t.Errorf("%s: NotWaiting = %q, want %q", tc.name, got, tc.want)
		}
	}
}
