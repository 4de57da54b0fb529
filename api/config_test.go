package api_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tessera-gpu/tessera/api"
)

func TestLoadNodeAgentConfigDefaults(t *testing.T) {
	c, err := api.LoadNodeAgentConfig([]byte("apiVersion: tessera.dev/v1alpha1\nkind: NodeAgentConfig\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	want := api.NewNodeAgentConfig()
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]uint64{13, 31, 43, 45, 68, 109}, c.IgnoredXIDs); diff != "" {
		t.Errorf("default ignored XIDs (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(api.Resources(), c.Resources); diff != "" {
		t.Errorf("default resources (-want +got):\n%s", diff)
	}
	if c.MemoryUnitMiB != 1024 || c.DeviceListStrategy[0] != api.DeviceListCDICRI || c.CDIKind != "nvidia.com/gpu" || c.NRI.NonGPUContainers != api.NonGPUContainersVoid {
		t.Errorf("defaults = %+v", c)
	}
}

func TestLoadNodeAgentConfigFull(t *testing.T) {
	const file = `
apiVersion: tessera.dev/v1alpha1
kind: NodeAgentConfig
resources: [tessera.dev/gpu, tessera.dev/gpu-core]
memoryUnitMiB: 512
memoryReserveMiB: 1024
ignoredXIDs: []
deviceListStrategy: [envvar, cdi-annotations]
cdiKind: example.com/gpu
cdiDeviceName: index
healthCheckInterval: 5s
xidRecoveryDelay: 1m
kubeletSyncInterval: 3s
allocationGrace: 30s
nri:
  nonGPUContainers: leave
  nonGPUExemptNamespaces: [gpu-operator, monitoring]
`
	c, err := api.LoadNodeAgentConfig([]byte(file), "test")
	if err != nil {
		t.Fatal(err)
	}
	want := &api.NodeAgentConfig{
		APIVersion:          api.Version,
		Kind:                api.KindNodeAgentConfig,
		Resources:           []corev1.ResourceName{api.ResourceGPU, api.ResourceGPUCore},
		MemoryUnitMiB:       512,
		MemoryReserveMiB:    1024,
		IgnoredXIDs:         []uint64{},
		DeviceListStrategy:  []string{api.DeviceListEnvvar, api.DeviceListCDIAnnotations},
		CDIKind:             "example.com/gpu",
		CDIDeviceName:       api.CDINameIndex,
		HealthCheckInterval: &metav1.Duration{Duration: 5 * time.Second},
		XIDRecoveryDelay:    &metav1.Duration{Duration: time.Minute},
		KubeletSyncInterval: &metav1.Duration{Duration: 3 * time.Second},
		AllocationGrace:     &metav1.Duration{Duration: 30 * time.Second},
		NRI:                 api.NRIConfig{NonGPUContainers: api.NonGPUContainersLeave, NonGPUExemptNamespaces: []string{"gpu-operator", "monitoring"}},
	}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if !c.ResourceEnabled(api.ResourceGPUCore) || c.ResourceEnabled(api.ResourceGPUMemory) {
		t.Errorf("ResourceEnabled wrong for %v", c.Resources)
	}
	if !c.HasStrategy(api.DeviceListEnvvar) || c.HasStrategy(api.DeviceListCDICRI) {
		t.Errorf("HasStrategy wrong for %v", c.DeviceListStrategy)
	}
}

func TestLoadNodeAgentConfigErrors(t *testing.T) {
	const head = "apiVersion: tessera.dev/v1alpha1\nkind: NodeAgentConfig\n"
	for _, tc := range []struct {
		name, file, want string
	}{
		{"empty", "", "empty file"},
		{"version", "apiVersion: v1\nkind: NodeAgentConfig\n", "apiVersion"},
		{"kind", "apiVersion: tessera.dev/v1alpha1\nkind: Other\n", "kind"},
		{"unknown field", head + "memoryUnit: 3\n", "memoryUnit"},
		{"resource", head + "resources: [nvidia.com/gpu]\n", `resources[0]: "nvidia.com/gpu"`},
		{"resource twice", head + "resources: [tessera.dev/gpu, tessera.dev/gpu]\n", "listed twice"},
		{"strategy", head + "deviceListStrategy: [magic]\n", `deviceListStrategy[0]: "magic"`},
		{"envvar and volume-mounts", head + "deviceListStrategy: [envvar, volume-mounts]\n", "choose one"},
		{"cdi kind", head + "cdiKind: gpu\n", "cdiKind"},
		{"cdi name", head + "cdiDeviceName: serial\n", "cdiDeviceName"},
		{"duration", head + "healthCheckInterval: -1s\n", "healthCheckInterval: must be a positive duration"},
		{"bad duration", head + "xidRecoveryDelay: soon\n", "soon"},
		{"negative unit", head + "memoryUnitMiB: -1\n", "memoryUnitMiB"},
		{"non-GPU containers", head + "nri:\n  nonGPUContainers: all\n", `nri.nonGPUContainers: must be "void" (hide every GPU from containers without a Tessera resource) or "leave" (leave them as their spec says), got "all"`},
		{"non-GPU containers case", head + "nri:\n  nonGPUContainers: Void\n", `got "Void"`},
		{"nri unknown field", head + "nri:\n  nonGPU: leave\n", "nonGPU"},
		{"exempt namespace", head + "nri:\n  nonGPUExemptNamespaces: [ok, Bad_NS]\n", `nri.nonGPUExemptNamespaces[1]: "Bad_NS" is not a namespace name`},
		{"exempt namespace empty", head + "nri:\n  nonGPUExemptNamespaces: [\"\"]\n", `nri.nonGPUExemptNamespaces[0]: "" is not a namespace name`},
		{"exempt namespace twice", head + "nri:\n  nonGPUExemptNamespaces: [a, a]\n", `nri.nonGPUExemptNamespaces[1]: "a" is listed twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := api.LoadNodeAgentConfig([]byte(tc.file), "cfg.yaml")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadNodeAgentConfig error = %v, want one containing %q", err, tc.want)
			}
			if !strings.Contains(err.Error(), "cfg.yaml") {
				t.Errorf("error %q does not name the source", err)
			}
		})
	}
}
