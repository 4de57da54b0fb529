package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin"
	"github.com/tessera-gpu/tessera/deviceplugin/kubeletstate"
	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/gpureq"
	"github.com/tessera-gpu/tessera/isolation"
	"github.com/tessera-gpu/tessera/topology"
)

// errMIGRestart ends one round of serving: a GPU was (or was to be)
// repartitioned, so the topology, device plugins, inventory and NRI plugin
// are built again from the driver.
var errMIGRestart = errors.New("serving again after a MIG repartition")

// migWatch is the agent's side of dynamic MIG (--dynamic-mig): it polls
// its Node's AnnotationMIGLayoutRequest and, when a GPU's wanted layout
// differs from its current one, the pod the request is for still waits
// and the GPU has no tenant, stops the device
// plugins (so the kubelet allocates nothing meanwhile), checks the tenants
// again, repartitions, records AnnotationMIGLayoutStatus and serves again.
// A GPU with a tenant is never touched: the request stays, the status says
// Refused and an Event on the Node says why.
type migWatch struct {
	client   kubernetes.Interface
	node     string
	rep      *deviceplugin.MIGRepartitioner
	events   isolation.EventRecorder
	interval time.Duration

	pending *api.MIGLayoutRequest // set when run stopped serving for it
	written string                // the last status value written
	failed  *migFailure
}

// migFailure is the generation whose repartition NVML failed, and when;
// it is retried after failRetry. It outlives a round of serving.
type migFailure struct {
	gen int64
	at  time.Time
}

// failRetry is how long a request whose repartition failed waits before
// it is tried again (each try stops and restarts the device plugins).
const failRetry = 30 * time.Second

func newMIGWatch(client kubernetes.Interface, node string, topo *topology.Topology, driver deviceplugin.MIGDriver, kubelet kubeletstate.Source, events isolation.EventRecorder, failed *migFailure) *migWatch {
	gpus := map[string]int{}
	for _, g := range topo.GPUs {
		gpus[g.UUID] = g.Index
	}
	return &migWatch{
		client: client, node: node, events: events, interval: 2 * time.Second, failed: failed,
		rep: &deviceplugin.MIGRepartitioner{Driver: driver, Kubelet: kubelet, GPUs: gpus},
	}
}

// run polls until ctx ends or a request is to be applied; then it records
// the request in w.pending and calls stop.
func (w *migWatch) run(ctx context.Context, stop func()) {
	logger := klog.FromContext(ctx).WithName("dynamic-mig")
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		if req := w.poll(klog.NewContext(ctx, logger)); req != nil {
			w.pending = req
			stop()
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// persistMockMIG keeps a mock backend's MIG layouts in file (--mock-mig-state),
// so that a restarted agent finds what a repartition left, as on a driver.
func persistMockMIG(backend *gpu.Backend, file string) error {
	if file == "" {
		return nil
	}
	if backend.Mock == nil {
		return errors.New("--mock-mig-state needs a mock GPU backend (--nvml=mock:...)")
	}
	return backend.Mock.PersistMIG(file)
}

// servesMIGLayouts wraps the agent's publisher so that its inventory says
// the agent serves MIG layout requests (api.GPUInventory.DynamicMIG): the
// extender asks only such nodes. An agent without --dynamic-mig publishes
// the inventory without it.
type servesMIGLayouts struct{ deviceplugin.Publisher }

func (p servesMIGLayouts) PublishInventory(ctx context.Context, inv *api.GPUInventory) error {
	c := *inv
	c.DynamicMIG = true
	return p.Publisher.PublishInventory(ctx, &c)
}

// podWaits returns "" when the pod req is for exists (same UID), is not
// being deleted, has not ended and is bound to no node; else why not. A
// request is served only then: never a repartition for no pod (one whose
// pod was deleted while the agent was down, or placed elsewhere). An
// error reading the pod also refuses.
func (w *migWatch) podWaits(ctx context.Context, req *api.MIGLayoutRequest) string {
	if req.Pod == nil {
		return "the request names no pod"
	}
	pod, err := w.client.CoreV1().Pods(req.Pod.Namespace).Get(ctx, req.Pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return fmt.Sprintf("reading its pod %s: %v", req.Pod, err)
	}
	return gpureq.NotWaiting(req.Pod.String(), req.Pod.UID, pod)
}

// poll reads the request; it returns it when a GPU is to be repartitioned.
func (w *migWatch) poll(ctx context.Context) *api.MIGLayoutRequest {
	logger := klog.FromContext(ctx)
	node, err := w.client.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{})
	if err != nil {
		logger.Error(err, "Reading the Node for its MIG layout request")
		return nil
	}
	value, ok := node.Annotations[api.AnnotationMIGLayoutRequest]
	if !ok {
		return nil
	}
	req, err := api.ParseMIGLayoutRequest(value)
	if err != nil {
		logger.Error(err, "Ignoring a malformed MIG layout request")
		return nil
	}
	changes, err := w.rep.Changes(req)
	if err != nil {
		w.record(ctx, node, api.MIGLayoutStatus{Generation: req.Generation, State: api.MIGLayoutRefused, Message: err.Error()})
		return nil
	}
	if len(changes) == 0 {
		w.record(ctx, node, api.MIGLayoutStatus{Generation: req.Generation, State: api.MIGLayoutApplied})
		return nil
	}
	if req.Generation == w.failed.gen && time.Since(w.failed.at) < failRetry {
		return nil
	}
	if why := w.podWaits(ctx, req); why != "" {
		w.record(ctx, node, api.MIGLayoutStatus{Generation: req.Generation, State: api.MIGLayoutRefused, Message: "no pod needs it: " + why + "; nothing touched"})
		return nil
	}
	if err := w.rep.CheckTenants(ctx, changes); err != nil {
		w.record(ctx, node, api.MIGLayoutStatus{Generation: req.Generation, State: api.MIGLayoutRefused, Message: err.Error()})
		return nil
	}
	return req
}

// apply serves w.pending once the device plugins are stopped: only if the
// Node still holds that request and its pod still waits (the extender may
// have withdrawn it meanwhile).
func (w *migWatch) apply(ctx context.Context) {
	logger := klog.FromContext(ctx)
	req := w.pending
	w.pending = nil
	node, err := w.client.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{})
	if err != nil {
		logger.Error(err, "Reading the Node before applying its MIG layout request; not applied")
		return
	}
	if now, err := api.ParseMIGLayoutRequest(node.Annotations[api.AnnotationMIGLayoutRequest]); err != nil || now.Generation != req.Generation {
		logger.Info("MIG layout request withdrawn or replaced before it was applied; nothing touched", "generation", req.Generation)
		return
	}
	if why := w.podWaits(ctx, req); why != "" {
		w.record(ctx, node, api.MIGLayoutStatus{Generation: req.Generation, State: api.MIGLayoutRefused, Message: "no pod needs it: " + why + "; nothing touched"})
		return
	}
	st, changed := w.rep.Apply(ctx, req)
	if st.State == api.MIGLayoutFailed {
		*w.failed = migFailure{gen: req.Generation, at: time.Now()}
	}
	logger.Info("MIG layout request served", "generation", req.Generation, "pod", req.Pod, "state", st.State, "message", st.Message, "changed", changed)
	if node, err = w.client.CoreV1().Nodes().Get(ctx, w.node, metav1.GetOptions{}); err != nil {
		logger.Error(err, "Reading the Node to record the MIG layout status")
		return
	}
	w.record(ctx, node, st)
}

// record writes st as the Node's AnnotationMIGLayoutStatus when it says
// something new, with an Event when the request was refused or failed.
func (w *migWatch) record(ctx context.Context, node *corev1.Node, st api.MIGLayoutStatus) {
	logger := klog.FromContext(ctx)
	st.APIVersion, st.Kind = api.Version, api.KindMIGLayoutStatus
	value, err := api.EncodeMIGLayoutStatus(&st)
	if err != nil {
		logger.Error(err, "Encoding the MIG layout status")
		return
	}
	if value == w.written || node.Annotations[api.AnnotationMIGLayoutStatus] == value {
		w.written = value
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationMIGLayoutStatus: value}}})
	if err != nil {
		logger.Error(err, "Encoding the MIG layout status patch")
		return
	}
	if _, err := w.client.CoreV1().Nodes().Patch(ctx, w.node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		logger.Error(err, "Recording the MIG layout status")
		return
	}
	w.written = value
	switch st.State {
	case api.MIGLayoutRefused:
		w.events.Eventf(node, corev1.EventTypeWarning, "MIGRepartitionRefused", "MIG layout request %d not applied: %s", st.Generation, st.Message)
	case api.MIGLayoutFailed:
		w.events.Eventf(node, corev1.EventTypeWarning, "MIGRepartitionFailed", "MIG layout request %d failed: %s", st.Generation, st.Message)
	case api.MIGLayoutApplied:
		w.events.Eventf(node, corev1.EventTypeNormal, "MIGRepartitioned", "MIG layout request %d applied", st.Generation)
	}
	logger.Info("MIG layout status recorded", "status", fmt.Sprintf("%s %d %s", st.State, st.Generation, st.Message))
}
