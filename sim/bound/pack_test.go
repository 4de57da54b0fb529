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
		{"nothing", 4, nil, 0},
		{"no GPUs", 0, slicesOf(500, 2), 0},
		{"whole GPUs, fewer than the GPUs", 8, wholeOf(2, 3), 6000},
		{"whole GPUs, more than the GPUs", 8, wholeOf(4, 3), 8000},
		{"CPU-only pods add nothing", 2, []allocator.Request{{CPUMilli: 4000}}, 0},
		// Two slices over half a GPU never share one.
		{"600s on 2 GPUs", 2, slicesOf(600, 3), 1200},
		{"500s pair up", 2, slicesOf(500, 4), 2000},
		{"400s: two per GPU", 2, slicesOf(400, 5), 1600},
		// Every 810 takes a GPU; only two 190s exist to close the gaps.
		{"810s and few 190s", 10, concat(slicesOf(810, 10), slicesOf(190, 2)), 10*810 + 2*190},
		// A GPU is better spent whole than on a lone 810.
		{"whole beats a lone 810", 3, concat(wholeOf(1, 2), slicesOf(810, 2)), 2000 + 810},
		// 700+300 twice and 300+300+400 fill three GPUs exactly.
		{"exact fillings", 3, concat(slicesOf(700, 2), slicesOf(300, 4), slicesOf(400, 1)), 3000},
		{"a slice of memory alone counts nothing", 1, []allocator.Request{{GPUMemMiB: 1024}, {GPUMilli: 300}}, 300},
		// Three 340s do not fit one GPU (1020): two per GPU.
		{"340s", 3, slicesOf(340, 9), 6 * 340},
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
