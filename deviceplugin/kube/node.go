package kube

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/api"
)

// DefaultNodeCheckPeriod is how often WatchNode reads the agent's Node by
// default.
const DefaultNodeCheckPeriod = 15 * time.Second

// CheckNode reads the client's Node and writes again every annotation this
// client published (the GPU inventory, the NUMA topology) that the Node
// lacks or holds with another value, and the SharedIsolation condition when
// the Node lacks it or says otherwise. The publishers write only what
// changed since their last write, so without this a Node deleted and
// created again (as a kubelet re-registration does) would stay without
// them until the agent's state changed or it restarted. A Node that does
// not exist (yet) is left alone: the next check writes once it does.
func (c *Client) CheckNode(ctx context.Context) error {
	// resourceVersion 0: from the API server's cache, not etcd; a read a
	// little behind at worst writes the same value again.
	node, err := c.cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{ResourceVersion: "0"})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading node %s: %w", c.node, err)
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	published := maps.Clone(c.published)
	var cond *sharedIsolation
	if c.condition != nil {
		cond = &sharedIsolation{connected: c.condition.connected, message: c.condition.message}
	}
	c.mu.Unlock()

	logger := klog.FromContext(ctx)
	missing := map[string]string{}
	for key, value := range published {
		if got, ok := node.Annotations[key]; !ok || got != value {
			missing[key] = value
		}
	}
	if len(missing) > 0 {
		if err := c.patchAnnotations(ctx, missing); err != nil {
			return fmt.Errorf("publishing %v again on node %s: %w", slices.Sorted(maps.Keys(missing)), c.node, err)
		}
		logger.Info("Published the node's annotations again: the Node lacked them or held other values (re-created?)", "node", klog.KObj(node), "uid", node.UID, "annotations", slices.Sorted(maps.Keys(missing)))
	}
	if cond != nil && !hasSharedIsolation(node, cond.connected) {
		if err := c.patchSharedIsolation(ctx, cond.connected, cond.message); err != nil {
			return err
		}
		logger.Info("Set the node's condition again: the Node lacked it or said otherwise (re-created?)", "node", klog.KObj(node), "uid", node.UID, "condition", api.ConditionSharedGPUIsolation)
	}
	return nil
}

// hasSharedIsolation says whether node's SharedIsolation condition is there
// with the status connected means.
func hasSharedIsolation(node *corev1.Node, connected bool) bool {
	want := corev1.ConditionFalse
	if connected {
		want = corev1.ConditionTrue
	}
	for _, c := range node.Status.Conditions {
		if c.Type == api.ConditionSharedGPUIsolation {
			return c.Status == want
		}
	}
	return false
}

// WatchNode calls CheckNode every period until ctx ends; errors are logged.
// (A periodic read, not a watch: the agent may get and patch its Node, not
// list or watch Nodes.)
func (c *Client) WatchNode(ctx context.Context, period time.Duration) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := c.CheckNode(ctx); err != nil && ctx.Err() == nil {
			logger.Error(err, "Checking the node's annotations")
		}
	}
}
