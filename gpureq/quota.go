package gpureq

import (
	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

// QuotaUse is what pod counts against its namespace's quota (QuotaCount)
// and, beside it, the refusal of a request ParsePod refuses: such a pod
// still counts what it asks for (it can only run when bound without the
// extender).
func QuotaUse(pod *corev1.Pod) (quota.Resources, error) {
	_, err := ParsePod(pod)
	return QuotaCount(pod), err
}

// QuotaCount is what pod counts against its namespace's quota: of each
// resource quota governs (api.QuotaResources, and each MIG profile's
// resource), what the pod holds at its
// peak (the rule of PeakUnits, which kube-scheduler applies too; a request
// defaults to the limit), in whole units. For a pod ParsePod accepts these
// are its Peak units exactly (a core-only slice counts its cores, not the
// memory it is given on its node); for one it refuses, what it asks for,
// rounded up to whole units. It does not parse the request: for a reader
// that only counts (the extender's quota ledger, for every pod of a
// namespace at each check).
func QuotaCount(pod *corev1.Pod) quota.Resources {
	reqs := resourcehelper.PodRequests(effective(pod, anyResource), resourcehelper.PodResourcesOptions{ExcludeOverhead: true, SkipPodLevelResources: true})
	out := quota.Resources{}
	for name, q := range reqs {
		if !api.QuotaGoverned(name) {
			continue
		}
		if v := q.Value(); v > 0 {
			out[name] = v
		}
	}
	return out
}
