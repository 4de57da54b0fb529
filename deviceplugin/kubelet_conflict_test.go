package deviceplugin

import (
	"errors"
	"fmt"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestOnlyConflicts(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "q4", errors.New("the object has been modified"))
	other := apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "q5", errors.New("no"))
	wrap := func(errs ...error) error {
		return fmt.Errorf("recording GPU assignments: %w", errors.Join(errs...))
	}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"one conflict, as SyncPods wraps it", wrap(fmt.Errorf("recording GPUs of pod migq/q4: %w", conflict)), true},
		{"two conflicts", wrap(conflict, conflict), true},
		{"a conflict and another error", wrap(conflict, other), false},
		{"another error", wrap(other), false},
		{"plain", errors.New("boom"), false},
	} {
		if got := onlyConflicts(tc.err); got != tc.want {
			t.Errorf("%s: onlyConflicts = %v, want %v", tc.name, got, tc.want)
		}
	}
}
