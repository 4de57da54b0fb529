package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
)

// What the planner knows of reservations (when the current one began, the
// nodes a workload held last, until when a workload whose reservation ran
// out may not reserve again) is kept in a ReservationStore, so that an
// extender restart neither gives a reservation a fresh --reservation-max
// nor lets a cooling workload reserve at once. The pass reads the store
// once (retrying on the next pass while it cannot), and writes it at its
// end when what it knows changed: API writes at the edge of the pass.

// ReservationStore keeps the planner's reservation records across restarts
// (KubeReservations: a ConfigMap).
type ReservationStore interface {
	// Load returns the records; none (and no error) when there are none.
	Load(ctx context.Context) ([]api.ReservationRecord, error)
	// Save replaces the records.
	Save(ctx context.Context, records []api.ReservationRecord) error
}

// KubeReservations is the ReservationStore of a real API server: the
// ConfigMap api.ReservationsConfigMapName in Namespace (the extender's
// own, which tenants cannot write).
type KubeReservations struct {
	Client    kubernetes.Interface
	Namespace string
}

var _ ReservationStore = (*KubeReservations)(nil)

// Load implements ReservationStore. A ConfigMap whose value does not parse
// is an error naming it; the planner then starts without records and
// overwrites it at its next change.
func (k *KubeReservations) Load(ctx context.Context) ([]api.ReservationRecord, error) {
	cm, err := k.Client.CoreV1().ConfigMaps(k.Namespace).Get(ctx, api.ReservationsConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", k.Namespace, api.ReservationsConfigMapName, err)
	}
	v, ok := cm.Data[api.ReservationsDataKey]
	if !ok {
		return nil, nil
	}
	recs, err := api.ParseReservations(v)
	if err != nil {
		return nil, fmt.Errorf("ConfigMap %s/%s: %w: %w", k.Namespace, api.ReservationsConfigMapName, ErrMalformedRecords, err)
	}
	return recs, nil
}

// Save implements ReservationStore: an update of the ConfigMap, or its
// creation when it is missing.
func (k *KubeReservations) Save(ctx context.Context, records []api.ReservationRecord) error {
	v, err := api.EncodeReservations(records)
	if err != nil {
		return err
	}
	cms := k.Client.CoreV1().ConfigMaps(k.Namespace)
	cm, err := cms.Get(ctx, api.ReservationsConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: api.ReservationsConfigMapName, Namespace: k.Namespace,
			Labels: map[string]string{"app.kubernetes.io/part-of": "tessera", "app.kubernetes.io/name": "tessera-extender"}},
			Data: map[string]string{api.ReservationsDataKey: v}}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: FieldManager})
		return wrapStore(k.Namespace, err)
	}
	if err != nil {
		return wrapStore(k.Namespace, err)
	}
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[api.ReservationsDataKey] = v
	_, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: FieldManager})
	return wrapStore(k.Namespace, err)
}

func wrapStore(ns string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("writing ConfigMap %s/%s: %w", ns, api.ReservationsConfigMapName, err)
}

// ErrMalformedRecords is wrapped by a ReservationStore's Load when what it
// holds does not parse: the planner then starts without records (and
// overwrites them at its next change) rather than retrying forever.
var ErrMalformedRecords = errors.New("malformed reservation records")

// storeState is the planner's side of its ReservationStore.
type storeState struct {
	store ReservationStore
	// loaded is set once Load succeeded (or found malformed records):
	// nothing is saved before, so that a store that could not be read is
	// not overwritten.
	loaded bool
	// restored are the loaded records not yet matched with a live
	// workload (matched on the pass that loads them).
	restored map[string]api.ReservationRecord
	// restoredSince is, by workload, when its reservation began before a
	// restart; it is the since of its next reservation, until the
	// workload is planned or gone.
	restoredSince map[string]time.Time
	// saved is what the store holds as far as the planner knows.
	saved []api.ReservationRecord
}

// loadStore reads the store once; it logs and retries on the next pass
// when it cannot.
func (p *GangPlanner) loadStore(ctx context.Context) {
	s := &p.store
	if s.store == nil || s.loaded {
		return
	}
	recs, err := s.store.Load(ctx)
	if err != nil {
		logger := klog.FromContext(ctx)
		if !errors.Is(err, ErrMalformedRecords) {
			logger.Info("Reading the reservation records; retrying on the next pass", "err", err)
			return
		}
		logger.Error(err, "Reservation records ignored: they are rewritten at the next change")
		recs = nil
	}
	s.loaded = true
	s.saved = recs
	s.restored = map[string]api.ReservationRecord{}
	for _, r := range recs {
		s.restored[r.Workload] = r
	}
}

// restore applies the records loaded on this pass to the live workloads
// that still have one of the members the record names; the others are
// dropped (the workload is gone, or was made again under its name).
func (p *GangPlanner) restore(groups map[string]*group) {
	s := &p.store
	if len(s.restored) == 0 {
		return
	}
	now := p.now()
	for key, rec := range s.restored {
		delete(s.restored, key)
		gr := groups[key]
		if gr == nil || !slices.ContainsFunc(gr.members, func(m *corev1.Pod) bool { return slices.Contains(rec.UIDs, m.UID) }) {
			continue
		}
		if rec.NotBefore != nil && rec.NotBefore.After(now) {
			if _, ok := p.cooldown[key]; !ok {
				p.cooldown[key] = *rec.NotBefore
			}
		}
		if len(rec.Nodes) > 0 && p.heldBefore[key] == nil {
			p.heldBefore[key] = map[string]bool{}
			for _, n := range rec.Nodes {
				p.heldBefore[key][n] = true
			}
		}
		if rec.Since != nil {
			if s.restoredSince == nil {
				s.restoredSince = map[string]time.Time{}
			}
			s.restoredSince[key] = *rec.Since
		}
	}
}

// records are what the planner knows of the live workloads' reservations.
func (p *GangPlanner) records(groups map[string]*group) []api.ReservationRecord {
	keys := map[string]bool{}
	for k := range p.reserved {
		keys[k] = true
	}
	for k := range p.cooldown {
		keys[k] = true
	}
	for k := range p.heldBefore {
		keys[k] = true
	}
	for k := range p.store.restoredSince {
		keys[k] = true
	}
	var out []api.ReservationRecord
	for k := range keys {
		gr := groups[k]
		if gr == nil {
			continue
		}
		rec := api.ReservationRecord{Workload: k}
		for _, m := range gr.members {
			if m.UID != "" {
				rec.UIDs = append(rec.UIDs, m.UID)
			}
		}
		if len(rec.UIDs) == 0 {
			continue // nothing to recognise it by after a restart
		}
		slices.Sort(rec.UIDs)
		rec.UIDs = slices.Compact(rec.UIDs)
		if r := p.reserved[k]; r != nil {
			since := r.since.UTC()
			rec.Since = &since
		} else if since, ok := p.store.restoredSince[k]; ok {
			since = since.UTC()
			rec.Since = &since
		}
		for n := range p.heldBefore[k] {
			rec.Nodes = append(rec.Nodes, n)
		}
		sort.Strings(rec.Nodes)
		if until, ok := p.cooldown[k]; ok {
			until = until.UTC()
			rec.NotBefore = &until
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workload < out[j].Workload })
	return out
}

// saveStore publishes the records (ReservationRecords) and writes them
// when they changed since the last write.
func (p *GangPlanner) saveStore(ctx context.Context, groups map[string]*group) {
	recs := p.records(groups)
	p.published.Store(&recs)
	s := &p.store
	if s.store == nil || !s.loaded {
		return
	}
	if sameRecords(recs, s.saved) {
		return
	}
	if err := s.store.Save(ctx, recs); err != nil {
		klog.FromContext(ctx).Info("Writing the reservation records; retrying on the next pass", "err", err)
		return
	}
	s.saved = recs
}

// ReservationRecords are the records of the last pass, as the store
// keeps them (the workloads holding a reservation and since when, those
// cooling down): what the status page shows. Safe for concurrent use with
// Sync.
func (p *GangPlanner) ReservationRecords() []api.ReservationRecord {
	if r := p.published.Load(); r != nil {
		return *r
	}
	return nil
}

func sameRecords(a, b []api.ReservationRecord) bool {
	return slices.EqualFunc(a, b, func(x, y api.ReservationRecord) bool {
		return x.Workload == y.Workload && slices.Equal(x.UIDs, y.UIDs) && slices.Equal(x.Nodes, y.Nodes) &&
			sameTime(x.Since, y.Since) && sameTime(x.NotBefore, y.NotBefore)
	})
}

func sameTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}
