// Package verbs serves kube-scheduler's extender verbs over HTTP. A
// handler decodes the JSON arguments (a body that does not decode gets 400
// and a JSON error naming it), passes the pods through the trust filter,
// calls the extender's domain method (Core) and encodes its result: no
// decision is made here.
package verbs

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"k8s.io/klog/v2"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/internal/podtrust"
)

// Paths of the extender verbs (relative to the urlPrefix).
const (
	PathFilter        = "/filter"
	PathPrioritize    = "/prioritize"
	PathPrioritizeCPU = "/prioritize-cpu"
	PathBind          = "/bind"
	PathPreempt       = "/preempt"
)

// maxBody bounds a request body: a full NodeList of thousands of nodes is
// tens of MiB.
const maxBody = 256 << 20

// Core is the extender's domain as the verbs call it (extender.Server).
type Core interface {
	// FilterArgs answers the filter verb; errors are in the result.
	FilterArgs(ctx context.Context, args *extenderv1.ExtenderArgs) *extenderv1.ExtenderFilterResult
	// PrioritizeArgs scores the nodes; cpuOnly is the verb of the entry
	// without managedResources.
	PrioritizeArgs(ctx context.Context, args *extenderv1.ExtenderArgs, cpuOnly bool) (extenderv1.HostPriorityList, error)
	// Bind binds the pod.
	Bind(ctx context.Context, args *extenderv1.ExtenderBindingArgs) error
	// PreemptArgs keeps the victims that make room.
	PreemptArgs(ctx context.Context, args *extenderv1.ExtenderPreemptionArgs) (*extenderv1.ExtenderPreemptionResult, error)
}

// Metrics observes the verbs (extender.Metrics fits).
type Metrics interface {
	// Observe records the latency of a call of verb begun at start.
	Observe(verb string, start time.Time)
	// Failed counts a call of verb that failed.
	Failed(verb string)
}

// Handler serves the verbs of Core.
type Handler struct {
	Core Core
	// Trust removes from the scheduler's pods what a tenant wrote in
	// Tessera's name: only the decisions it keeps are Tessera's (nil:
	// every state annotation is removed).
	Trust *podtrust.Filter
	// Metrics may be nil.
	Metrics Metrics
}

func (h *Handler) observe(verb string, start time.Time) {
	if h.Metrics != nil {
		h.Metrics.Observe(verb, start)
	}
}

func (h *Handler) failed(verb string) {
	if h.Metrics != nil {
		h.Metrics.Failed(verb)
	}
}

// Register adds the verb handlers to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("POST "+PathFilter, h.filter)
	mux.HandleFunc("POST "+PathPrioritize, h.prioritize(false))
	mux.HandleFunc("POST "+PathPrioritizeCPU, h.prioritize(true))
	mux.HandleFunc("POST "+PathBind, h.bind)
	mux.HandleFunc("POST "+PathPreempt, h.preempt)
}

// ErrorReply is the JSON body of an error answer of a verb whose result
// type has no error field.
type ErrorReply struct {
	Error string `json:"error"`
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed request body: %w", err)
	}
	return nil
}

// WriteJSON writes v as the JSON reply with status.
func WriteJSON(ctx context.Context, w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		klog.FromContext(ctx).V(2).Info("Writing reply failed", "err", err)
	}
}

func (h *Handler) filter(w http.ResponseWriter, r *http.Request) {
	defer h.observe("filter", time.Now())
	ctx := r.Context()
	var args extenderv1.ExtenderArgs
	if err := decode(r, &args); err != nil {
		h.failed("filter")
		WriteJSON(ctx, w, http.StatusBadRequest, &extenderv1.ExtenderFilterResult{Error: err.Error()})
		return
	}
	h.Trust.Pod(args.Pod)
	res := h.Core.FilterArgs(ctx, &args)
	if res.Error != "" {
		h.failed("filter")
	}
	WriteJSON(ctx, w, http.StatusOK, res)
}

func (h *Handler) prioritize(cpuOnly bool) http.HandlerFunc {
	verb := "prioritize"
	if cpuOnly {
		verb = "prioritize-cpu"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		defer h.observe(verb, time.Now())
		ctx := r.Context()
		var args extenderv1.ExtenderArgs
		if err := decode(r, &args); err != nil {
			h.failed(verb)
			WriteJSON(ctx, w, http.StatusBadRequest, &ErrorReply{Error: err.Error()})
			return
		}
		h.Trust.Pod(args.Pod)
		out, err := h.Core.PrioritizeArgs(ctx, &args, cpuOnly)
		if err != nil {
			h.failed(verb)
			WriteJSON(ctx, w, http.StatusBadRequest, &ErrorReply{Error: err.Error()})
			return
		}
		WriteJSON(ctx, w, http.StatusOK, out)
	}
}

func (h *Handler) bind(w http.ResponseWriter, r *http.Request) {
	defer h.observe("bind", time.Now())
	ctx := r.Context()
	var args extenderv1.ExtenderBindingArgs
	if err := decode(r, &args); err != nil {
		h.failed("bind")
		WriteJSON(ctx, w, http.StatusBadRequest, &extenderv1.ExtenderBindingResult{Error: err.Error()})
		return
	}
	res := &extenderv1.ExtenderBindingResult{}
	if err := h.Core.Bind(ctx, &args); err != nil {
		h.failed("bind")
		klog.FromContext(ctx).Info("Bind failed", "pod", klog.KRef(args.PodNamespace, args.PodName), "node", args.Node, "err", err)
		res.Error = err.Error()
	}
	WriteJSON(ctx, w, http.StatusOK, res)
}

func (h *Handler) preempt(w http.ResponseWriter, r *http.Request) {
	defer h.observe("preempt", time.Now())
	ctx := r.Context()
	var args extenderv1.ExtenderPreemptionArgs
	if err := decode(r, &args); err != nil {
		h.failed("preempt")
		WriteJSON(ctx, w, http.StatusBadRequest, &ErrorReply{Error: err.Error()})
		return
	}
	h.Trust.Pod(args.Pod)
	for _, v := range args.NodeNameToVictims {
		if v != nil {
			for _, p := range v.Pods {
				h.Trust.Pod(p)
			}
		}
	}
	res, err := h.Core.PreemptArgs(ctx, &args)
	if err != nil {
		h.failed("preempt")
		WriteJSON(ctx, w, http.StatusBadRequest, &ErrorReply{Error: err.Error()})
		return
	}
	WriteJSON(ctx, w, http.StatusOK, res)
}

// UntilReady answers every request with 503 and a JSON error until ready
// reports true (the informer caches have synced: before that the ledger
// would pass GPUs that are in use), then hands over to next.
func UntilReady(ready func() bool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready() {
			WriteJSON(r.Context(), w, http.StatusServiceUnavailable, &ErrorReply{Error: "tessera-extender: caches not synced yet"})
			return
		}
		next.ServeHTTP(w, r)
	})
}
