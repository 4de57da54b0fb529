package api

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The gang planner's reservations (docs/queues.md, "Reservations") outlive
// an extender restart through one ConfigMap in the extender's own
// namespace (the seal key's): a tenant cannot write it, so nothing in it
// needs a seal. It holds, per workload that reserved, when its current
// reservation began (so that --reservation-max counts from there, not from
// the restart), the nodes it last held (kept on a tie) and, after a
// reservation ran out, when it may reserve again.
const (
	ReservationsConfigMapName = "tessera-reservations"
	ReservationsDataKey       = "reservations.json"
	KindReservations          = "Reservations"
)

// Reservations is the value of ReservationsDataKey.
type Reservations struct {
	APIVersion   string              `json:"apiVersion"`
	Kind         string              `json:"kind"`
	Reservations []ReservationRecord `json:"reservations"`
}

// ReservationRecord is what the planner keeps of one workload.
type ReservationRecord struct {
	// Workload is the planner's key of the workload: a gang's key, or
	// "pod <namespace>/<name>" for a single queued pod.
	Workload string `json:"workload"`
	// UIDs are the workload's members when the record was written; a
	// record applies only to a workload that still has one of them (not
	// to another one made later under the same name).
	UIDs []types.UID `json:"uids"`
	// Since is when the workload's current reservation began (absent when
	// it holds none).
	Since *time.Time `json:"since,omitempty"`
	// Nodes are the nodes it held last.
	Nodes []string `json:"nodes,omitempty"`
	// NotBefore is, after a reservation ran out, when it may reserve again.
	NotBefore *time.Time `json:"notBefore,omitempty"`
}

// EncodeReservations returns the value of ReservationsDataKey holding
// records (apiVersion and kind filled in).
func EncodeReservations(records []ReservationRecord) (string, error) {
	r := Reservations{APIVersion: Version, Kind: KindReservations, Reservations: records}
	if r.Reservations == nil {
		r.Reservations = []ReservationRecord{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encoding %s: %w", ReservationsDataKey, err)
	}
	if _, err := ParseReservations(string(b)); err != nil {
		return "", err
	}
	return string(b), nil
}

// ParseReservations decodes and validates a ReservationsDataKey value.
func ParseReservations(v string) ([]ReservationRecord, error) {
	r := &Reservations{}
	if err := decodeStrict(v, r); err != nil {
		return nil, fmt.Errorf("%s: %w", ReservationsDataKey, err)
	}
	if r.APIVersion != Version || r.Kind != KindReservations {
		return nil, fmt.Errorf("%s: apiVersion %q kind %q, want %q %q", ReservationsDataKey, r.APIVersion, r.Kind, Version, KindReservations)
	}
	seen := map[string]bool{}
	for i, rec := range r.Reservations {
		switch {
		case rec.Workload == "":
			return nil, fmt.Errorf("%s: reservations[%d]: no workload", ReservationsDataKey, i)
		case seen[rec.Workload]:
			return nil, fmt.Errorf("%s: reservations[%d]: workload %q twice", ReservationsDataKey, i, rec.Workload)
		case len(rec.UIDs) == 0 || slices.Contains(rec.UIDs, ""):
			return nil, fmt.Errorf("%s: reservations[%d] (%s): no member UIDs, or an empty one", ReservationsDataKey, i, rec.Workload)
		case slices.Contains(rec.Nodes, ""):
			return nil, fmt.Errorf("%s: reservations[%d] (%s): an empty node name", ReservationsDataKey, i, rec.Workload)
		}
		seen[rec.Workload] = true
	}
	return r.Reservations, nil
}
