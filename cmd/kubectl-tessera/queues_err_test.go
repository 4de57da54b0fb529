package main

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tessera-gpu/tessera/api"
)

// Reading Queues fails with what to check: a user that may not list them
// gets a kubectl auth can-i command it can run (make demo's tenant got the
// CRD question pasted into its middle); a missing CRD gets the question.
func TestReadQueuesErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want string
		not  string
	}{
		{"forbidden", apierrors.NewForbidden(schema.GroupResource{Group: "tessera.dev", Resource: "queues"}, "", nil),
			"(check that your kubeconfig's user may read it: kubectl auth can-i list queues.tessera.dev)", "CRD"},
		{"no CRD", apierrors.NewNotFound(schema.GroupResource{Group: "tessera.dev", Resource: "queues"}, ""),
			"(is the Queue CRD of deploy/crds installed?)", "auth can-i"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{api.QueueGVR: "QueueList"})
			dyn.PrependReactor("list", "queues", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			e := &env{dyn: dyn, server: "https://127.0.0.1:6443"}
			_, err := e.readQueues(t.Context())
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
				t.Errorf("error %v, want it to say %q and not %q", err, tc.want, tc.not)
			}
		})
	}
}
