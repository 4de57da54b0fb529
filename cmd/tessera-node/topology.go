package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/topology"
)

func runTopology(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("topology", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nvmlSpec := fs.String("nvml", gpu.SpecReal, `GPU backend: "real" (libnvidia-ml.so.1), "mock:NAME" (a built-in mock machine) or "mock:PATH" (a mock machine file)`)
	sysfsRoot := fs.String("sysfs-root", "", "sysfs root to read NUMA facts from (default /sys, or the mock machine's own for a mock backend)")
	output := fs.String("output", "json", `output format: "json" (the model) or "text" (a table per GPU, with its MIG instances)`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("topology: unexpected arguments %q", fs.Args())
	}
	if *output != "json" && *output != "text" {
		return fmt.Errorf("topology: --output=%q: want json or text", *output)
	}
	backend, err := gpu.Open(*nvmlSpec)
	if err != nil {
		return err
	}
	if err := backend.Init(); err != nil {
		return fmt.Errorf("no GPU backend: %w", err)
	}
	defer backend.Shutdown() //nolint:errcheck // nothing to do about it on exit

	root := *sysfsRoot
	if root == "" {
		root = topology.DefaultSysfsRoot
		if backend.Mock != nil {
			dir, err := os.MkdirTemp("", "tessera-mock-sysfs-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			if err := backend.Mock.WriteSysfs(dir); err != nil {
				return err
			}
			root = dir
		}
	}
	t, err := topology.Build(backend, topology.Sysfs{Root: root})
	if err != nil {
		return err
	}
	if *output == "text" {
		return writeTopologyText(stdout, t)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(t)
}

// writeTopologyText prints the model for people: a row per GPU, its MIG
// instances below it, the lost GPUs, the NVLink cliques and NUMA nodes.
func writeTopologyText(out io.Writer, t *topology.Topology) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "GPU\tUUID\tMODEL\tMEMORY\tNUMA\tPCI\tNVLINKS\tMIG")
	for _, g := range t.GPUs {
		links := strconv.Itoa(g.NVLinks)
		if g.NVSwitch {
			links += " (nvswitch)"
		}
		mig := "off"
		if g.MIG != nil {
			mig = fmt.Sprintf("on, %d instances", len(g.MIG.Instances))
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d MiB\t%d\t%s\t%s\t%s\n", g.Index, g.UUID, g.Model, g.MemoryMiB, g.NUMANode, g.PCIBusID, links, mig)
		if g.MIG == nil {
			continue
		}
		for _, in := range g.MIG.Instances {
			fmt.Fprintf(w, "  mig\t%s\tMIG %s\t%d MiB\t\t\t\tslices %d-%d\n", in.UUID, in.Profile, in.MemoryMiB, in.Start, in.Start+in.Size-1)
		}
	}
	for _, l := range t.LostGPUs {
		fmt.Fprintf(w, "%d\tlost: %s\t\t\t\t\t\t\n", l.Index, l.Error)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	var cliques []string
	for _, c := range t.NVLinkCliques {
		cliques = append(cliques, fmt.Sprint(c))
	}
	fmt.Fprintf(out, "\nNVLink cliques: %s\n", strings.Join(cliques, " "))
	for _, n := range t.NUMANodes {
		fmt.Fprintf(out, "NUMA node %d: CPUs %s\n", n.ID, n.CPUs)
	}
	return nil
}
