package deviceplugin

import "github.com/tessera-gpu/tessera/api"

// memoryKind is tessera.dev/gpu-memory: per GPU, one device per
// memoryUnitMiB of its memory less memoryReserveMiB (gpureq.MemoryUnits),
// with IDs <uuid>::mem::<n>. A shared kind (kind_shared.go).
type memoryKind struct{ unitKind }

var (
	_ Kind               = (*memoryKind)(nil)
	_ PreferredAllocator = (*memoryKind)(nil)
	_ Withholder         = (*memoryKind)(nil)
	_ SharedKind         = (*memoryKind)(nil)
)

func newMemoryKind(env kindEnv) *memoryKind {
	return &memoryKind{newUnitKind(api.ResourceGPUMemory, env)}
}
