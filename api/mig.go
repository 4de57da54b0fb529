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
