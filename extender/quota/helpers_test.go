package quota_test

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	core "github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
)

type staticQuotas map[string]core.Quota

func (s staticQuotas) Quotas() map[string]core.Quota { return s }

func gpus(n int64) core.Resources { return core.Resources{api.ResourceGPU: n} }

// gpuPod is pod name of namespace default asking for n whole GPUs, bound
// to node (empty: pending).
func gpuPod(name string, n int64, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name), Annotations: map[string]string{}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "main", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(n, resource.DecimalSI)}}}}},
	}
}

// gpuNode is a node with 8 allocatable GPUs.
func gpuNode(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{api.ResourceGPU: *resource.NewQuantity(8, resource.DecimalSI)}}}
}

type podOpt func(*corev1.Pod)

func inGang(name string, minMember int) podOpt {
	return func(p *corev1.Pod) {
		p.Annotations[api.AnnotationGang] = name
		p.Annotations[api.AnnotationGangMinMember] = fmt.Sprint(minMember)
	}
}
