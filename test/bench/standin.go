package main

import (
	"context"
	"fmt"
	"sync"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// podStandIn is what the stand-ins for the node agents the fake nodes lack
// (hamiNodeAgent, tesseraNodeAgent) share: a pod informer of one namespace
// whose events queue keys, and workers that handle each key, a failure
// retried a few times with the controller rate limiter and counted.
type podStandIn[K comparable] struct {
	factory informers.SharedInformerFactory
	queue   workqueue.TypedRateLimitingInterface[K]
	stopCh  chan struct{}
	wg      sync.WaitGroup

	failMu   sync.Mutex
	failures int
	lastErr  error
}

func newPodStandIn[K comparable](client kubernetes.Interface, ns string) *podStandIn[K] {
	return &podStandIn[K]{
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns)),
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[K]()),
		stopCh:  make(chan struct{}),
	}
}

// informer is the pod informer (add indexers before run).
func (s *podStandIn[K]) informer() cache.SharedIndexInformer {
	return s.factory.Core().V1().Pods().Informer()
}

// run queues keyOf(pod) for every pod added or updated for which it
// answers true, starts the informer, waits for its sync and starts workers
// that call handle, each key retried up to retries times. name names the
// stand-in in errors.
func (s *podStandIn[K]) run(ctx context.Context, name string, keyOf func(*v1.Pod) (K, bool), handle func(context.Context, K) error, workers, retries int) error {
	seen := func(obj any) {
		if p, ok := obj.(*v1.Pod); ok {
			if k, ok := keyOf(p); ok {
				s.queue.Add(k)
			}
		}
	}
	inf := s.informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, o any) { seen(o) }}); err != nil {
		return fmt.Errorf("%s informer: %w", name, err)
	}
	s.factory.Start(s.stopCh)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		s.stop()
		return fmt.Errorf("%s: pod informer did not sync: %w", name, ctx.Err())
	}
	for range workers {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			for {
				key, quit := s.queue.Get()
				if quit {
					return
				}
				err := handle(ctx, key)
				if err != nil && s.queue.NumRequeues(key) < retries {
					s.queue.AddRateLimited(key)
				} else {
					s.queue.Forget(key)
				}
				if err != nil {
					s.failMu.Lock()
					s.failures++
					s.lastErr = err
					s.failMu.Unlock()
				}
				s.queue.Done(key)
			}
		}()
	}
	return nil
}

// stop ends the workers and the informer.
func (s *podStandIn[K]) stop() {
	s.queue.ShutDown()
	s.wg.Wait()
	close(s.stopCh)
	s.factory.Shutdown()
}

// failed is how many times handle failed, and its last error.
func (s *podStandIn[K]) failed() (int, error) {
	s.failMu.Lock()
	defer s.failMu.Unlock()
	return s.failures, s.lastErr
}
