// Package deps pins, in go.mod, the dependency set of the components that are
// planned but not all written yet (device plugin, NRI plugin, isolation,
// extender), so that their versions are chosen once, together, and tested to
// build together. Delete an import here once a real package imports it.
package deps

import (
	_ "github.com/NVIDIA/go-gpuallocator/gpuallocator"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"
	_ "github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	_ "github.com/containerd/nri/pkg/stub"
	_ "github.com/fsnotify/fsnotify"
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/opencontainers/cgroups"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "google.golang.org/grpc"
	_ "k8s.io/client-go/informers"
	_ "k8s.io/client-go/kubernetes"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kube-scheduler/extender/v1"
	_ "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	_ "k8s.io/kubelet/pkg/apis/podresources/v1"
	_ "sigs.k8s.io/yaml"
)
