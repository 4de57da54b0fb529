package nodesim

import (
	"context"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

// The demo's table is internal/gpustatus's, shared with `kubectl tessera
// status` and the extender's /status page.
type (
	// NodeOccupancy is one node's GPUs.
	NodeOccupancy = gpustatus.Node
	// GPUOccupancy is what the pods bound to a node use of one GPU.
	GPUOccupancy = gpustatus.GPU
	// PodCounts counts pods by phase; Pending are listed with their reason.
	PodCounts = gpustatus.PodCounts
)

// Occupancy reads every node's inventory and every unfinished bound pod's
// assignment (as the pods carry them: the demo reads with the admin's
// kubeconfig and does not check seals).
func Occupancy(ctx context.Context, client kubernetes.Interface) ([]*NodeOccupancy, PodCounts, error) {
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, PodCounts{}, err
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, PodCounts{}, err
	}
	c := gpustatus.FromObjects(nodes.Items, pods.Items, LabelProfile)
	return c.Nodes, c.Pods, nil
}

// RenderOccupancy writes a per-node, per-GPU table.
func RenderOccupancy(w io.Writer, nodes []*NodeOccupancy, counts PodCounts) {
	_ = gpustatus.Render(w, &gpustatus.Cluster{Nodes: nodes, Pods: counts})
}
