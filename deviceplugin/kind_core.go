package deviceplugin

import "github.com/tessera-gpu/tessera/api"

// coreKind is tessera.dev/gpu-core: api.CoresPerGPU devices per GPU, each
// a percent of its compute, with IDs <uuid>::core::<n>. A shared kind
// (kind_shared.go).
type coreKind struct{ unitKind }

var (
	_ Kind               = (*coreKind)(nil)
	_ PreferredAllocator = (*coreKind)(nil)
	_ Withholder         = (*coreKind)(nil)
	_ SharedKind         = (*coreKind)(nil)
)

func newCoreKind(env kindEnv) *coreKind {
	return &coreKind{newUnitKind(api.ResourceGPUCore, env)}
}
