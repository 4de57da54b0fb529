package sim

// Fuzz targets for the simulator's parsers: the trace CSV files and the
// tessera-sim flags. They check properties, not only "no panic": an error
// returns nothing and says what is wrong, a value that parses satisfies the
// parser's invariants and, written back, parses to the same value. `go test`
// runs the seeds.

import (
	"encoding/csv"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/tessera-gpu/tessera/allocator"
)

// csvRecords is the number of records of a CSV file after the header, or
// -1 when it is not CSV.
func csvRecords(data string) int {
	recs, err := csv.NewReader(strings.NewReader(data)).ReadAll()
	if err != nil || len(recs) == 0 {
		return -1
	}
	return len(recs) - 1
}

// writeCSV writes a header and rows as CSV.
func writeCSV(t *testing.T, rows [][]string) string {
	t.Helper()
	var b strings.Builder
	w := csv.NewWriter(&b)
	if err := w.WriteAll(rows); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// wantFileError fails unless err names file and got is nil.
func wantFileError[T any](t *testing.T, got []T, err error, file string) {
	t.Helper()
	if got != nil {
		t.Fatalf("%d rows with error %v", len(got), err)
	}
	if !strings.HasPrefix(err.Error(), file+":") {
		t.Fatalf("error %q does not name the file %s", err, file)
	}
}

// FuzzReadNodes checks that ReadNodes either fails with an error naming
// the file and returns no node, or returns one node per record (none
// dropped) with a trimmed, unique, non-empty name, non-negative resources,
// 0..MaxGPUsPerNode GPUs and a model where there are GPUs; written back as
// CSV, the nodes read the same.
func FuzzReadNodes(f *testing.F) {
	for _, s := range []string{
		nodesCSV,
		"\ufeffsn , cpu_milli,memory_mib,gpu,model,extra\n n ,1.0,2,64,\"A100, 80GB\",x\n",
		"model,gpu,memory_mib,cpu_milli,sn\nT4,1,1,1,a\n,0,1,1,b\n\n",
		"sn,cpu_milli,memory_mib,gpu,model\n",
		"sn,cpu_milli,memory_mib,gpu\nn,1,1,1\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nm,12x,1,1,T4\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,-5,1,T4\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1,T4\nn,1,1,1,T4\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,1,2,\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,1,65,X\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1e3,9223372036854775807,1e0,X\n",
		"sn,cpu_milli,memory_mib,gpu,model\nn,1,1,1\n",
		"sn,cpu_milli,memory_mib,gpu,model\n\"n\"x,1,1,1,X\n",
		"sn,sn,cpu_milli,memory_mib,gpu,model\n",
		"",
	} {
		f.Add(s)
	}
	const file = "nodes.csv"
	f.Fuzz(func(t *testing.T, data string) {
		nodes, err := ReadNodes(strings.NewReader(data), file)
		if err != nil {
			wantFileError(t, nodes, err, file)
			return
		}
		if n := csvRecords(data); n != len(nodes) {
			t.Fatalf("%d nodes from %d records", len(nodes), n)
		}
		seen := map[string]bool{}
		rows := [][]string{{"sn", "cpu_milli", "memory_mib", "gpu", "model"}}
		for i, s := range nodes {
			if s.Name == "" || s.Name != strings.TrimSpace(s.Name) || seen[s.Name] {
				t.Fatalf("node %d: name %q is empty, untrimmed or another node's", i, s.Name)
			}
			seen[s.Name] = true
			if s.CPUMilli < 0 || s.MemMiB < 0 || s.GPUs < 0 || s.GPUs > allocator.MaxGPUsPerNode {
				t.Fatalf("node %d: %+v", i, s)
			}
			if s.Model != strings.TrimSpace(s.Model) || (s.GPUs > 0 && s.Model == "") {
				t.Fatalf("node %d: %d GPUs of model %q", i, s.GPUs, s.Model)
			}
			rows = append(rows, []string{s.Name, strconv.FormatInt(s.CPUMilli, 10), strconv.FormatInt(s.MemMiB, 10), strconv.Itoa(s.GPUs), s.Model})
		}
		enc := writeCSV(t, rows)
		again, err := ReadNodes(strings.NewReader(enc), file)
		if err != nil {
			t.Fatalf("re-reading\n%s: %v", enc, err)
		}
		if diff := cmp.Diff(nodes, again); diff != "" {
			t.Fatalf("re-read nodes differ (-read +re-read):\n%s", diff)
		}
	})
}

// FuzzReadPods checks that ReadPods either fails with an error naming the
// file and returns no pod, or returns one pod per record (none dropped)
// with a trimmed, non-empty name and a request that validates, whole GPUs
// or one slice of 1..999m, with trimmed, non-empty model names only when it
// asks for GPUs; written back as CSV, the pods read the same.
func FuzzReadPods(f *testing.F) {
	for _, s := range []string{
		podsCSV,
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,10,1,300\n",
		"\ufeffgpu_spec,gpu_milli,num_gpu,memory_mib,cpu_milli,name\n A100 | | T4 ,1000.0,64, 0 ,0, p \n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,,1,1,0\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n,1,1,0,0\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,65,1000\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,999\np,1,1,0,5000\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,0,0,A100\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,1e300,\"A|B\"\n",
		"name,cpu_milli,memory_mib,num_gpu,gpu_milli\n",
		"",
	} {
		f.Add(s)
	}
	const file = "pods.csv"
	f.Fuzz(func(t *testing.T, data string) {
		pods, err := ReadPods(strings.NewReader(data), file)
		if err != nil {
			wantFileError(t, pods, err, file)
			return
		}
		if n := csvRecords(data); n != len(pods) {
			t.Fatalf("%d pods from %d records", len(pods), n)
		}
		rows := [][]string{{"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"}}
		for i, p := range pods {
			r := p.Request
			if p.Name == "" || p.Name != strings.TrimSpace(p.Name) {
				t.Fatalf("pod %d: name %q", i, p.Name)
			}
			if err := r.Validate(); err != nil || r.GPUMemMiB != 0 {
				t.Fatalf("pod %d: request %+v: %v", i, r, err)
			}
			if r.Kind() == allocator.CPUOnly && len(r.Models) > 0 {
				t.Fatalf("pod %d: models %q without GPUs", i, r.Models)
			}
			for _, m := range r.Models {
				if m == "" || m != strings.TrimSpace(m) || strings.Contains(m, "|") {
					t.Fatalf("pod %d: model %q", i, m)
				}
			}
			num, milli := 0, int64(0)
			switch r.Kind() {
			case allocator.Whole:
				num, milli = r.GPUs, allocator.MilliPerGPU
			case allocator.Shared:
				num, milli = 1, r.GPUMilli
			}
			rows = append(rows, []string{p.Name, strconv.FormatInt(r.CPUMilli, 10), strconv.FormatInt(r.MemMiB, 10),
				strconv.Itoa(num), strconv.FormatInt(milli, 10), strings.Join(r.Models, "|")})
		}
		enc := writeCSV(t, rows)
		again, err := ReadPods(strings.NewReader(enc), file)
		if err != nil {
			t.Fatalf("re-reading\n%s: %v", enc, err)
		}
		if diff := cmp.Diff(pods, again, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("re-read pods differ (-read +re-read):\n%s", diff)
		}
	})
}

// FuzzParseSeeds checks that ParseSeeds either fails with an error that
// names the seed, range or list it cannot read and returns no seed, or
// returns at least one non-negative seed, at most 100001 per listed part,
// that read back from a plain list are the same.
func FuzzParseSeeds(f *testing.F) {
	for _, s := range []string{"42-51", "42", "1,3-4, 9 ", "", "x", "5-3", "1-x", ",", "0-1000000", "0-100000", "-1", "+7", "1--2", "3-3", " 1 - 2 ,,", "9223372036854775806-9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		seeds, err := ParseSeeds(s)
		if err != nil {
			if seeds != nil {
				t.Fatalf("ParseSeeds(%q) = %v with error %v", s, seeds, err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "seed") && !strings.HasPrefix(msg, "no seeds") {
				t.Fatalf("error %q does not say which seed", msg)
			}
			return
		}
		if len(seeds) == 0 || len(seeds) > 100001*(strings.Count(s, ",")+1) {
			t.Fatalf("ParseSeeds(%q): %d seeds", s, len(seeds))
		}
		parts := make([]string, len(seeds))
		for i, v := range seeds {
			if v < 0 {
				t.Fatalf("ParseSeeds(%q): seed %d", s, v)
			}
			parts[i] = strconv.FormatInt(v, 10)
		}
		again, err := ParseSeeds(strings.Join(parts, ","))
		if err != nil || !cmp.Equal(seeds, again) {
			t.Fatalf("ParseSeeds(%q) = %v; written back: %v, %v", s, seeds, again, err)
		}
	})
}

// FuzzParsePolicies checks that ParsePolicies either fails with an error
// (ErrUnknownPolicy naming the policy, or "no policy") and returns none, or
// returns one known, lower-case policy name per non-blank item, which read
// back are the same.
func FuzzParsePolicies(f *testing.F) {
	f.Add(strings.Join(allocator.PolicyNames(), ","))
	for _, s := range []string{" FGD,bestfit ", "fgd,tetris", " , ", "", "fgd,,fgd", "Tessera", "fgd;bestfit", "\u212aell"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParsePolicies(s)
		if err != nil {
			if got != nil {
				t.Fatalf("ParsePolicies(%q) = %q with error %v", s, got, err)
			}
			if !errors.Is(err, allocator.ErrUnknownPolicy) && !strings.Contains(err.Error(), "no policy in "+strconv.Quote(s)) {
				t.Fatalf("error %q is neither an unknown policy nor an empty list", err)
			}
			return
		}
		items := 0
		for _, p := range strings.Split(s, ",") {
			if strings.TrimSpace(p) != "" {
				items++
			}
		}
		if len(got) == 0 || len(got) != items {
			t.Fatalf("ParsePolicies(%q) = %q from %d items", s, got, items)
		}
		for _, p := range got {
			known := false
			for _, n := range allocator.PolicyNames() {
				known = known || p == n
			}
			if !known {
				t.Fatalf("ParsePolicies(%q): %q is not a policy", s, p)
			}
		}
		if again, err := ParsePolicies(strings.Join(got, ",")); err != nil || !cmp.Equal(got, again) {
			t.Fatalf("ParsePolicies(%q) = %q; written back: %q, %v", s, got, again, err)
		}
	})
}

// FuzzParseTieBreak checks that ParseTieBreak accepts "" (the default) and
// the names String writes, each back to the same value, and otherwise
// fails with an error quoting the value.
func FuzzParseTieBreak(f *testing.F) {
	for _, s := range []string{"artifact", "name", "", "random", "Name", " name"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tb, err := ParseTieBreak(s)
		if err != nil {
			if tb != 0 {
				t.Fatalf("ParseTieBreak(%q) = %v with error %v", s, tb, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("error %q does not quote %q", err, s)
			}
			return
		}
		if s != "" && s != tb.String() {
			t.Fatalf("ParseTieBreak(%q) = %v, which prints as %q", s, tb, tb.String())
		}
		if again, err := ParseTieBreak(tb.String()); err != nil || again != tb {
			t.Fatalf("ParseTieBreak(%q) = %v, %v; want %v", tb.String(), again, err, tb)
		}
	})
}

// tesseraKeys are ParseTesseraConfig's keys and the fields they set.
func tesseraKeys(c *allocator.TesseraConfig) map[string]*float64 {
	return map[string]*float64{
		"frag": &c.FragWeight, "strand": &c.StrandWeight, "gap": &c.GapWeight, "gapcomp": &c.GapCompetition,
		"gaptau": &c.GapRouting, "open": &c.OpenCost, "model": &c.ModelWeight, "scarce": &c.Scarcity,
		"claim": &c.ClaimFillers, "free": &c.FreeWaste, "rem": &c.Remainder, "priced": &c.PricedGaps,
	}
}

// FuzzParseTesseraConfig checks that ParseTesseraConfig either fails with
// an error quoting the weights and returns the zero config, or returns
// finite non-negative weights, the defaults for the keys left out, a gap
// competition where gaps are weighted; written back with every key, the
// weights read the same.
func FuzzParseTesseraConfig(f *testing.F) {
	for _, s := range []string{
		"",
		"frag=0.25,strand=4,gap=4,gapcomp=0.01,gaptau=5,open=40,model=2,scarce=1,claim=0,free=1,rem=1,priced=1",
		" strand=6, GAP=0.25,model=0,gaptau=2,open=7,scarce=0.5,claim=1,free=0,rem=0 ",
		"gap=0,gapcomp=0", "gapcomp=0", "frag=-1", "frag=NaN", "frag=Inf", "frag=1e309", "frag", "frag=1,frag=2",
		"tetris=1", "frag=0x1p-2", "open=1_0", ",,", "frag = 1 ,",
	} {
		f.Add(s)
	}
	def := allocator.DefaultTesseraConfig()
	f.Fuzz(func(t *testing.T, s string) {
		cfg, err := ParseTesseraConfig(s)
		if err != nil {
			if cfg != (allocator.TesseraConfig{}) {
				t.Fatalf("ParseTesseraConfig(%q) = %+v with error %v", s, cfg, err)
			}
			if !strings.Contains(err.Error(), strconv.Quote(s)) {
				t.Fatalf("error %q does not quote %q", err, s)
			}
			return
		}
		given := map[string]bool{}
		for _, kv := range strings.Split(s, ",") {
			if k, _, ok := strings.Cut(kv, "="); ok {
				given[strings.ToLower(strings.TrimSpace(k))] = true
			}
		}
		var parts []string
		got, want := tesseraKeys(&cfg), tesseraKeys(&def)
		for k, v := range got {
			if *v < 0 || math.IsInf(*v, 0) || math.IsNaN(*v) {
				t.Fatalf("ParseTesseraConfig(%q): %s=%v", s, k, *v)
			}
			if !given[k] && *v != *want[k] {
				t.Fatalf("ParseTesseraConfig(%q): %s=%v, not given, want the default %v", s, k, *v, *want[k])
			}
			parts = append(parts, k+"="+strconv.FormatFloat(*v, 'g', -1, 64))
		}
		if cfg.GapWeight > 0 && cfg.GapCompetition <= 0 {
			t.Fatalf("ParseTesseraConfig(%q): gap %v with gapcomp %v", s, cfg.GapWeight, cfg.GapCompetition)
		}
		if again, err := ParseTesseraConfig(strings.Join(parts, ",")); err != nil || again != cfg {
			t.Fatalf("ParseTesseraConfig(%q) = %+v; written back: %+v, %v", s, cfg, again, err)
		}
	})
}
