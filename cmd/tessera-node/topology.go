package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/tessera-gpu/tessera/gpu"
	"github.com/tessera-gpu/tessera/topology"
)

func runTopology(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("topology", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nvmlSpec := fs.String("nvml", gpu.SpecReal, `GPU backend: "real" (libnvidia-ml.so.1), "mock:NAME" (a built-in mock machine) or "mock:PATH" (a mock machine file)`)
	sysfsRoot := fs.String("sysfs-root", "", "sysfs root to read NUMA facts from (default /sys, or the mock machine's own for a mock backend)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("topology: unexpected arguments %q", fs.Args())
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
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(t)
}
