package api

import "strings"

// Keys of what Tessera plans, reserves and evicts as one workload, in the
// planner's records, its reservations (ReservationRecord.Workload) and
// the eviction units of preemption and reclaim: a pod planned or evicted
// alone is "pod <namespace>/<name>"; a gang is its Gang.Key
// ("<namespace>/<name>"), and "gang <namespace>/<name>" as an eviction
// unit.
const (
	podKeyPrefix  = "pod "
	gangKeyPrefix = "gang "
)

// PodKey is the key of pod namespace/name as a workload of its own.
func PodKey(namespace, name string) string { return podKeyPrefix + namespace + "/" + name }

// IsPodKey reports whether key is a PodKey.
func IsPodKey(key string) bool { return strings.HasPrefix(key, podKeyPrefix) }

// GangUnitKey is the eviction unit key of the gang whose Gang.Key is
// gangKey.
func GangUnitKey(gangKey string) string { return gangKeyPrefix + gangKey }

// ExtraMemberKey is the eviction unit key of pod, an elastic gang's
// member beyond its minimum, which goes alone (api.Gang.Extras): the key of
// its gang's unit, unitKey, and the pod's name.
func ExtraMemberKey(unitKey, pod string) string { return unitKey + " member " + pod }

// KeyName is key without its kind: "<namespace>/<name>".
func KeyName(key string) string {
	return strings.TrimPrefix(strings.TrimPrefix(key, podKeyPrefix), gangKeyPrefix)
}

// WorkloadName is key as users read it, its kind first: "pod ns/name" or
// "gang ns/name".
func WorkloadName(key string) string {
	if IsPodKey(key) || strings.HasPrefix(key, gangKeyPrefix) {
		return key
	}
	return GangUnitKey(key)
}
