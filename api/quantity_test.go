package api

import (
	"strings"
	"testing"
)

func TestParseQuantity(t *testing.T) {
	for _, in := range []string{"0", "4", "500m", "80Gi", "1e3", "1.5", "+2", "9223372036854775000"} {
		if _, err := ParseQuantity(in); err != nil {
			t.Errorf("%q: %v", in, err)
		}
	}
	for in, want := range map[string]string{
		"":                            "not a quantity",
		"lots":                        "not a quantity",
		"1e-1011001000000020":         "not a quantity", // apimachinery: 26 s
		"E00000000001011001000000020": "not a quantity", // 0 x 10^huge: Cmp takes 25 s
		"1e21":                        "too large",
		"9223372036854775808":         "too large",
		"1Ki1":                        "not a quantity",
		strings.Repeat("9", 65):       "not a quantity",
	} {
		if _, err := ParseQuantity(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.20q: error %v, want %q", in, err, want)
		}
	}
}
