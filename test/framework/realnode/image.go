package realnode

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Image names the node's containerd holds: there is no registry, so both
// are one local image (a layer holding busybox-static) imported from a
// docker-archive. Pods run TestImage with imagePullPolicy Never.
const (
	TestImage    = "tessera.test/busybox:1"
	SandboxImage = "registry.k8s.io/pause:3.10"
)

// sandboxCommand is the image's default command: what the pod sandbox
// runs. It sleeps until SIGTERM.
var sandboxCommand = []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep 2147483647 & wait"}

// writeImageArchive writes a docker-archive (the `docker save` layout that
// `ctr images import` reads) of one image tagged with tags: one layer with
// busybox at /bin/busybox, a symlink per applet, and the directories a
// container runtime mounts over.
func writeImageArchive(path, busybox string, tags []string) error {
	layer, err := busyboxLayer(busybox)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(layer)
	diffID := "sha256:" + hex.EncodeToString(sum[:])
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC().Format(time.RFC3339),
		"config": map[string]any{
			"Cmd": sandboxCommand,
			"Env": []string{"PATH=/bin"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return err
	}
	csum := sha256.Sum256(config)
	configName := hex.EncodeToString(csum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": tags,
		"Layers":   []string{"layer.tar"},
	}})
	if err != nil {
		return err
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, f := range []struct {
		name string
		data []byte
	}{{configName, config}, {"layer.tar", layer}, {"manifest.json", manifest}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// busyboxLayer is the image's one layer.
func busyboxLayer(busybox string) ([]byte, error) {
	bin, err := os.ReadFile(busybox)
	if err != nil {
		return nil, fmt.Errorf("busybox (Debian's busybox-static): %w", err)
	}
	list, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for _, d := range []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/", "var/", "run/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: "bin/busybox", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(bin); err != nil {
		return nil, err
	}
	for _, a := range strings.Fields(string(list)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := tw.WriteHeader(&tar.Header{Name: "bin/" + a, Linkname: "busybox", Mode: 0o777, Typeflag: tar.TypeSymlink}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
