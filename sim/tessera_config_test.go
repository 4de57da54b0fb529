package sim

import (
	"strings"
	"testing"

	"github.com/tessera-gpu/tessera/allocator"
)

func TestParseTesseraConfig(t *testing.T) {
	def := allocator.DefaultTesseraConfig()
	got, err := ParseTesseraConfig("")
	if err != nil || got != def {
		t.Fatalf(`ParseTesseraConfig("") = %+v, %v; want the default %+v`, got, err, def)
	}
	got, err = ParseTesseraConfig(" strand=6, GAP=0.25,model=0,gaptau=2,open=7,scarce=0.5,claim=1,free=0,rem=0 ")
	if err != nil {
		t.Fatal(err)
	}
	want := def
	want.StrandWeight, want.GapWeight, want.ModelWeight, want.GapRouting, want.OpenCost = 6, 0.25, 0, 2, 7
	want.Scarcity, want.ClaimFillers, want.FreeWaste, want.Remainder = 0.5, 1, 0, 0
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []struct{ in, msg string }{
		{"strand", "not KEY=VALUE"},
		{"speed=1", "not KEY=VALUE"},
		{"frag=x", "not a non-negative number"},
		{"frag=-1", "not a non-negative number"},
		{"frag=NaN", "not a non-negative number"},
		{"frag=1,frag=2", "given twice"},
		{"gapcomp=0", "gapcomp must be > 0"},
		// Found by FuzzParseTesseraConfig: on an error it returned the
		// weights read so far instead of the zero config.
		{"frag=1,strand", "not KEY=VALUE"},
	} {
		got, err := ParseTesseraConfig(bad.in)
		if err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("ParseTesseraConfig(%q) = %v, want an error with %q", bad.in, err, bad.msg)
		}
		if got != (allocator.TesseraConfig{}) {
			t.Errorf("ParseTesseraConfig(%q) = %+v with an error, want the zero config", bad.in, got)
		}
	}
	if _, err := ParseTesseraConfig("gap=0,gapcomp=0"); err != nil {
		t.Errorf("gap=0,gapcomp=0: %v", err)
	}
}
