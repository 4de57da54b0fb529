package api

import (
	"fmt"
	"math"
	"regexp"

	"k8s.io/apimachinery/pkg/api/resource"
)

// quantityPattern is the quantity syntax of resource.ParseQuantity, with a
// decimal exponent of at most three digits: apimachinery takes tens of
// seconds to parse "1e-1011001000000020" (found by FuzzElasticQuota), and a
// quantity Tessera counts never needs more.
var quantityPattern = regexp.MustCompile(`^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d{1,3}|[KMGTPE]i|[numkMGTPE])?$`)

// ParseQuantity parses a quantity written by a user (a CRD field, which the
// API server does not canonicalise) that Tessera counts in int64: bounded
// in length and exponent before apimachinery parses it, finite and at most
// math.MaxInt64 after.
func ParseQuantity(s string) (resource.Quantity, error) {
	if len(s) > 64 || !quantityPattern.MatchString(s) {
		return resource.Quantity{}, fmt.Errorf("%.64q is not a quantity such as 4, 500m, 80Gi or 1e3", s)
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%q: %w", s, err)
	}
	// AsApproximateFloat64 is cheap whatever the scale; Cmp and Value are
	// not on a value of a huge scale.
	if f := q.AsApproximateFloat64(); math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) >= math.MaxInt64 {
		return resource.Quantity{}, fmt.Errorf("%q is too large (at most %d)", s, int64(math.MaxInt64))
	}
	return q, nil
}
