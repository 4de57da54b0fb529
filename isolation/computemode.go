package isolation

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NVMLComputeMode sets compute modes through NVML (which needs root on the
// host, as the node agent runs).
type NVMLComputeMode struct {
	Lib nvml.Interface
}

var _ ComputeModeSetter = NVMLComputeMode{}

// SetComputeMode implements ComputeModeSetter.
func (n NVMLComputeMode) SetComputeMode(index int, exclusiveProcess bool) error {
	dev, ret := n.Lib.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: %s", index, ret.Error())
	}
	mode := nvml.COMPUTEMODE_DEFAULT
	if exclusiveProcess {
		mode = nvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	}
	if ret := dev.SetComputeMode(mode); ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %d: setting compute mode %d: %s", index, mode, ret.Error())
	}
	return nil
}
