package gpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// migLib is one GPU in MIG mode with one MIG device whose calls a test
// breaks one at a time.
func migLib(t *testing.T, breakCall string) Interface {
	t.Helper()
	ret := func(call string) nvml.Return {
		if call == breakCall {
			return nvml.ERROR_UNKNOWN
		}
		return nvml.SUCCESS
	}
	gi := &mock.GpuInstance{GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Id: 9, Placement: nvml.GpuInstancePlacement{Start: 4, Size: 2}}, ret("GetInfo")
	}}
	mig := &mock.Device{
		GetUUIDFunc:              func() (string, nvml.Return) { return "MIG-0", ret("MIG GetUUID") },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return 9, ret("GetGpuInstanceId") },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { return 0, ret("GetComputeInstanceId") },
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{GpuInstanceSliceCount: 2, ComputeInstanceSliceCount: 2, MemorySizeMB: 9856}, ret("GetAttributes")
		},
	}
	dev := &mock.Device{
		GetMigModeFunc: func() (int, int, nvml.Return) {
			if breakCall == "unsupported" {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, ret("GetMigMode")
		},
		GetMemoryInfoFunc:        func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: 40960 << 20}, ret("GetMemoryInfo") },
		GetMaxMigDeviceCountFunc: func() (int, nvml.Return) { return 7, ret("GetMaxMigDeviceCount") },
		GetMigDeviceHandleByIndexFunc: func(k int) (nvml.Device, nvml.Return) {
			if k == 3 {
				return mig, ret("GetMigDeviceHandleByIndex")
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
		GetGpuInstanceByIdFunc: func(id int) (nvml.GpuInstance, nvml.Return) {
			if id != 9 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return gi, ret("GetGpuInstanceById")
		},
	}
	lib := NewNVML(&mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, nvml.SUCCESS },
	})
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	return lib
}

// Every failing NVML call while reading a MIG layout is an error naming
// the call: an instance is never dropped silently.
func TestMIGErrors(t *testing.T) {
	for _, call := range []string{"GetMigMode", "GetMemoryInfo", "GetMaxMigDeviceCount", "GetMigDeviceHandleByIndex", "MIG GetUUID", "GetGpuInstanceId", "GetComputeInstanceId", "GetAttributes", "GetGpuInstanceById", "GetInfo"} {
		t.Run(call, func(t *testing.T) {
			_, err := migLib(t, call).MIG(0)
			var nerr *Error
			if !errors.As(err, &nerr) || nerr.Return != nvml.ERROR_UNKNOWN {
				t.Fatalf("MIG(0) with %s failing = %v, want an NVML error", call, err)
			}
			name := strings.TrimPrefix(call, "MIG ")
			if !strings.Contains(err.Error(), name) {
				t.Errorf("error %q does not name %s", err, name)
			}
		})
	}
	t.Run("none", func(t *testing.T) {
		info, err := migLib(t, "").MIG(0)
		if err != nil {
			t.Fatal(err)
		}
		want := MIGInstance{UUID: "MIG-0", Profile: "2g.10gb", GPUInstanceID: 9, Start: 4, Size: 2, MemoryMiB: 9856}
		if !info.Enabled || len(info.Instances) != 1 || info.Instances[0] != want {
			t.Errorf("MIG(0) = %+v, want enabled with %+v", info, want)
		}
	})
	t.Run("unsupported", func(t *testing.T) {
		info, err := migLib(t, "unsupported").MIG(0)
		if err != nil || info.Enabled || len(info.Instances) != 0 {
			t.Errorf("MIG(0) without MIG support = %+v, %v; want not enabled, no error", info, err)
		}
	})
}
