package realnode

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// writeContainerdConfig writes containerd's version-3 configuration: its own
// root, state and sockets, NRI on (own socket, no plugin directory: the node
// agent connects as an external plugin, as in the DaemonSet), CDI on with
// the node's own spec directory, runc from runcBinary, CNI from cniBinDir,
// the local sandbox image, and restrict_oom_score_adj (root on these
// machines lacks CAP_SYS_RESOURCE: runc cannot set the negative
// oom_score_adj containerd asks for sandboxes and Guaranteed pods).
func (n *Node) writeContainerdConfig() error {
	q := strconv.Quote
	cfg := fmt.Sprintf(`version = 3
root = %s
state = %s

[grpc]
  address = %s

[ttrpc]
  address = %s

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = %s
  plugin_path = %s
  plugin_config_path = %s

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = %s

[plugins."io.containerd.cri.v1.runtime"]
  enable_cdi = true
  cdi_spec_dirs = [%s]
  restrict_oom_score_adj = true

[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = %s
  SystemdCgroup = false

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = [%s]
  conf_dir = %s
`,
		q(n.path("containerd", "root")), q(n.path("containerd", "state")),
		q(n.ContainerdSocket()), q(n.ContainerdSocket()+".ttrpc"),
		q(n.NRISocket()), q(n.path("nri", "plugins")), q(n.path("nri", "conf")),
		q(SandboxImage),
		q(n.CDIDir()),
		q(n.cfg.Bins.Runc),
		q(n.cfg.Bins.CNIBinDir), q(n.path("cni")),
	)
	return os.WriteFile(n.path("containerd.toml"), []byte(cfg), 0o644)
}

// writeCNIConfig writes a bridge network with host-local addresses from
// the node's pod CIDR.
func (n *Node) writeCNIConfig() error {
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "tessera-test",
		"plugins": []any{
			map[string]any{
				"type":      "bridge",
				"bridge":    n.cfg.Bridge,
				"isGateway": true,
				"ipMasq":    false,
				"ipam": map[string]any{
					"type":    "host-local",
					"dataDir": n.path("cni-ipam"),
					"ranges":  [][]map[string]string{{{"subnet": n.cfg.PodCIDR}}},
				},
			},
			map[string]any{"type": "loopback"},
		},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(n.path("cni", "10-tessera.conflist"), b, 0o644)
}

// KubeletConfigPath is the kubelet's configuration file, which the node
// agent reads as in the DaemonSet (--kubelet-config).
func (n *Node) KubeletConfigPath() string { return n.path("kubelet-config.yaml") }

// writeKubeletConfig writes the kubelet's configuration: cgroupfs on this
// machine's cgroup v1, its own ports (serving the API server's log and
// exec requests on loopback without authentication: a test node), the
// static CPU manager with CPU 0 reserved, evictions only when the machine
// is nearly full, and statuses reported every second.
func (n *Node) writeKubeletConfig() error {
	cfg := map[string]any{
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"kind":                        "KubeletConfiguration",
		"cgroupDriver":                "cgroupfs",
		"failCgroupV1":                false,
		"failSwapOn":                  false,
		"containerRuntimeEndpoint":    "unix://" + n.ContainerdSocket(),
		"imageServiceEndpoint":        "unix://" + n.ContainerdSocket(),
		"address":                     n.nodeIP,
		"port":                        n.cfg.KubeletPort,
		"readOnlyPort":                0,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 n.cfg.KubeletHealthzPort,
		"podLogsDir":                  n.path("pod-logs"),
		"authentication":              map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":               map[string]any{"mode": "AlwaysAllow"},
		"cpuManagerPolicy":            "static",
		"reservedSystemCPUs":          "0",
		"topologyManagerPolicy":       "none",
		"evictionHard":                map[string]string{"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"nodeStatusUpdateFrequency":   "1s",
		"nodeStatusReportFrequency":   "10s",
		"syncFrequency":               "5s",
		"fileCheckFrequency":          "5s",
		"serializeImagePulls":         false,
		"maxPods":                     30,
		"staticPodPath":               "",
		"resolvConf":                  "/etc/resolv.conf",
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	return os.WriteFile(n.KubeletConfigPath(), b, 0o644)
}

// CDISpecPath is where WriteCDISpec writes the node's CDI spec.
func (n *Node) CDISpecPath() string { return filepath.Join(n.CDIDir(), "nvidia.yaml") }

// WriteCDISpec writes the CDI spec that the NVIDIA Container Toolkit
// (`nvidia-ctk cdi generate`) would write for the node's mock GPUs: kind
// nvidia.com/gpu, a device per GPU named by index and by UUID, each with
// its /dev/nvidiaN node, and the driver's common nodes for every device.
// The nodes carry their type and numbers, so runc creates them in the
// container (the host has no NVIDIA driver).
func (n *Node) WriteCDISpec() error {
	type node struct {
		Path  string `json:"path"`
		Type  string `json:"type"`
		Major int    `json:"major"`
		Minor int    `json:"minor"`
	}
	type edits struct {
		DeviceNodes []node   `json:"deviceNodes,omitempty"`
		Env         []string `json:"env,omitempty"`
	}
	type device struct {
		Name           string `json:"name"`
		ContainerEdits edits  `json:"containerEdits"`
	}
	var devs []device
	for i, uuid := range n.uuids {
		e := edits{DeviceNodes: []node{{Path: "/dev/nvidia" + strconv.Itoa(i), Type: "c", Major: NVIDIAMajor, Minor: i}}}
		devs = append(devs, device{Name: strconv.Itoa(i), ContainerEdits: e}, device{Name: uuid, ContainerEdits: e})
	}
	spec := map[string]any{
		"cdiVersion": "0.6.0",
		"kind":       "nvidia.com/gpu",
		"devices":    devs,
		"containerEdits": edits{
			DeviceNodes: []node{
				{Path: "/dev/nvidiactl", Type: "c", Major: NVIDIAMajor, Minor: 255},
				{Path: "/dev/nvidia-uvm", Type: "c", Major: UVMMajor, Minor: 0},
			},
			Env: []string{"TESSERA_TEST_CDI=nvidia.com/gpu"},
		},
	}
	b, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.CDIDir(), 0o755); err != nil {
		return err
	}
	return os.WriteFile(n.CDISpecPath(), b, 0o644)
}

// Device numbers the fake /proc/devices of the node's mount namespace
// lists, as the NVIDIA driver would register them.
const (
	NVIDIAMajor = 195
	UVMMajor    = 234
)

// fakeProcDevices is /proc/devices with the NVIDIA majors added, for the
// node agent (it reads the UVM major there).
func fakeProcDevices() (string, error) {
	b, err := os.ReadFile("/proc/devices")
	if err != nil {
		return "", err
	}
	s := string(b)
	if !strings.Contains(s, "nvidia-uvm") {
		s = strings.Replace(s, "Character devices:\n", fmt.Sprintf("Character devices:\n%d nvidia\n%d nvidia-uvm\n", NVIDIAMajor, UVMMajor), 1)
	}
	return s, nil
}
