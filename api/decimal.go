package api

import (
	"errors"
	"fmt"
	"strconv"
)

// ParseDecimal parses value as a whole number from lo to hi (0 <= lo <= hi)
// written plainly: ASCII digits only, without sign, space, leading zero,
// fraction or exponent ("2", not " 2", "+2", "02", "2.0" or "2e0"), so
// that each number has one spelling, the one strconv.FormatInt writes.
// It is the one parser of the counts tenants write in annotations
// (tessera.dev/gpu-count, the gang's sizes and timeout): what Tessera
// reads is what the text says to anyone who compares it. The error says
// why not, without naming what was parsed (the caller does).
func ParseDecimal(value string, lo, hi int64) (int64, error) {
	if value == "" {
		return 0, errors.New("empty")
	}
	for i := 0; i < len(value); i++ {
		if value[i] < '0' || value[i] > '9' {
			return 0, errors.New("write a whole number with the digits 0-9 only")
		}
	}
	if value[0] == '0' && len(value) > 1 {
		return 0, errors.New("no leading zero")
	}
	n, err := strconv.ParseInt(value, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("must be %d..%d", lo, hi)
	}
	return n, nil
}
