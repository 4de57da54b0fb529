package api

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// ResourceMIGPrefix starts the name of every MIG resource: one resource per
// MIG profile, tessera.dev/mig-<profile>, e.g. tessera.dev/mig-1g.5gb. Each
// device is one MIG instance (a GPU instance with its compute instance) of
// that profile; its device ID is the instance's MIG UUID.
const ResourceMIGPrefix = Domain + "/mig-"

// migProfilePattern is a MIG profile name as NVIDIA writes it and as a
// resource name can hold it: <compute slices>g.<memory>gb, e.g. 1g.5gb,
// 3g.40gb. The profiles with a "+" suffix (+me, +gfx) are not served: a
// resource name cannot hold "+".
var migProfilePattern = regexp.MustCompile(`^[1-8]g\.[1-9][0-9]{0,3}gb$`)

// ValidMIGProfile reports whether profile is a MIG profile name Tessera
// serves as a resource.
func ValidMIGProfile(profile string) bool { return migProfilePattern.MatchString(profile) }

// MIGResource is the resource of a MIG profile.
func MIGResource(profile string) corev1.ResourceName {
	return corev1.ResourceName(ResourceMIGPrefix + profile)
}

// MIGProfileOf returns the profile of a MIG resource; ok is false for any
// other name, a malformed profile included.
func MIGProfileOf(name corev1.ResourceName) (profile string, ok bool) {
	p, found := strings.CutPrefix(string(name), ResourceMIGPrefix)
	if !found || !ValidMIGProfile(p) {
		return "", false
	}
	return p, true
}

// IsMIGResource reports whether name is a MIG resource.
func IsMIGResource(name corev1.ResourceName) bool {
	_, ok := MIGProfileOf(name)
	return ok
}

// migUUIDPattern is a MIG device UUID as NVML reports it (R470 and later).
var migUUIDPattern = regexp.MustCompile(`^MIG-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// ValidMIGUUID reports whether s is a MIG device UUID.
func ValidMIGUUID(s string) bool { return migUUIDPattern.MatchString(s) }

// CheckMIGProfile returns an error naming field when profile is not a MIG
// profile Tessera serves.
func CheckMIGProfile(field, profile string) error {
	if !ValidMIGProfile(profile) {
		return fmt.Errorf("%s: %q is not a MIG profile like 1g.5gb or 3g.40gb", field, profile)
	}
	return nil
}

// MIGSlices is the number of memory slices of a GPU in MIG mode (A100,
// H100, B200): a placement lies within [0, MIGSlices).
const MIGSlices = 8

// MIGPlacement is where a MIG instance lies in its GPU's memory slices:
// [Start, Start+Size).
type MIGPlacement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// CheckMIGPlacements checks that each placement has a size of 1, 2, 4 or
// 8 slices, starts at a multiple of its size (8-slice ones at 0; a 1-slice
// one anywhere but 7, where no GPU places one), lies within the GPU, and
// overlaps no other. field names the list in errors.
func CheckMIGPlacements(field string, places []MIGPlacement) error {
	var used [MIGSlices]int // 1 + index of the placement on each slice
	for i, p := range places {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch p.Size {
		case 1, 2, 4, 8:
		default:
			return fmt.Errorf("%s.size: must be 1, 2, 4 or 8 memory slices, got %d", f, p.Size)
		}
		if p.Start < 0 || p.Start+p.Size > MIGSlices || p.Start%p.Size != 0 || (p.Size == 1 && p.Start == MIGSlices-1) {
			return fmt.Errorf("%s.start: %d is not a placement of a %d-slice instance", f, p.Start, p.Size)
		}
		for s := p.Start; s < p.Start+p.Size; s++ {
			if used[s] != 0 {
				return fmt.Errorf("%s: slices %d-%d overlap %s[%d]", f, p.Start, p.Start+p.Size-1, field, used[s]-1)
			}
			used[s] = i + 1
		}
	}
	return nil
}
