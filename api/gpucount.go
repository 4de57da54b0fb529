package api

import "fmt"

// AnnotationGPUCount, set on a pod, asks that each of its shared containers'
// slices (tessera.dev/gpu-memory, tessera.dev/gpu-core) be split evenly over
// that many distinct GPUs of one node: "2" with 16 memory units and 40 cores
// gives the container 8 units and 20 % on each of two GPUs. Absent means 1.
// It is a tenant's request: GetGPUCount parses it strictly (see
// ParseGPUCount), and package gpureq decides what it means (the split must
// be even, the pod must ask for a slice).
const AnnotationGPUCount = Domain + "/gpu-count"

// MaxGPUCount bounds AnnotationGPUCount: no node has more GPUs (the
// allocator's MaxGPUsPerNode is larger, for whole GPUs; a multi-GPU slice's
// GPUs share one MPS daemon, and no platform has more than 16 NVLinked
// GPUs).
const MaxGPUCount = 16

// ParseGPUCount parses an AnnotationGPUCount value: a decimal integer of
// 1..MaxGPUCount written plainly (ParseDecimal: "2", not " 2", "+2", "02",
// "2.0" or "2e0"). The error names the annotation.
func ParseGPUCount(value string) (int, error) {
	n, err := ParseDecimal(value, 1, MaxGPUCount)
	if err != nil {
		return 0, fmt.Errorf("annotation %s: %q is not a GPU count: %w", AnnotationGPUCount, value, err)
	}
	return int(n), nil
}

// GetGPUCount returns a pod's AnnotationGPUCount: 1 and set false when the
// annotation is absent, the count and set true when it parses, and an error
// (set true) when it is present but not a valid count.
func GetGPUCount(annotations map[string]string) (n int, set bool, err error) {
	v, ok := annotations[AnnotationGPUCount]
	if !ok {
		return 1, false, nil
	}
	n, err = ParseGPUCount(v)
	if err != nil {
		return 0, true, err
	}
	return n, true, nil
}
