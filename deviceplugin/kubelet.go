package deviceplugin

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/deviceplugin/preferred"
)

// podsChanged takes in what the pod watch reports: the assigned GPUs are
// withheld from whole use at once, and a pod that ended makes the agent read
// the kubelet's allocations again, now and a little later, so that the
// GPUs it held are offered again without waiting for the sync interval.
func (a *Agent) podsChanged(assigned map[string]bool, released bool) {
	a.state.setAssigned(assigned)
	if !released {
		return
	}
	// A poke after Run returned finds no reader and is dropped.
	poke(a.syncNow)
	time.AfterFunc(releaseRereadSoon, func() { poke(a.syncNow) })
	time.AfterFunc(releaseRereadLater, func() { poke(a.syncNow) })
}

// assignedNow reads the GPUs assigned to slices of the node's pods from the
// API server, for a whole-GPU allocation. The extender creates the Binding
// of a slice before that of any whole-GPU pod it reserved later on the same
// node, so this read sees every slice the kubelet's choice must avoid. On
// error (or without a pod watch) it returns false and the watch's view
// decides alone.
func (a *Agent) assignedNow(ctx context.Context) (devices.Assignments, bool) {
	if a.opts.Pods == nil {
		return devices.Assignments{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, assignedReadTimeout)
	defer cancel()
	assigned, err := a.opts.Pods.Assigned(ctx)
	if err != nil {
		a.logger.Error(err, "Reading the GPUs assigned to the node's slices; the pod watch's view decides")
		return devices.Assignments{}, false
	}
	return assigned, true
}

// syncLoop re-reads the kubelet's allocations periodically and when poked.
func (a *Agent) syncLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.KubeletSyncInterval.Duration)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.syncNow:
		}
		if err := a.syncKubelet(ctx); err != nil {
			a.logger.Error(err, "Reading the kubelet's allocations; keeping the last known ones")
		}
	}
}

// syncKubelet reads the kubelet's allocations into the state and, with an
// API server, records whole GPUs on pods and learns shared placements.
func (a *Agent) syncKubelet(ctx context.Context) error {
	allocs, listed, err := a.readKubelet(ctx)
	if err != nil {
		return err
	}
	a.applyKubelet(allocs)
	a.checkSynced(listed)
	if a.opts.Publisher == nil {
		return nil
	}
	placements, err := a.opts.Publisher.SyncPods(ctx, allocs, a.gpuIndex, a.migs)
	switch {
	case err == nil:
	case onlyConflicts(err):
		// A pod changed (its status, by the kubelet) since the informer
		// read it: recorded again shortly, from the newer copy.
		a.logger.V(2).Info("A pod changed while its GPUs were recorded; recording again", "err", err)
		time.AfterFunc(conflictRetry, func() { poke(a.syncNow) })
	default:
		a.logger.Error(err, "Recording pods' GPUs")
	}
	a.mu.Lock()
	changed := !mapsEqual(a.placements, placements)
	if changed {
		a.placements = placements
	}
	a.mu.Unlock()
	if changed {
		a.applyKubelet(allocs)
	}
	return nil
}

// readKubelet reads the kubelet's allocations, with the pods it lists
// when its source lists them (nil otherwise).
func (a *Agent) readKubelet(ctx context.Context) ([]kubeletstate.ContainerDevices, []kubeletstate.PodRef, error) {
	switch k := a.opts.Kubelet.(type) {
	case kubeletstate.First:
		allocs, listed, from, err := k.AllocationsPodsFrom(ctx)
		if err != nil {
			return nil, nil, err
		}
		a.logger.V(4).Info("Read the kubelet's allocations", "source", from.Name(), "allocations", len(allocs))
		if listed != nil {
			allocs = a.withInitContainers(ctx, k, allocs, listed)
		}
		return allocs, listed, nil
	case kubeletstate.PodsLister:
		return k.AllocationsAndPods(ctx)
	default:
		allocs, err := a.opts.Kubelet.Allocations(ctx)
		return allocs, nil, err
	}
}

// withInitContainers adds to allocs, the answer of a source of k that
// lists pods (the PodResources API), the devices the kubelet allocated to
// the listed pods' regular init containers, which that API never lists
// although the pod holds them until it ends: from k's sources that do not
// list pods (the device manager's checkpoint, by pod UID), matched to the
// listed pods by the UIDs the pod watch saw
// (kubeletstate.WithInitContainers). So they are recorded on the pod and
// count as in use here: an init container of 2 GPUs before an app
// container of 1 left one GPU shown free in the status views and counted
// by the extender as held for a pod not recorded yet, for the pod's whole
// life. Without a pod watch that tells UIDs, or when no such source
// answers, allocs as they are.
func (a *Agent) withInitContainers(ctx context.Context, k kubeletstate.First, allocs []kubeletstate.ContainerDevices, listed []kubeletstate.PodRef) []kubeletstate.ContainerDevices {
	uids, ok := a.opts.Pods.(PodUIDs)
	if !ok {
		return allocs
	}
	uid := func(namespace, name string) string { return string(uids.PodUID(namespace, name)) }
	for _, s := range k {
		if _, lists := s.(kubeletstate.PodsLister); lists {
			continue
		}
		checkpoint, err := s.Allocations(ctx)
		if err != nil {
			a.logger.V(2).Info("Reading the allocations of init containers, which the kubelet's pod list leaves out", "source", s.Name(), "err", err)
			continue
		}
		return kubeletstate.WithInitContainers(allocs, listed, checkpoint, uid)
	}
	return allocs
}

// admitting tells, for a preferred allocation of size units of shared
// resource r, the GPUs of the slice the kubelet is admitting
// (preferred.Admitting) among slices, from the kubelet's allocations read
// now (the agent's last read may predate the pods admitted a moment ago);
// none when it cannot tell or cannot read the kubelet (bounded by
// assignedReadTimeout).
func (a *Agent) admitting(ctx context.Context, r corev1.ResourceName, size int, slices []devices.SlicePod) []string {
	if len(slices) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, assignedReadTimeout)
	defer cancel()
	allocs, listed, err := a.readKubelet(ctx)
	if err != nil {
		a.logger.Error(err, "Reading the kubelet's allocations to tell which slice it admits; preferring units of every unstarted slice's GPU")
		return nil
	}
	view := preferred.KubeletView{Allocated: map[preferred.AllocKey]bool{}}
	if listed != nil {
		view.Listed = make(map[preferred.PodKey]bool, len(listed))
		for _, p := range listed {
			view.Listed[preferred.PodKey{Namespace: p.Namespace, Name: p.Name}] = true
		}
	}
	for _, c := range allocs {
		view.Allocated[preferred.AllocKey{Namespace: c.Namespace, Name: c.Name, UID: c.PodUID, Container: c.Container, Resource: c.Resource}] = true
	}
	adm, ok := preferred.Admitting(r, size, slices, view)
	if !ok {
		a.logger.V(4).Info("No unstarted slice fits the preferred allocation", "resource", r, "size", size, "slices", len(slices))
		return nil
	}
	a.logger.V(4).Info("Preferring the units of the slice the kubelet admits", "resource", r, "size", size, "pod", adm.Namespace+"/"+adm.Name, "container", adm.Container, "gpus", adm.GPUs)
	return adm.GPUs
}

func mapsEqual(x, y map[kubeletstate.ContainerKey]string) bool {
	if len(x) != len(y) {
		return false
	}
	for k, v := range x {
		if w, ok := y[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// LivePods is what a PodWatch may also tell: whether a pod of the node
// has not ended, by its watch of the API server.
type LivePods interface {
	// Live reports whether the pod is on the node and has not ended.
	Live(namespace, name string) bool
	// LiveList returns the node's pods that have not ended.
	LiveList() []kubeletstate.PodRef
}

// checkSynced ends the wait after a (re)registration for the kubelet to
// have synced the node's pods (state.unsynced): when it lists every pod the
// watch sees running on the node. A restarted kubelet admits the pods of
// its first batch from the API server before it has synced any (its
// device manager frees the devices of ended pods only after that), so
// until then it still counts the units of pods that ended while it was
// down, and a slice bound then was refused ("Requested: 50, Available:
// 10"). Without a watch of the node's pods, or without a kubelet source
// that lists pods (PodResources), nothing can be checked and the wait
// ends; while only the checkpoint answers, it goes on.
func (a *Agent) checkSynced(listed []kubeletstate.PodRef) {
	if a.state.isSynced() {
		return
	}
	live, ok := a.opts.Pods.(LivePods)
	if !ok || !a.kubeletLists() {
		a.state.setSynced()
		return
	}
	if listed == nil {
		return // the listing source did not answer (the checkpoint did)
	}
	have := make(map[kubeletstate.PodRef]bool, len(listed))
	for _, p := range listed {
		have[p] = true
	}
	for _, p := range live.LiveList() {
		if !have[p] {
			a.logger.V(2).Info("Waiting for the kubelet to sync the node's pods before offering GPUs", "missing", p.Namespace+"/"+p.Name)
			return
		}
	}
	a.logger.Info("The kubelet lists every running pod of the node: offering its GPUs", "pods", len(listed))
	a.state.setSynced()
}

// kubeletLists says whether the kubelet source can list the node's pods
// (a PodsLister, alone or among First's sources).
func (a *Agent) kubeletLists() bool {
	srcs := []kubeletstate.Source{a.opts.Kubelet}
	if f, ok := a.opts.Kubelet.(kubeletstate.First); ok {
		srcs = f
	}
	for _, s := range srcs {
		if _, ok := s.(kubeletstate.PodsLister); ok {
			return true
		}
	}
	return false
}

// keepLive adds to allocs the allocations of the last answer whose pods
// are missing from it but have not ended: the kubelet never frees the
// devices of a pod that runs, and a kubelet that has just restarted
// answers PodResources with none until it has synced its pods (a GPU
// released then would be offered to the other kind while its pod runs).
//
// It keeps the result as lastKubelet, which also tells the pods that hold
// a GPU when its health changes (reportHealth).
func (a *Agent) keepLive(allocs []kubeletstate.ContainerDevices) []kubeletstate.ContainerDevices {
	a.mu.Lock()
	defer a.mu.Unlock()
	if live, ok := a.opts.Pods.(LivePods); ok {
		present := map[[2]string]bool{}
		for _, c := range allocs {
			present[[2]string{c.Namespace, c.Name}] = true
		}
		for _, c := range a.lastKubelet {
			if c.Name != "" && !present[[2]string{c.Namespace, c.Name}] && live.Live(c.Namespace, c.Name) {
				allocs = append(allocs, c)
			}
		}
	}
	a.lastKubelet = allocs
	return allocs
}

// RuntimeChanged tells the agent that Options.Runtime changed: it reads
// the kubelet and the runtime's use again soon. It does not block.
func (a *Agent) RuntimeChanged() { poke(a.syncNow) }

func (a *Agent) applyKubelet(allocs []kubeletstate.ContainerDevices) {
	if a.opts.Runtime != nil {
		a.state.setRuntime(a.opts.Runtime.GPUsInUse())
	}
	allocs = a.keepLive(allocs)
	a.mu.Lock()
	placements := a.placements
	a.mu.Unlock()
	out := make([]devices.Allocation, 0, len(allocs))
	for _, c := range allocs {
		d := devices.Allocation{Resource: c.Resource, DeviceIDs: c.DeviceIDs}
		// Shared resources whether this node advertises them or not: the
		// kubelet may still hold devices of one the configuration dropped.
		if api.IsSharedResource(c.Resource) && c.Name != "" {
			d.SharedGPU = placements[c.Key()]
		}
		out = append(out, d)
	}
	a.state.setKubelet(out)
}

// conflictRetry is how soon pods' GPUs are recorded again after a write
// lost to a concurrent change of the pod (the informer catches up first).
const conflictRetry = 500 * time.Millisecond

// onlyConflicts reports whether err is, all its joined errors included,
// the API server's optimistic-concurrency conflict.
func onlyConflicts(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !onlyConflicts(e) {
				return false
			}
		}
		return len(j.Unwrap()) > 0
	}
	if w := errors.Unwrap(err); w != nil {
		return onlyConflicts(w)
	}
	return apierrors.IsConflict(err)
}
