package api_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/tessera-gpu/tessera/api"
)

func TestMIGNames(t *testing.T) {
	for _, tc := range []struct {
		name    corev1.ResourceName
		profile string
		ok      bool
	}{
		{"tessera.dev/mig-1g.5gb", "1g.5gb", true},
		{"tessera.dev/mig-3g.40gb", "3g.40gb", true},
		{"tessera.dev/mig-7g.80gb", "7g.80gb", true},
		{"tessera.dev/mig-1g.5gb+me", "", false},
		{"tessera.dev/mig-", "", false},
		{"tessera.dev/mig-0g.5gb", "", false},
		{"tessera.dev/mig-1g5gb", "", false},
		{"nvidia.com/mig-1g.5gb", "", false},
		{"tessera.dev/gpu", "", false},
	} {
		p, ok := api.MIGProfileOf(tc.name)
		if p != tc.profile || ok != tc.ok {
			t.Errorf("MIGProfileOf(%s) = %q %v, want %q %v", tc.name, p, ok, tc.profile, tc.ok)
		}
		if api.IsMIGResource(tc.name) != tc.ok {
			t.Errorf("IsMIGResource(%s) != %v", tc.name, tc.ok)
		}
		if tc.ok && (api.MIGResource(tc.profile) != tc.name || !api.IsTesseraResource(tc.name)) {
			t.Errorf("%s: MIGResource or IsTesseraResource disagree", tc.name)
		}
	}
	if !api.ValidMIGUUID("MIG-3b3a5f1c-1b2a-5c4d-9e8f-0a1b2c3d4e5f") || api.ValidMIGUUID("GPU-3b3a5f1c-1b2a-5c4d-9e8f-0a1b2c3d4e5f") {
		t.Error("ValidMIGUUID")
	}
	if err := api.CheckMIGProfile("x", "9g.1gb"); err == nil {
		t.Error("CheckMIGProfile accepted 9g.1gb")
	}
}
