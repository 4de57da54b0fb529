package extender

import (
	"fmt"
	"math/rand"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
)

// PolicyBinpack is the extender's default policy: allocator's tessera
// policy (fragmentation-aware packing).
const PolicyBinpack = "binpack"

// PolicyNames lists the names NewPolicy accepts.
func PolicyNames() []string {
	return append([]string{PolicyBinpack}, allocator.PolicyNames()...)
}

// DefaultWorkload is the target workload the fragmentation-aware policies
// (binpack/tessera, fgd) score against when none is configured: typical
// shared slices and 1, 2, 4 and 8-GPU pods, with a few CPU-only pods.
func DefaultWorkload() allocator.Workload {
	return allocator.Workload{Shapes: []allocator.Shape{
		{Request: allocator.Request{CPUMilli: 2000, GPUMilli: 250}, Freq: 0.2},
		{Request: allocator.Request{CPUMilli: 4000, GPUMilli: 500}, Freq: 0.2},
		{Request: allocator.Request{CPUMilli: 8000, GPUs: 1}, Freq: 0.25},
		{Request: allocator.Request{CPUMilli: 16000, GPUs: 2}, Freq: 0.1},
		{Request: allocator.Request{CPUMilli: 32000, GPUs: 4}, Freq: 0.1},
		{Request: allocator.Request{CPUMilli: 64000, GPUs: 8}, Freq: 0.1},
		{Request: allocator.Request{CPUMilli: 2000}, Freq: 0.05},
	}}
}

// NewPolicy builds the named policy: "binpack" (the default, allocator's
// fragmentation-aware tessera policy) or any allocator policy name.
// Fragmentation-aware policies score against w; random draws from seed.
func NewPolicy(name string, w allocator.Workload, seed int64) (allocator.Policy, error) {
	n := strings.ToLower(strings.TrimSpace(name))
	if n == PolicyBinpack || n == "" {
		n = allocator.PolicyTessera
	}
	var opts []allocator.Option
	if allocator.NeedsWorkload(n) {
		opts = append(opts, allocator.WithWorkload(w))
	}
	if n == allocator.PolicyRandom {
		// The random policy is not safe for concurrent use: serialise it.
		opts = append(opts, allocator.WithRand(rand.New(rand.NewSource(seed))))
		p, err := allocator.NewPolicy(n, opts...)
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", name, err)
		}
		return &lockedPolicy{p: p}, nil
	}
	p, err := allocator.NewPolicy(n, opts...)
	if err != nil {
		return nil, fmt.Errorf("policy %q: %w", name, err)
	}
	return p, nil
}
