package nodesim

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The simulated container's environment is the kubelet's: envFrom, then
// env with $(VAR) expansion and valueFrom, so that what a tenant sets by
// any of these reaches the NRI plugin as on a node.
func TestContainerEnv(t *testing.T) {
	yes := true
	client := fake.NewSimpleClientset(
		&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "cm"}, Data: map[string]string{"NVIDIA_VISIBLE_DEVICES": "all", "K": "from-cm"}},
		&v1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "sec"}, Data: map[string][]byte{"TOKEN": []byte("s3")}},
	)
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "p", Annotations: map[string]string{"a": "b"}},
		Spec: v1.PodSpec{NodeName: "n1"}}
	c := v1.Container{Name: "c",
		Resources: v1.ResourceRequirements{Limits: v1.ResourceList{v1.ResourceMemory: resource.MustParse("1Gi")}},
		EnvFrom: []v1.EnvFromSource{
			{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}}},
			{Prefix: "S_", SecretRef: &v1.SecretEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}}},
			{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}, Optional: &yes}},
		},
		Env: []v1.EnvVar{
			{Name: "K", Value: "literal wins"},
			{Name: "E", Value: "$(S_TOKEN)-$(NOPE)"},
			{Name: "NODE", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
			{Name: "ANN", ValueFrom: &v1.EnvVarSource{FieldRef: &v1.ObjectFieldSelector{FieldPath: "metadata.annotations['a']"}}},
			{Name: "MEM", ValueFrom: &v1.EnvVarSource{ResourceFieldRef: &v1.ResourceFieldSelector{Resource: "limits.memory"}}},
			{Name: "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ValueFrom: &v1.EnvVarSource{ConfigMapKeyRef: &v1.ConfigMapKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Key: "K"}}},
			{Name: "OPT", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "nope", Optional: &yes}}},
		},
	}
	got, err := containerEnv(context.Background(), client, pod, &c)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"NVIDIA_VISIBLE_DEVICES": "all", "K": "literal wins", "S_TOKEN": "s3", "E": "s3-$(NOPE)",
		"NODE": "n1", "ANN": "b", "MEM": "1073741824", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "from-cm",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("env (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name string
		env  v1.EnvVar
		from []v1.EnvFromSource
		want string
	}{
		{name: "missing configmap", from: []v1.EnvFromSource{{ConfigMapRef: &v1.ConfigMapEnvSource{LocalObjectReference: v1.LocalObjectReference{Name: "gone"}}}}, want: `configmap "gone"`},
		{name: "missing key", env: v1.EnvVar{Name: "X", ValueFrom: &v1.EnvVarSource{SecretKeyRef: &v1.SecretKeySelector{LocalObjectReference: v1.LocalObjectReference{Name: "sec"}, Key: "nope"}}}, want: `secret "sec" has no key "nope"`},
	} {
		c := v1.Container{Name: "c", EnvFrom: tc.from}
		if tc.env.Name != "" {
			c.Env = []v1.EnvVar{tc.env}
		}
		if _, err := containerEnv(context.Background(), client, pod, &c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want one naming %s", tc.name, err, tc.want)
		}
	}
}
