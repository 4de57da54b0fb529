// Package kubeclient builds API server client configurations the way every
// Kubernetes component does: client-go's clientcmd for a kubeconfig file
// (client certificates, tokens, exec and auth-provider plugins, relative
// paths resolved against the file) and the in-cluster configuration in a pod.
package kubeclient

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// ErrNotInCluster: no kubeconfig was given and the process is not in a pod.
var ErrNotInCluster = errors.New("no --kubeconfig given and not running in a pod")

// FromKubeconfig loads the current context of a kubeconfig file.
func FromKubeconfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

// Config returns the kubeconfig file's configuration when path is set, else
// the in-cluster configuration, else ErrNotInCluster.
func Config(path string) (*rest.Config, error) {
	if path != "" {
		return FromKubeconfig(path)
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") == "" {
		return nil, ErrNotInCluster
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster configuration: %w", err)
	}
	return cfg, nil
}
