package sim

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func smallResults(t *testing.T) []*Result {
	t.Helper()
	tr := synthTrace(5)
	res, err := RunAll(t.Context(), Jobs([]*Trace{tr}, []string{"bestfit", "fgd"}, []int64{1, 2}, Config{}), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestWriteJSON(t *testing.T) {
	res := smallResults(t)
	var buf bytes.Buffer
	if err := WriteJSON(&buf, res); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := 0
	for _, r := range res {
		want += len(r.Curve)
	}
	if len(lines) != want {
		t.Fatalf("%d lines, want %d", len(lines), want)
	}
	wantKeys := []string{"allocPct", "arrivedPct", "fragPct", "policy", "seed", "unallocatedPct", "workload"}
	for i, l := range lines {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d is not JSON: %v", i, err)
		}
		var keys []string
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !cmp.Equal(keys, wantKeys) {
			t.Fatalf("line %d keys %v, want %v", i, keys, wantKeys)
		}
	}
	var first Record
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatal(err)
	}
	p := res[0].Curve[0]
	if first.Policy != "bestfit" || first.Workload != "synthetic" || first.Seed != 1 || first.ArrivedPct != p.ArrivedPct ||
		first.AllocPct != p.AllocPct || first.UnallocatedPct != p.UnallocatedPct || first.FragPct != p.FragPct {
		t.Errorf("first record %+v does not match the first point %+v", first, p)
	}
}

func TestWriteCSVAndTable(t *testing.T) {
	res := smallResults(t)
	var buf bytes.Buffer
	if err := WriteCSV(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(buf.String(), "policy,workload,seed,arrivedPct,allocPct,unallocatedPct,fragPct\nbestfit,synthetic,1,0,") {
		t.Errorf("CSV starts with %q", buf.String()[:80])
	}
	sums := Summarize(res)
	if len(sums) != 2 || sums[0].Policy != "bestfit" || len(sums[0].Seeds) != 2 || sums[0].Unallocated.N != 2 {
		t.Fatalf("Summarize = %+v", sums)
	}
	buf.Reset()
	pub := map[[2]string]Stats{{"synthetic", "fgd"}: {Mean: 4.77, SD: 0.11, N: 10}}
	if err := WriteTable(&buf, sums, pub); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"workload synthetic, 2 seeds (1,2)", "unalloc%@100 (mean ± sd)", "4.77 ± 0.11"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, "\nbestfit ") != 1 || strings.Count(out, "\nfgd ") != 1 {
		t.Errorf("table should have one row per policy:\n%s", out)
	}
}

func TestWriteSVG(t *testing.T) {
	sums := Summarize(smallResults(t))
	var buf bytes.Buffer
	if err := WriteSVG(&buf, sums); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&buf)
	polylines, texts := 0, ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if el.Name.Local == "polyline" {
				polylines++
			}
		case xml.CharData:
			texts += string(el)
		}
	}
	if polylines != 2*len(sums) {
		t.Errorf("%d polylines, want %d (two panels, one line per policy)", polylines, 2*len(sums))
	}
	if !strings.Contains(texts, "bestfit (") || !strings.Contains(texts, "synthetic (zoom)") {
		t.Errorf("SVG text lacks the legend or titles: %q", texts)
	}
}

func TestPublishedAt100(t *testing.T) {
	in := "workload,sc_policy,tune,seed,total_gpus,99,100\nw,06-FGD,1.3,42,6212,96,95.2\nw,06-FGD,1.3,43,6212,96,95.4\nw,05-BestFit,1.3,42,6212,93,\n"
	curves, err := ReadPublished(strings.NewReader(in), "pub.csv")
	if err != nil {
		t.Fatal(err)
	}
	if len(curves) != 3 || curves[0].Policy != "fgd" || curves[2].Policy != "bestfit" || len(curves[2].Alloc) != 1 {
		t.Fatalf("curves = %+v", curves)
	}
	got := PublishedAt100(curves)
	s := got[[2]string{"w", "fgd"}]
	if s.N != 2 || s.Mean < 4.699 || s.Mean > 4.701 {
		t.Errorf("fgd at 100 = %+v", s)
	}
	if _, ok := got[[2]string{"w", "bestfit"}]; ok {
		t.Errorf("bestfit has no value at 100 and should be absent")
	}
	if _, err := ReadPublished(strings.NewReader("workload,sc_policy,seed,100\nw,07-Magic,1,2\n"), "p.csv"); err == nil || !strings.Contains(err.Error(), "p.csv:2") {
		t.Errorf("unknown artifact policy: %v", err)
	}
}
