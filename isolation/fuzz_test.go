package isolation

// Fuzz targets for the parsers of the node agent's isolation settings.
// They check properties, not only "no panic"; `go test` runs the seeds.

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseAction checks that ParseAction accepts exactly the four actions,
// spelled as their constants (so the value it returns prints back as the
// flag it was given), and otherwise fails with an error that quotes the
// value, lists the choices and returns no action.
func FuzzParseAction(f *testing.F) {
	for _, s := range []string{"none", "warn", "kill", "evict", "", "Kill", " kill", "kill ", "evict\x00", "warn,kill", "ñone"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAction(s)
		if err != nil {
			if a != "" {
				t.Fatalf("ParseAction(%q) = %q with error %v", s, a, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, strconv.Quote(s)) || !strings.Contains(msg, "none, warn, kill, evict") {
				t.Fatalf("error %q does not quote %q and list the actions", msg, s)
			}
			return
		}
		switch a {
		case ActionNone, ActionWarn, ActionKill, ActionEvict:
		default:
			t.Fatalf("ParseAction(%q) = %q, not an action", s, a)
		}
		if string(a) != s {
			t.Fatalf("ParseAction(%q) = %q, which is not how it was written", s, a)
		}
		if again, err := ParseAction(string(a)); err != nil || again != a {
			t.Fatalf("ParseAction(%q) = %q, %v; want %q", a, again, err, a)
		}
	})
}
