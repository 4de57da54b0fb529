package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

// status prints the per-node, per-GPU table. It reads the nodes' GPU
// inventories and the pods' assignments from the API server, keeping only
// assignments Tessera sealed (the seal key's Secret must be readable);
// without the key it asks the extender, whose ledger holds only sealed
// decisions; without either it fails and says what to check.
func (e *env) status(ctx context.Context, w io.Writer) error {
	c, source, err := e.occupancy(ctx)
	if err != nil {
		return err
	}
	if err := gpustatus.Render(w, c); err != nil {
		return err
	}
	if err := e.reservations(ctx, w); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "\nsource: %s\n", source)
	return err
}

func (e *env) occupancy(ctx context.Context) (*gpustatus.Cluster, string, error) {
	nodes, err := e.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, "", e.apiErr("nodes", err)
	}
	trust, keyErr := e.trust(ctx)
	if keyErr == nil {
		pods, err := e.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, "", e.apiErr("pods", err)
		}
		for i := range pods.Items {
			trust.Pod(&pods.Items[i]) // what Tessera did not seal is not shown as its decision
		}
		return gpustatus.FromObjects(nodes.Items, pods.Items, ""), "the API server (assignments checked against Tessera's seal)", nil
	}
	if e.ext == nil {
		return nil, "", fmt.Errorf("%w; without it an assignment written by a pod's owner cannot be told from Tessera's: get read access to that Secret, or let the plugin ask the extender (drop --extender=none)", keyErr)
	}
	var c gpustatus.Cluster
	if err := e.ext.Get(ctx, extender.StatusOccupancyPath, &c); err != nil {
		return nil, "", fmt.Errorf("%w; and asking the extender instead: %w", keyErr, err)
	}
	fmt.Fprintf(e.stderr, "note: %v; showing tessera-extender's ledger instead\n", keyErr)
	return &c, "tessera-extender's ledger at " + e.ext.Where(), nil
}

// reservations prints what the extender's planner records of reservations
// (ConfigMap tessera-reservations in the extender's namespace): the
// workloads holding nodes and since when, and those whose reservation ran
// out and may not reserve again yet. It prints nothing when there are
// none, and a note on stderr when the ConfigMap cannot be read.
func (e *env) reservations(ctx context.Context, w io.Writer) error {
	where := e.sealKeyNamespace + "/" + api.ReservationsConfigMapName
	cm, err := e.client.CoreV1().ConfigMaps(e.sealKeyNamespace).Get(ctx, api.ReservationsConfigMapName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "note: reservations not shown: reading ConfigMap %s: %v\n", where, err)
		return nil
	}
	recs, err := api.ParseReservations(cm.Data[api.ReservationsDataKey])
	if err != nil {
		fmt.Fprintf(e.stderr, "note: reservations not shown: ConfigMap %s: %v\n", where, err)
		return nil
	}
	lines := gpustatus.ReservationLines(recs, e.now())
	if len(lines) == 0 {
		return nil
	}
	_, err = fmt.Fprintf(w, "\nreservations (ConfigMap %s):\n  %s\n", where, strings.Join(lines, "\n  "))
	return err
}
