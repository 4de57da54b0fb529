package extender

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	extenderv1 "k8s.io/kube-scheduler/extender/v1"

	"github.com/tessera-gpu/tessera/extender/internal/testbuild"
	"github.com/tessera-gpu/tessera/extender/verbs"
)

// benchCluster builds n nodes of 8 A100s, about half used by shared and
// whole-GPU pods, and returns the cache and node names.
func benchCluster(b *testing.B, n int) (*Cache, []string) {
	b.Helper()
	rng := rand.New(rand.NewSource(int64(n)))
	c := NewCache()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%05d", i)
		c.SetNode(testbuild.Node(names[i]).GPUs(8, "NVIDIA A100-SXM4-40GB", 40960).Obj())
		for g := 0; g < 8; g++ {
			switch rng.Intn(4) {
			case 0: // whole
				c.SetPod(testbuild.Pod(fmt.Sprintf("w-%d-%d", i, g)).Whole(1).Node(names[i]).Holding(g).Obj())
			case 1: // shared
				c.SetPod(testbuild.Pod(fmt.Sprintf("s-%d-%d", i, g)).Shared(10, 30).Node(names[i]).On(g, 10240, 30).Obj())
			}
		}
	}
	return c, names
}

func BenchmarkFilterPrioritize(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		c, names := benchCluster(b, n)
		// shortlist 0: filter passes every fitting node to prioritize;
		// 100: the deployed default (--filter-shortlist).
		for _, k := range []int{0, 100} {
			s := NewServer(c, testPolicy(b, PolicyBinpack), newFakePods(), nil, nil)
			s.SetShortlist(k)
			for _, shape := range []struct {
				name string
				pod  *corev1.Pod
			}{
				{"shared", testbuild.Pod("p").Shared(8, 25).CPU("2").Obj()},
				{"whole2", testbuild.Pod("p").Whole(2).CPU("8").Obj()},
			} {
				args := &extenderv1.ExtenderArgs{Pod: shape.pod, NodeNames: &names}
				// cold: every pod has a new shape (its CPU request), so no
				// node's memoised score applies; warm: the same shape again
				// (replicas), only nodes changed since are evaluated.
				for _, mode := range []string{"cold", "warm"} {
					b.Run(fmt.Sprintf("nodes=%d/shortlist=%d/%s/%s", n, k, shape.name, mode), func(b *testing.B) {
						ctx := context.Background()
						pod := shape.pod.DeepCopy()
						cpu := int64(1000)
						start := processCPU(b)
						for b.Loop() {
							if mode == "cold" {
								cpu++
								pod.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(cpu, resource.DecimalSI)
							}
							res := s.FilterArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: &names})
							if res.Error != "" {
								b.Fatal(res.Error)
							}
							if _, err := s.PrioritizeArgs(ctx, &extenderv1.ExtenderArgs{Pod: pod, NodeNames: res.NodeNames}, false); err != nil {
								b.Fatal(err)
							}
						}
						// CPU time (all threads) per pod: on a shared, loaded
						// machine wall time mostly measures the neighbours.
						b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
					})
				}
				// http: the server side of both calls, JSON included (the
				// scheduler's own encoding and decoding not counted).
				b.Run(fmt.Sprintf("nodes=%d/shortlist=%d/%s/http", n, k, shape.name), func(b *testing.B) {
					mux := http.NewServeMux()
					(&verbs.Handler{Core: s}).Register(mux)
					fbody, _ := json.Marshal(args)
					res := s.FilterArgs(context.Background(), args)
					pbody, _ := json.Marshal(&extenderv1.ExtenderArgs{Pod: shape.pod, NodeNames: res.NodeNames})
					start := processCPU(b)
					for b.Loop() {
						for _, call := range []struct {
							path string
							body []byte
						}{{verbs.PathFilter, fbody}, {verbs.PathPrioritize, pbody}} {
							rec := httptest.NewRecorder()
							mux.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, call.path, bytes.NewReader(call.body)))
							if rec.Code != http.StatusOK {
								b.Fatalf("%s: %d %s", call.path, rec.Code, rec.Body)
							}
						}
					}
					b.ReportMetric(float64(processCPU(b)-start)/float64(b.N), "cpu-ns/op")
				})
			}
		}
	}
}

// processCPU returns the process's user+system CPU time in ns.
func processCPU(b *testing.B) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
