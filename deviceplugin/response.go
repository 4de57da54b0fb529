package deviceplugin

import (
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/deviceplugin/devices"
)

// cdiAnnotationPlugin names this plugin in CDI annotation keys.
const cdiAnnotationPlugin = "tessera-node"

// wholeResponse tells the runtime to give a container exactly gpus, in
// every form the configuration asks for. An image's own
// NVIDIA_VISIBLE_DEVICES never widens it: the variable is always set, to the
// GPUs, to the volume-mounts directory, or to "void" where CDI alone passes
// the devices.
func wholeResponse(cfg *api.NodeAgentConfig, gpus []devices.GPU) *pluginapi.ContainerAllocateResponse {
	var names, uuids []string
	for _, g := range gpus {
		uuids = append(uuids, g.UUID)
		names = append(names, api.CDIName(cfg.CDIKind, cfg.CDIDeviceName, g.UUID, g.Index))
	}
	return visibleResponse(cfg, api.ResourceGPU, uuids, names)
}

// migResponse tells the runtime to give a container exactly the MIG
// instances uuids, like wholeResponse: CDI names <cdiKind>=<MIG UUID>
// (whatever cdiDeviceName says: a MIG device has no index of its own that
// outlives a repartition), NVIDIA_VISIBLE_DEVICES the MIG UUIDs.
func migResponse(cfg *api.NodeAgentConfig, r corev1.ResourceName, uuids []string) *pluginapi.ContainerAllocateResponse {
	names := make([]string, len(uuids))
	for i, u := range uuids {
		names[i] = cfg.CDIKind + "=" + u
	}
	return visibleResponse(cfg, r, uuids, names)
}

// visibleResponse answers a container with the devices uuids (GPU or MIG
// UUIDs) and their CDI names, per the device list strategy, for resource r.
func visibleResponse(cfg *api.NodeAgentConfig, r corev1.ResourceName, uuids, names []string) *pluginapi.ContainerAllocateResponse {
	resp := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{api.EnvNVIDIAVisibleDevices: api.VisibleDevicesVoid}}
	if cfg.HasStrategy(api.DeviceListCDICRI) {
		for _, n := range names {
			resp.CdiDevices = append(resp.CdiDevices, &pluginapi.CDIDevice{Name: n})
		}
	}
	if cfg.HasStrategy(api.DeviceListCDIAnnotations) {
		resp.Annotations = map[string]string{cdiAnnotationKey(r): strings.Join(names, ",")}
	}
	if cfg.HasStrategy(api.DeviceListEnvvar) {
		resp.Envs[api.EnvNVIDIAVisibleDevices] = strings.Join(uuids, ",")
	}
	if cfg.HasStrategy(api.DeviceListVolumeMounts) {
		resp.Envs[api.EnvNVIDIAVisibleDevices] = api.NVIDIAVolumeMountsDir
		for _, u := range uuids {
			resp.Mounts = append(resp.Mounts, &pluginapi.Mount{HostPath: "/dev/null", ContainerPath: path.Join(api.NVIDIAVolumeMountsDir, u), ReadOnly: true})
		}
	}
	return resp
}

// sharedResponse is the answer for shared units once the NRI plugin is
// connected: no GPU from the device plugin at all (NRI injects the one the
// container was assigned), and NVIDIA_VISIBLE_DEVICES=void so an image
// cannot ask the NVIDIA runtime for more.
func sharedResponse() *pluginapi.ContainerAllocateResponse {
	return &pluginapi.ContainerAllocateResponse{Envs: map[string]string{api.EnvNVIDIAVisibleDevices: api.VisibleDevicesVoid}}
}

// cdiAnnotationKey is the CDI annotation key for resource r's devices; one
// per resource, so the kubelet's merge of several resources' annotations
// into one container keeps them all.
func cdiAnnotationKey(r corev1.ResourceName) string {
	return api.CDIAnnotationPrefix + cdiAnnotationPlugin + "_" + path.Base(string(r))
}
