package nodesim

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
)

// ElasticQuotaGVR is scheduler-plugins' ElasticQuota (deploy/crds, which
// StartCluster installs).
var ElasticQuotaGVR = schema.GroupVersionResource{Group: "scheduling.x-k8s.io", Version: "v1alpha1", Resource: "elasticquotas"}

// Dynamic returns an admin dynamic client.
func (c *Cluster) Dynamic() (dynamic.Interface, error) {
	return dynamic.NewForConfig(c.CP.RESTConfig())
}
