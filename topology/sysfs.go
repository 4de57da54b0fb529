package topology

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"k8s.io/utils/cpuset"
)

// DefaultSysfsRoot is where the kernel mounts sysfs.
const DefaultSysfsRoot = "/sys"

// Sysfs reads the NUMA facts the model needs from a sysfs tree rooted at
// Root, so tests can point it at a fixture.
type Sysfs struct {
	Root string
}

// NUMANodeOfPCI returns the NUMA node of a PCI device (address in sysfs form,
// "0000:07:00.0"), or -1 when the platform does not report one: the
// numa_node file is missing or holds -1.
func (s Sysfs) NUMANodeOfPCI(addr string) (int, error) {
	file := filepath.Join(s.Root, "bus", "pci", "devices", addr, "numa_node")
	b, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("reading NUMA node of PCI device %s: %w", addr, err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < -1 {
		return -1, fmt.Errorf("%s: not a NUMA node number: %q", file, strings.TrimSpace(string(b)))
	}
	return n, nil
}

var nodeDir = regexp.MustCompile(`^node([0-9]+)$`)

// NUMANodes lists the NUMA nodes with their CPUs, by ID. A kernel without NUMA
// support has no node directories: the list is empty.
func (s Sysfs) NUMANodes() ([]NUMANode, error) {
	dir := filepath.Join(s.Root, "devices", "system", "node")
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing NUMA nodes: %w", err)
	}
	var nodes []NUMANode
	for _, e := range entries {
		m := nodeDir.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		id, err := strconv.Atoi(m[1])
		if err != nil {
			return nil, fmt.Errorf("%s: bad NUMA node name: %w", filepath.Join(dir, e.Name()), err)
		}
		file := filepath.Join(dir, e.Name(), "cpulist")
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading CPUs of NUMA node %d: %w", id, err)
		}
		cpus, err := cpuset.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: not a CPU list: %w", file, err)
		}
		nodes = append(nodes, NUMANode{ID: id, CPUs: cpus.String()})
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].ID < nodes[j].ID })
	return nodes, nil
}
