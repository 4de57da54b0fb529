// Package jobs replays deep-learning training job traces (the Microsoft ITP
// traces: arrivals, durations, GPU counts up to 64) in simulated time on a
// cluster of 8-GPU nodes, to compare gang scheduling strategies. Jobs of more
// than one node's GPUs are gangs of whole-node pods: all start together or,
// without gang scheduling, they hold GPUs while waiting for each other.
//
// Placement decisions come from allocator, allocator/gang and
// allocator/quota, the code the scheduler extender runs.
package jobs

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// Job is one training job of a trace.
type Job struct {
	ID string
	// Submit and Duration are in seconds.
	Submit   int64
	Duration int64
	GPUs     int
	// Team is the job's namespace for quota; empty means one is derived
	// from the ID (the traces carry none).
	Team string
	// Estimate is the run time the job declares, in seconds (the optional
	// column expected_runtime; 0: none), used under EstimateTrace.
	Estimate int64
	// MinGPUs makes a job of several pods an elastic gang (elastic.go):
	// it starts once pods holding this many GPUs run, and the others join
	// one at a time (the optional column min_gpu; 0: all of them).
	MinGPUs int
}

// ReadTrace reads a trace CSV with the columns job_id, submission_time,
// duration, num_gpu and optionally expected_runtime and min_gpu (any
// order, header required). Jobs come back sorted by
// submission time, then by order in the file.
func ReadTrace(path string) ([]Job, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	defer f.Close()
	return parseTrace(f, path)
}

func parseTrace(r io.Reader, name string) ([]Job, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading the header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	for _, want := range []string{"job_id", "submission_time", "duration", "num_gpu"} {
		if _, ok := col[want]; !ok {
			return nil, fmt.Errorf("%s: the header lacks column %q (has %s)", name, want, strings.Join(header, ","))
		}
	}
	var jobs []Job
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, line, err)
		}
		if len(rec) != len(header) {
			return nil, fmt.Errorf("%s:%d: %d fields, the header has %d", name, line, len(rec), len(header))
		}
		num := func(column string) (int64, error) {
			v, err := strconv.ParseInt(strings.TrimSpace(rec[col[column]]), 10, 64)
			if err != nil || v < 0 {
				return 0, fmt.Errorf("%s:%d: column %s: %q is not a non-negative integer", name, line, column, rec[col[column]])
			}
			return v, nil
		}
		j := Job{ID: rec[col["job_id"]]}
		if j.Submit, err = num("submission_time"); err != nil {
			return nil, err
		}
		if j.Duration, err = num("duration"); err != nil {
			return nil, err
		}
		gpus, err := num("num_gpu")
		if err != nil {
			return nil, err
		}
		if gpus == 0 {
			return nil, fmt.Errorf("%s:%d: column num_gpu: a training job needs at least one GPU", name, line)
		}
		j.GPUs = int(gpus)
		if _, ok := col["expected_runtime"]; ok {
			if j.Estimate, err = num("expected_runtime"); err != nil {
				return nil, err
			}
		}
		if _, ok := col["min_gpu"]; ok {
			v, err := num("min_gpu")
			if err != nil {
				return nil, err
			}
			if v > gpus {
				return nil, fmt.Errorf("%s:%d: column min_gpu: %d is more than the job's %d GPUs", name, line, v, gpus)
			}
			j.MinGPUs = int(v)
		}
		jobs = append(jobs, j)
	}
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Submit < jobs[b].Submit })
	return jobs, nil
}

// pods splits a job into pods on nodes of gpusPerNode GPUs: one pod when it
// fits a node, else whole-node pods (a job that is not a multiple of a node
// is rounded up, as a scheduler would have to).
func (j Job) pods(gpusPerNode int) []int {
	if j.GPUs <= gpusPerNode {
		return []int{j.GPUs}
	}
	n := (j.GPUs + gpusPerNode - 1) / gpusPerNode
	out := make([]int, n)
	for i := range out {
		out[i] = gpusPerNode
	}
	return out
}
