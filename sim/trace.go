package sim

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tessera-gpu/tessera/allocator"
)

// NodeSpec is one row of a node list (openb_node_list_*.csv).
type NodeSpec struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	GPUs     int
	Model    string
}

// PodSpec is one row of a pod list (openb_pod_list_*.csv).
type PodSpec struct {
	Name    string
	Request allocator.Request
}

// Trace is a cluster and a workload read from the Alibaba GPU trace.
type Trace struct {
	// Workload is the pod list's name, e.g. "openb_pod_list_default".
	Workload string
	Nodes    []NodeSpec
	Pods     []PodSpec
}

// TotalGPUs is the number of GPUs of the cluster.
func (t *Trace) TotalGPUs() int {
	n := 0
	for _, s := range t.Nodes {
		n += s.GPUs
	}
	return n
}

// LoadTrace reads a node list and a pod list.
func LoadTrace(nodesPath, podsPath string) (*Trace, error) {
	nodes, err := LoadNodes(nodesPath)
	if err != nil {
		return nil, err
	}
	pods, err := LoadPods(podsPath)
	if err != nil {
		return nil, err
	}
	return &Trace{Workload: WorkloadName(podsPath), Nodes: nodes, Pods: pods}, nil
}

// WorkloadName is the base name of a pod list without extension.
func WorkloadName(podsPath string) string {
	return strings.TrimSuffix(filepath.Base(podsPath), filepath.Ext(podsPath))
}

// LoadNodes reads a node list CSV file.
func LoadNodes(path string) ([]NodeSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("node list: %w", err)
	}
	defer f.Close()
	return ReadNodes(f, path)
}

// LoadPods reads a pod list CSV file.
func LoadPods(path string) ([]PodSpec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pod list: %w", err)
	}
	defer f.Close()
	return ReadPods(f, path)
}

// table is a CSV file read with a header, giving file:line:column errors.
type table struct {
	file string
	r    *csv.Reader
	cols map[string]int
	rec  []string
	line int
}

func openTable(r io.Reader, file string, required ...string) (*table, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: empty file, want a header with columns %s", file, strings.Join(required, ","))
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	t := &table{file: file, r: cr, cols: make(map[string]int, len(header))}
	for i, h := range header {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		if _, dup := t.cols[h]; dup {
			return nil, fmt.Errorf("%s:1: duplicate column %q", file, h)
		}
		t.cols[h] = i
	}
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			return nil, fmt.Errorf("%s:1: missing column %q (header: %s)", file, c, strings.Join(header, ","))
		}
	}
	return t, nil
}

// next reads the next record; it returns false at the end of the file.
func (t *table) next() (bool, error) {
	rec, err := t.r.Read()
	if errors.Is(err, io.EOF) {
		return false, nil
	}
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return false, fmt.Errorf("%s:%d:%d: %w", t.file, pe.Line, pe.Column, pe.Err)
		}
		return false, fmt.Errorf("%s: %w", t.file, err)
	}
	t.rec = rec
	t.line, _ = t.r.FieldPos(0)
	return true, nil
}

func (t *table) has(col string) bool {
	_, ok := t.cols[col]
	return ok
}

func (t *table) str(col string) string {
	i, ok := t.cols[col]
	if !ok {
		return ""
	}
	return strings.TrimSpace(t.rec[i])
}

// errAt builds an error naming the file, line and column.
func (t *table) errAt(col string, format string, args ...any) error {
	i := t.cols[col]
	line, column := t.r.FieldPos(i)
	return fmt.Errorf("%s:%d:%d: column %q: %s", t.file, line, column, col, fmt.Sprintf(format, args...))
}

// int reads a non-negative integer column.
func (t *table) int(col string) (int64, error) {
	s := t.str(col)
	if s == "" {
		return 0, t.errAt(col, "empty value, want a non-negative integer")
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some exports write integers as floats ("12000.0").
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != float64(int64(f)) {
			return 0, t.errAt(col, "%q is not an integer", s)
		}
		v = int64(f)
	}
	if v < 0 {
		return 0, t.errAt(col, "negative value %d", v)
	}
	return v, nil
}

// ReadNodes parses a node list (columns sn, cpu_milli, memory_mib, gpu,
// model). file names the source in errors.
func ReadNodes(r io.Reader, file string) ([]NodeSpec, error) {
	t, err := openTable(r, file, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	var out []NodeSpec
	seen := make(map[string]int)
	for {
		ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		var s NodeSpec
		if s.Name = t.str("sn"); s.Name == "" {
			return nil, t.errAt("sn", "empty node name")
		}
		if prev, dup := seen[s.Name]; dup {
			return nil, t.errAt("sn", "duplicate node %q (first on line %d)", s.Name, prev)
		}
		seen[s.Name] = t.line
		if s.CPUMilli, err = t.int("cpu_milli"); err != nil {
			return nil, err
		}
		if s.MemMiB, err = t.int("memory_mib"); err != nil {
			return nil, err
		}
		g, err := t.int("gpu")
		if err != nil {
			return nil, err
		}
		if g > allocator.MaxGPUsPerNode {
			return nil, t.errAt("gpu", "%d GPUs, at most %d per node", g, allocator.MaxGPUsPerNode)
		}
		s.GPUs = int(g)
		s.Model = t.str("model")
		if s.GPUs > 0 && s.Model == "" {
			return nil, t.errAt("model", "node with %d GPUs has no GPU model", s.GPUs)
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no nodes", file)
	}
	return out, nil
}

// ReadPods parses a pod list (columns name, cpu_milli, memory_mib, num_gpu,
// gpu_milli and optionally gpu_spec). A pod with num_gpu >= 1 and
// gpu_milli 1000 asks for num_gpu whole GPUs; num_gpu 1 with gpu_milli in
// 1..999 asks for a slice of one GPU. file names the source in errors.
func ReadPods(r io.Reader, file string) ([]PodSpec, error) {
	t, err := openTable(r, file, "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	var out []PodSpec
	for {
		ok, err := t.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		var p PodSpec
		if p.Name = t.str("name"); p.Name == "" {
			return nil, t.errAt("name", "empty pod name")
		}
		if p.Request.CPUMilli, err = t.int("cpu_milli"); err != nil {
			return nil, err
		}
		if p.Request.MemMiB, err = t.int("memory_mib"); err != nil {
			return nil, err
		}
		numGPU, err := t.int("num_gpu")
		if err != nil {
			return nil, err
		}
		milli, err := t.int("gpu_milli")
		if err != nil {
			return nil, err
		}
		if numGPU > 0 {
			if milli > allocator.MilliPerGPU {
				// The artifact's converter clamps gpu_milli to 1000.
				milli = allocator.MilliPerGPU
			}
			switch {
			case numGPU > allocator.MaxGPUsPerNode:
				return nil, t.errAt("num_gpu", "%d GPUs, at most %d per node", numGPU, allocator.MaxGPUsPerNode)
			case milli == allocator.MilliPerGPU:
				p.Request.GPUs = int(numGPU)
			case milli == 0:
				return nil, t.errAt("gpu_milli", "pod asks for %d GPUs with gpu_milli 0", numGPU)
			case numGPU > 1:
				return nil, t.errAt("gpu_milli", "gpu_milli %d with num_gpu %d: a GPU share is only supported for one GPU", milli, numGPU)
			default:
				p.Request.GPUMilli = milli
			}
			if t.has("gpu_spec") {
				for _, m := range strings.Split(t.str("gpu_spec"), "|") {
					if m = strings.TrimSpace(m); m != "" {
						p.Request.Models = append(p.Request.Models, m)
					}
				}
			}
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no pods", file)
	}
	return out, nil
}
