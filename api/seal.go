package api

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// Tessera's decisions on a pod (its Assignment and its GangPlan) live in
// annotations, and a pod's creator can write annotations too. Two defences
// keep a tenant from passing its own words off as Tessera's:
//
//  1. deploy/admission's ValidatingAdmissionPolicy refuses a create or update
//     that sets, changes or removes any of GuardedAnnotations unless the
//     request comes from Tessera's own service accounts;
//  2. every Tessera component that reads a decision takes it only with a
//     valid seal: an HMAC-SHA256, under a key only Tessera's identities can
//     read (the Secret SealKeySecretName), of the annotation's name, the
//     pod's UID and the value. A value without a valid seal is ignored,
//     never obeyed. The pod's UID in the MAC keeps a sealed value from being
//     copied onto another pod; the API server sets the UID, so a tenant
//     cannot make a pod whose UID it knows in advance.

// Seal annotations: the seal of AnnotationAssignment and of
// AnnotationGangPlan.
const (
	AnnotationAssignmentSeal = AnnotationAssignment + "-seal"
	AnnotationGangPlanSeal   = AnnotationGangPlan + "-seal"
)

// StateAnnotations are the pod annotations only Tessera writes that carry
// its decisions: the decisions and their seals.
func StateAnnotations() []string {
	return []string{AnnotationAssignment, AnnotationAssignmentSeal, AnnotationGangPlan, AnnotationGangPlanSeal}
}

// GuardedAnnotations are the pod annotations only Tessera may write:
// StateAnnotations, then AnnotationQuotaRequeue (no decision, so neither
// sealed nor sanitized). deploy/admission's policy protects exactly these,
// in this order (a test checks the two lists agree).
func GuardedAnnotations() []string {
	return append(StateAnnotations(), AnnotationQuotaRequeue)
}

// IsGuardedAnnotation reports whether key is one of GuardedAnnotations.
func IsGuardedAnnotation(key string) bool {
	for _, k := range GuardedAnnotations() {
		if k == key {
			return true
		}
	}
	return false
}

// IsStateAnnotation reports whether key is one of StateAnnotations.
func IsStateAnnotation(key string) bool {
	for _, k := range StateAnnotations() {
		if k == key {
			return true
		}
	}
	return false
}

// The Secret holding the seal key: the extender creates it in its own
// namespace when it is missing; node agents read it. Its data key
// SealKeyDataKey holds at least MinSealKeyBytes random bytes.
const (
	SealKeySecretName = "tessera-seal-key"
	SealKeyDataKey    = "key"
	MinSealKeyBytes   = 32
)

// sealVersion prefixes every seal, so that the scheme can change.
const sealVersion = "v1."

// ErrUnsealed is wrapped by the errors of Sealer's readers when a decision
// annotation is present without a valid seal: somebody other than Tessera
// wrote it, or it was copied from another pod.
var ErrUnsealed = errors.New("not sealed by Tessera")

// Sealer seals and verifies Tessera's decision annotations with one key.
type Sealer struct {
	key []byte
}

// NewSealer returns a Sealer for key, which must hold at least
// MinSealKeyBytes bytes.
func NewSealer(key []byte) (*Sealer, error) {
	if len(key) < MinSealKeyBytes {
		return nil, fmt.Errorf("seal key: %d bytes, want at least %d", len(key), MinSealKeyBytes)
	}
	return &Sealer{key: append([]byte(nil), key...)}, nil
}

func (s *Sealer) mac(uid types.UID, name, value string) []byte {
	m := hmac.New(sha256.New, s.key)
	// Lengths first, so that no two (name, uid, value) share a message.
	fmt.Fprintf(m, "tessera.dev/seal/v1\n%d:%s\n%d:%s\n%d:", len(name), name, len(uid), uid, len(value))
	m.Write([]byte(value))
	return m.Sum(nil)
}

// Seal returns the seal of annotation name holding value on the pod uid.
func (s *Sealer) Seal(uid types.UID, name, value string) string {
	return sealVersion + base64.RawURLEncoding.EncodeToString(s.mac(uid, name, value))
}

// sealOf returns the name of the seal annotation of the decision
// annotation name.
func sealOf(name string) string { return name + "-seal" }

// Verify returns the value of the decision annotation name of the pod uid
// when its seal is valid. found is false when the annotation is absent. An
// error wrapping ErrUnsealed means it is present without a valid seal.
func (s *Sealer) Verify(uid types.UID, annotations map[string]string, name string) (value string, found bool, err error) {
	value, found = annotations[name]
	if !found {
		return "", false, nil
	}
	seal, ok := annotations[sealOf(name)]
	if !ok {
		return "", true, fmt.Errorf("annotation %s: %w (no %s)", name, ErrUnsealed, sealOf(name))
	}
	enc, ok := strings.CutPrefix(seal, sealVersion)
	if !ok {
		return "", true, fmt.Errorf("annotation %s: %w (%s is not a %s seal)", name, ErrUnsealed, sealOf(name), strings.TrimSuffix(sealVersion, "."))
	}
	got, derr := base64.RawURLEncoding.Strict().DecodeString(enc) // Strict: one encoding per seal
	if derr != nil || !hmac.Equal(got, s.mac(uid, name, value)) {
		return "", true, fmt.Errorf("annotation %s: %w (its seal does not match this pod and value)", name, ErrUnsealed)
	}
	return value, true, nil
}

// Assignment returns the pod's Assignment when Tessera sealed it. found is
// false when there is none; an error wraps ErrUnsealed (not Tessera's) or
// says why the sealed value is malformed.
func (s *Sealer) Assignment(uid types.UID, annotations map[string]string) (a *Assignment, found bool, err error) {
	value, found, err := s.Verify(uid, annotations, AnnotationAssignment)
	if !found || err != nil {
		return nil, found, err
	}
	a, err = ParseAssignment(value)
	return a, true, err
}

// GangPlan returns the pod's GangPlan when Tessera sealed it, like
// Assignment.
func (s *Sealer) GangPlan(uid types.UID, annotations map[string]string) (p *GangPlan, found bool, err error) {
	value, found, err := s.Verify(uid, annotations, AnnotationGangPlan)
	if !found || err != nil {
		return nil, found, err
	}
	p, err = ParseGangPlan(value)
	return p, true, err
}

// Annotations returns the decision annotation name holding value on the
// pod uid together with its seal annotation: what a writer puts in one
// patch.
func (s *Sealer) Annotations(uid types.UID, name, value string) map[string]string {
	return map[string]string{name: value, sealOf(name): s.Seal(uid, name, value)}
}

// AssignmentAnnotations validates a and returns the annotations that
// record it on the pod uid: the value and its seal, to be written together
// in one patch.
func (s *Sealer) AssignmentAnnotations(uid types.UID, a *Assignment) (map[string]string, error) {
	value, err := EncodeAssignment(a)
	if err != nil {
		return nil, err
	}
	return s.Annotations(uid, AnnotationAssignment, value), nil
}

// GangPlanAnnotations returns the annotations that record p (apiVersion
// and kind filled in) on the pod uid: the value and its seal.
func (s *Sealer) GangPlanAnnotations(uid types.UID, p GangPlan) (map[string]string, error) {
	p.APIVersion, p.Kind = Version, KindGangPlan
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", AnnotationGangPlan, err)
	}
	value := string(b)
	if _, err := ParseGangPlan(value); err != nil {
		return nil, err
	}
	return s.Annotations(uid, AnnotationGangPlan, value), nil
}
