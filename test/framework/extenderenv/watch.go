package extenderenv

import (
	"context"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	toolscache "k8s.io/client-go/tools/cache"
)

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }

// Bind is one pod (one UID) seen bound by a PodWatch.
type Bind struct {
	Namespace, Name string
	UID             types.UID
	Node            string
	// At is when the watch first saw the pod bound (the watch lags the
	// Binding by a few milliseconds).
	At time.Time
	// Gone is when the watch saw the pod deleted (zero while it exists).
	Gone time.Time
}

// PodWatch records, from a pod informer over all namespaces, every pod
// that was ever bound (each UID once: a pod deleted and recreated under
// the same name counts twice).
type PodWatch struct {
	mu    sync.Mutex
	binds map[types.UID]*Bind
	order []types.UID
}

// WatchPods starts a PodWatch that runs until t ends.
func (e *Env) WatchPods(t testing.TB) *PodWatch {
	t.Helper()
	w := &PodWatch{binds: map[types.UID]*Bind{}}
	factory := informers.NewSharedInformerFactory(e.Client, 0)
	inf := factory.Core().V1().Pods().Informer()
	record := func(obj any) {
		p, ok := obj.(*v1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, seen := w.binds[p.UID]; !seen {
			w.binds[p.UID] = &Bind{Namespace: p.Namespace, Name: p.Name, UID: p.UID, Node: p.Spec.NodeName, At: time.Now()}
			w.order = append(w.order, p.UID)
		}
	}
	gone := func(obj any) {
		if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		p, ok := obj.(*v1.Pod)
		if !ok {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if b := w.binds[p.UID]; b != nil && b.Gone.IsZero() {
			b.Gone = time.Now()
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: gone,
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	t.Cleanup(func() { cancel(); factory.Shutdown() })
	if !toolscache.WaitForCacheSync(t.Context().Done(), inf.HasSynced) {
		t.Fatal("pod informer did not sync")
	}
	return w
}

// Binds returns every bind seen, in the order seen.
func (w *PodWatch) Binds() []Bind {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Bind, 0, len(w.order))
	for _, uid := range w.order {
		out = append(out, *w.binds[uid])
	}
	return out
}

// BoundNow returns, by pod name, the bind time of the pods in namespace
// ns whose name starts with prefix that were seen bound and not seen
// deleted.
func (w *PodWatch) BoundNow(ns, prefix string) map[string]time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]time.Time{}
	for _, b := range w.binds {
		if b.Namespace == ns && strings.HasPrefix(b.Name, prefix) && b.Gone.IsZero() {
			out[b.Name] = b.At
		}
	}
	return out
}

// BindsOf returns every bind (live or gone) of pods in ns whose name
// starts with prefix, in the order seen.
func (w *PodWatch) BindsOf(ns, prefix string) []Bind {
	var out []Bind
	for _, b := range w.Binds() {
		if b.Namespace == ns && strings.HasPrefix(b.Name, prefix) {
			out = append(out, b)
		}
	}
	return out
}

// Spread is the time between the earliest and the latest of times.
func Spread(times map[string]time.Time) time.Duration {
	var all []time.Time
	for _, at := range times {
		all = append(all, at)
	}
	if len(all) == 0 {
		return 0
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Before(all[j]) })
	return all[len(all)-1].Sub(all[0])
}
