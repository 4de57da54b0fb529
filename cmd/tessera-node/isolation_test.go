package main

import (
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Without an API server, Events are logged with the object they are
// about: an object, or a reference (the device plugin's GPU health Events
// name the Node and pods by reference).
func TestLogEventsNameTheirObject(t *testing.T) {
	var lines []string
	l := logEvents{logger: funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{})}
	l.Eventf(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}}, corev1.EventTypeWarning, "R", "pod %d", 1)
	l.Eventf(&corev1.ObjectReference{Kind: "Node", Name: "n1"}, corev1.EventTypeWarning, "GPUUnhealthy", "GPU %d", 3)
	l.Eventf(&corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "train"}, corev1.EventTypeWarning, "GPUUnhealthy", "GPU %d", 3)
	for i, want := range []string{`"object"={"name"="p" "namespace"="ns"}`, `"object"="Node n1"`, `"object"="Pod ml/train"`} {
		if i >= len(lines) {
			t.Fatalf("%d log lines, want 3: %q", len(lines), lines)
		}
		if !strings.Contains(lines[i], want) {
			t.Errorf("log line %d = %q, want it to contain %s", i, lines[i], want)
		}
	}
}
