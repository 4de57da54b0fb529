package extender

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// GroupVersionResourcer is the part of a discovery client a CRDWatcher
// needs to see whether its CRD is installed.
type GroupVersionResourcer interface {
	ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error)
}

// CRDWatcher watches the objects of a custom resource that may not be
// installed (ElasticQuotas, Queues) with a dynamic informer. While the CRD
// is not installed it says so once in the log, treats that as "no
// objects", and looks again every Retry, so that a CRD installed later is
// picked up without a restart.
type CRDWatcher struct {
	Dynamic   dynamic.Interface
	Discovery GroupVersionResourcer
	// Retry is how often an absent CRD is looked for again.
	Retry time.Duration
	// Resource is what is watched; Kind names it in the log.
	Resource schema.GroupVersionResource
	Kind     string
	// OnChange, when set before Run, is called on every change.
	OnChange func()

	store   atomic.Pointer[toolscache.Store]
	decided atomic.Bool
}

// Decided reports whether the watcher knows the objects in force: the CRD
// was found absent, or the informer has synced. The extender is not ready
// before.
func (w *CRDWatcher) Decided() bool { return w.decided.Load() }

// Objects returns the objects of the informer's store: none while the CRD
// is not installed.
func (w *CRDWatcher) Objects() []*unstructured.Unstructured {
	sp := w.store.Load()
	if sp == nil {
		return nil
	}
	var objs []*unstructured.Unstructured
	for _, o := range (*sp).List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			objs = append(objs, u)
		}
	}
	return objs
}

// crdInstalled reports whether the API server serves the resource.
func (w *CRDWatcher) crdInstalled() (bool, error) {
	gv := w.Resource.GroupVersion().String()
	list, err := w.Discovery.ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gv, err)
	}
	for _, r := range list.APIResources {
		if r.Name == w.Resource.Resource {
			return true, nil
		}
	}
	return false, nil
}

// Run looks for the CRD until it is installed, then runs the informer
// until ctx is done.
func (w *CRDWatcher) Run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithValues("resource", w.Resource.String())
	retry := w.Retry
	if retry <= 0 {
		retry = 30 * time.Second
	}
	saidAbsent := false
	for {
		ok, err := w.crdInstalled()
		switch {
		case err != nil:
			logger.Info("Cannot tell whether the CRD is installed; none of its objects apply meanwhile, retrying", "kind", w.Kind, "err", err, "retry", retry)
			w.decided.Store(true)
		case !ok:
			if !saidAbsent {
				logger.Info("The CRD is not installed: none of its objects apply; looking for it again periodically", "kind", w.Kind, "retry", retry)
				saidAbsent = true
			}
			w.decided.Store(true)
		default:
			w.watch(ctx, logger, retry)
			if ctx.Err() != nil {
				return
			}
			saidAbsent = true // watch said it went
			continue
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}

// watch runs the informer until ctx is done or the CRD is found removed
// (checked every retry; a discovery error changes nothing): then the
// objects are dropped, since nothing can be enforced that cannot be read.
func (w *CRDWatcher) watch(ctx context.Context, logger klog.Logger, retry time.Duration) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	inf := dynamicinformer.NewFilteredDynamicInformer(w.Dynamic, w.Resource, metav1.NamespaceAll, 0, toolscache.Indexers{}, nil).Informer()
	if w.OnChange != nil {
		changed := func(any) { w.OnChange() }
		if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
			AddFunc: changed, UpdateFunc: func(_, o any) { changed(o) }, DeleteFunc: changed,
		}); err != nil {
			logger.Error(err, "Informer handler", "kind", w.Kind)
		}
	}
	go inf.Run(ctx.Done())
	if !toolscache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return
	}
	store := inf.GetStore()
	w.store.Store(&store)
	w.decided.Store(true)
	logger.Info("Watching", "kind", w.Kind, "count", len(store.List()))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
		if ok, err := w.crdInstalled(); err == nil && !ok {
			logger.Info("The CRD was removed: none of its objects apply; looking for it again periodically", "kind", w.Kind, "retry", retry)
			w.store.Store(nil)
			if w.OnChange != nil {
				w.OnChange()
			}
			return
		}
	}
}
