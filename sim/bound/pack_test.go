package bound

import (
	"math"
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
)

func slicesOf(milli int64, n int) []allocator.Request {
	out := make([]allocator.Request, n)
	for i := range out {
		out[i] = allocator.Request{GPUMilli: milli}
	}
	return out
}

func wholeOf(gpus, n int) []allocator.Request {
	out := make([]allocator.Request, n)
	for i := range out {
		out[i] = allocator.Request{GPUs: gpus}
	}
	return out
}

func concat(parts ...[]allocator.Request) []allocator.Request {
	var out []allocator.Request
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestPack(t *testing.T) {
	for _, c := range []struct {
		name string
		gpus int
		pods []allocator.Request
		want float64
	}{
		{"whole GPUs, fewer than the GPUs", 8, wholeOf(2, 3), 6000},
		{"CPU-only pods add nothing", 2, []allocator.Request{{CPUMilli: 4000}}, 0},
		// Every 810 takes a GPU; only two 190s exist to close the gaps.
		{"810s and few 190s", 10, concat(slicesOf(810, 10), slicesOf(190, 2)), 10*810 + 2*190},
		{"a slice of memory alone counts nothing", 1, []allocator.Request{{GPUMemMiB: 1024}, {GPUMilli: 300}}, 300},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := Pack(c.gpus, c.pods)
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(got.Milli-c.want) > 1e-6 {
				t.Errorf("Pack = %v (%d patterns), want %v", got.Milli, got.Patterns, c.want)
			}
		})
	}
}

// The bound is an upper bound: never below what first fit places.
func TestPackAboveFirstFit(t *testing.T) {
	sizes := []int64{50, 100, 190, 230, 250, 320, 460, 470, 500, 590, 650, 810}
	for seed := range 20 {
		var pods []allocator.Request
		x := uint64(seed)*2654435761 + 1
		for range 60 {
			x = x*6364136223846793005 + 1442695040888963407
			pods = append(pods, allocator.Request{GPUMilli: sizes[(x>>33)%uint64(len(sizes))]})
		}
		gpus := 12
		free := make([]int64, gpus)
		for i := range free {
			free[i] = allocator.MilliPerGPU
		}
		var placed int64
		for _, p := range pods {
			for i := range free {
				if free[i] >= p.GPUMilli {
					free[i] -= p.GPUMilli
					placed += p.GPUMilli
					break
				}
			}
		}
		got, err := Pack(gpus, pods)
		if err != nil {
			t.Fatal(err)
		}
		if got.Milli+1e-6 < float64(placed) {
			t.Errorf("seed %d: bound %v below first fit's %d", seed, got.Milli, placed)
		}
		if got.Milli > float64(gpus*allocator.MilliPerGPU) {
			t.Errorf("seed %d: bound %v above the GPUs' %d", seed, got.Milli, gpus*allocator.MilliPerGPU)
		}
	}
}

func TestPackRefusesBadSlices(t *testing.T) {
	for _, r := range []allocator.Request{{GPUMilli: 1000}, {GPUMilli: 1500}} {
		if _, err := Pack(2, []allocator.Request{r}); err == nil {
			t.Errorf("Pack accepted %+v", r)
		}
	}
	if _, err := Pack(-1, nil); err == nil {
		t.Error("Pack accepted -1 GPUs")
	}
}
