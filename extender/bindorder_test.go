package extender

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestBindOrderWaitsForEarlierSlicesOfItsNode(t *testing.T) {
	var o bindOrder
	a, b := o.slice("n"), o.slice("n")
	other := o.slice("m")
	mixed := o.slice("n") // a pod with a slice and whole GPUs waits for the others, not itself

	waited := make(chan error, 1)
	go func() { waited <- o.waitSlices(context.Background(), "n", mixed) }()
	a.end()
	select {
	case err := <-waited:
		t.Fatalf("waitSlices returned (%v) while slice b of its node is in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.end()
	b.end() // a second end does nothing
	if err := <-waited; err != nil {
		t.Fatalf("waitSlices = %v", err)
	}

	// With only itself in flight on its node, nothing to wait for.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := o.waitSlices(ctx, "n", mixed); err != nil {
		t.Errorf("waitSlices with only itself in flight = %v", err)
	}
	if err := o.waitSlices(ctx, "m", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("waitSlices on a node with a slice in flight, ctx canceled = %v", err)
	}
	other.end()
	mixed.end()
	if len(o.slices) != 0 {
		t.Errorf("slices left registered: %v", o.slices)
	}
}
