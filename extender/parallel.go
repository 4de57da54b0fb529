package extender

import (
	"runtime"
	"sync"
)

// parallelMin is the number of nodes below which a verb runs serially.
const parallelMin = 256

// parallelFor calls fn(i) for i in [0, n), in GOMAXPROCS chunks when n is
// large. fn must only write to index i of shared slices.
func parallelFor(n int, fn func(i int)) {
	workers := runtime.GOMAXPROCS(0)
	if n < parallelMin || workers < 2 {
		for i := 0; i < n; i++ {
			fn(i)
		}
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := lo; i < hi; i++ {
				fn(i)
			}
		}()
	}
	wg.Wait()
}
