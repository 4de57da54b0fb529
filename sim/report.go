package sim

import (
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Record is one line of the JSON output: one policy, workload, seed and
// arrived percentage.
type Record struct {
	Policy         string  `json:"policy"`
	Workload       string  `json:"workload"`
	Seed           int64   `json:"seed"`
	ArrivedPct     int     `json:"arrivedPct"`
	AllocPct       float64 `json:"allocPct"`
	UnallocatedPct float64 `json:"unallocatedPct"`
	FragPct        float64 `json:"fragPct"`
}

// Records flattens results into one Record per arrived percentage.
func Records(results []*Result) []Record {
	var out []Record
	for _, r := range results {
		for _, p := range r.Curve {
			out = append(out, Record{
				Policy: r.Policy, Workload: r.Workload, Seed: r.Seed,
				ArrivedPct: p.ArrivedPct, AllocPct: p.AllocPct,
				UnallocatedPct: p.UnallocatedPct, FragPct: p.FragPct,
			})
		}
	}
	return out
}

// WriteJSON writes one JSON object per line per policy, seed and arrived
// percentage.
func WriteJSON(w io.Writer, results []*Result) error {
	enc := json.NewEncoder(w)
	for _, rec := range Records(results) {
		if err := enc.Encode(rec); err != nil {
			return fmt.Errorf("write json: %w", err)
		}
	}
	return nil
}

// WriteCSV writes the same records as WriteJSON as CSV with a header.
func WriteCSV(w io.Writer, results []*Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "workload", "seed", "arrivedPct", "allocPct", "unallocatedPct", "fragPct"}); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) }
	for _, r := range Records(results) {
		row := []string{r.Policy, r.Workload, strconv.FormatInt(r.Seed, 10), strconv.Itoa(r.ArrivedPct), f(r.AllocPct), f(r.UnallocatedPct), f(r.FragPct)}
		if err := cw.Write(row); err != nil {
			return fmt.Errorf("write csv: %w", err)
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("write csv: %w", err)
	}
	return nil
}

// PublishedAt100 returns, per workload and policy, the published unallocated
// GPU % at 100% arrived (mean and sd over seeds).
func PublishedAt100(curves []PublishedCurve) map[[2]string]Stats {
	vals := make(map[[2]string][]float64)
	for _, c := range curves {
		if v, ok := c.Alloc[100]; ok {
			k := [2]string{c.Workload, c.Policy}
			vals[k] = append(vals[k], 100-v)
		}
	}
	out := make(map[[2]string]Stats, len(vals))
	for k, v := range vals {
		out[k] = MeanSD(v)
	}
	return out
}

// WriteTable writes, per workload, one row per policy with the mean ± sd of
// unallocated GPU % at 100% arrived, the mean at a few other points, the
// fragmentation at 100%, and the published artifact value when known.
func WriteTable(w io.Writer, sums []Summary, published map[[2]string]Stats) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	workload := ""
	for _, s := range sums {
		if s.Workload != workload {
			if workload != "" {
				fmt.Fprintln(tw)
			}
			workload = s.Workload
			fmt.Fprintf(tw, "workload %s, %d seeds (%s)\n", s.Workload, len(s.Seeds), seedList(s.Seeds))
			fmt.Fprintln(tw, "policy\tunalloc%@100 (mean ± sd)\tpublished@100\t@90\t@110\t@130\tfrag%@100")
		}
		pub := "-"
		if p, ok := published[[2]string{s.Workload, s.Policy}]; ok {
			pub = fmt.Sprintf("%.2f ± %.2f", p.Mean, p.SD)
		}
		at := func(pct int) string {
			if p, ok := At(s.Curve, pct); ok {
				return strconv.FormatFloat(p.UnallocatedPct, 'f', 2, 64)
			}
			return "-"
		}
		fmt.Fprintf(tw, "%s\t%.2f ± %.2f\t%s\t%s\t%s\t%s\t%.2f ± %.2f\n",
			s.Policy, s.Unallocated.Mean, s.Unallocated.SD, pub, at(90), at(110), at(130), s.Frag.Mean, s.Frag.SD)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func seedList(seeds []int64) string {
	if len(seeds) == 0 {
		return ""
	}
	contiguous := true
	for i := 1; i < len(seeds); i++ {
		if seeds[i] != seeds[i-1]+1 {
			contiguous = false
		}
	}
	if contiguous && len(seeds) > 2 {
		return fmt.Sprintf("%d-%d", seeds[0], seeds[len(seeds)-1])
	}
	parts := make([]string, len(seeds))
	for i, s := range seeds {
		parts[i] = strconv.FormatInt(s, 10)
	}
	return strings.Join(parts, ",")
}

// SVG document model, written with encoding/xml.
type svgDoc struct {
	XMLName xml.Name  `xml:"svg"`
	Xmlns   string    `xml:"xmlns,attr"`
	Width   int       `xml:"width,attr"`
	Height  int       `xml:"height,attr"`
	Font    string    `xml:"font-family,attr"`
	Title   svgTextEl `xml:"title"`
	Rect    svgRect   `xml:"rect"`
	Groups  []svgG    `xml:"g"`
}

type svgRect struct {
	X      float64 `xml:"x,attr"`
	Y      float64 `xml:"y,attr"`
	Width  float64 `xml:"width,attr"`
	Height float64 `xml:"height,attr"`
	Fill   string  `xml:"fill,attr"`
	Stroke string  `xml:"stroke,attr,omitempty"`
}

type svgG struct {
	Transform string    `xml:"transform,attr,omitempty"`
	Rects     []svgRect `xml:"rect"`
	Lines     []svgLine `xml:"line"`
	Polylines []svgPoly `xml:"polyline"`
	Texts     []svgText `xml:"text"`
}

type svgLine struct {
	X1     float64 `xml:"x1,attr"`
	Y1     float64 `xml:"y1,attr"`
	X2     float64 `xml:"x2,attr"`
	Y2     float64 `xml:"y2,attr"`
	Stroke string  `xml:"stroke,attr"`
	Width  float64 `xml:"stroke-width,attr"`
}

type svgPoly struct {
	Points string  `xml:"points,attr"`
	Stroke string  `xml:"stroke,attr"`
	Width  float64 `xml:"stroke-width,attr"`
	Fill   string  `xml:"fill,attr"`
}

type svgText struct {
	X      float64 `xml:"x,attr"`
	Y      float64 `xml:"y,attr"`
	Size   int     `xml:"font-size,attr"`
	Anchor string  `xml:"text-anchor,attr,omitempty"`
	Fill   string  `xml:"fill,attr,omitempty"`
	Text   string  `xml:",chardata"`
}

type svgTextEl struct {
	Text string `xml:",chardata"`
}

// policyColor gives each policy a stable colour.
func policyColor(i int, name string) string {
	switch name {
	case "random":
		return "#7f7f7f"
	case "dotprod":
		return "#9467bd"
	case "gpuclustering":
		return "#8c564b"
	case "gpupacking":
		return "#e377c2"
	case "bestfit":
		return "#1f77b4"
	case "fgd":
		return "#ff7f0e"
	case "tessera":
		return "#d62728"
	case "spread":
		return "#17becf"
	}
	palette := []string{"#2ca02c", "#bcbd22", "#393b79", "#637939"}
	return palette[i%len(palette)]
}

// WriteSVG plots unallocated GPU % (mean over seeds) against arrived
// workload %, one line per policy, two panels per workload: the whole run
// and a zoom on 80-130% arrived.
func WriteSVG(w io.Writer, sums []Summary) error {
	var workloads []string
	byWorkload := make(map[string][]Summary)
	for _, s := range sums {
		if _, ok := byWorkload[s.Workload]; !ok {
			workloads = append(workloads, s.Workload)
		}
		byWorkload[s.Workload] = append(byWorkload[s.Workload], s)
	}
	const panelW, panelH, margin = 520.0, 340.0, 60.0
	doc := svgDoc{
		Xmlns:  "http://www.w3.org/2000/svg",
		Width:  int(2 * (panelW + margin)),
		Height: int(float64(len(workloads)) * (panelH + margin + 30)),
		Font:   "sans-serif",
		Title:  svgTextEl{Text: "Unallocated GPU % vs arrived workload %"},
	}
	doc.Rect = svgRect{Width: float64(doc.Width), Height: float64(doc.Height), Fill: "white"}
	for wi, wl := range workloads {
		ss := byWorkload[wl]
		top := float64(wi) * (panelH + margin + 30)
		for pi, zoom := range []bool{false, true} {
			xmin, xmax, ymin, ymax := 0.0, 130.0, 0.0, 100.0
			if zoom {
				xmin, ymax = 80, 0
				for _, s := range ss {
					for _, p := range s.Curve {
						if p.ArrivedPct >= 80 {
							ymax = math.Max(ymax, p.UnallocatedPct)
						}
					}
				}
				ymax = math.Ceil(ymax/5)*5 + 5
			}
			g := svgG{Transform: fmt.Sprintf("translate(%g,%g)", float64(pi)*(panelW+margin)+margin, top+margin)}
			sx := func(x float64) float64 { return (x - xmin) / (xmax - xmin) * panelW }
			sy := func(y float64) float64 { return panelH - (y-ymin)/(ymax-ymin)*panelH }
			g.Rects = append(g.Rects, svgRect{Width: panelW, Height: panelH, Fill: "none", Stroke: "#333"})
			title := wl
			if zoom {
				title += " (zoom)"
			}
			g.Texts = append(g.Texts, svgText{X: panelW / 2, Y: -12, Size: 14, Anchor: "middle", Text: title})
			for x := xmin; x <= xmax; x += 10 {
				g.Lines = append(g.Lines, svgLine{X1: sx(x), Y1: 0, X2: sx(x), Y2: panelH, Stroke: "#eee", Width: 1})
				g.Texts = append(g.Texts, svgText{X: sx(x), Y: panelH + 16, Size: 11, Anchor: "middle", Text: strconv.Itoa(int(x))})
			}
			ystep := 10.0
			if ymax-ymin <= 30 {
				ystep = 5
			}
			for y := ymin; y <= ymax; y += ystep {
				g.Lines = append(g.Lines, svgLine{X1: 0, Y1: sy(y), X2: panelW, Y2: sy(y), Stroke: "#eee", Width: 1})
				g.Texts = append(g.Texts, svgText{X: -6, Y: sy(y) + 4, Size: 11, Anchor: "end", Text: strconv.Itoa(int(y))})
			}
			g.Texts = append(g.Texts,
				svgText{X: panelW / 2, Y: panelH + 34, Size: 12, Anchor: "middle", Text: "arrived workload (% of GPU capacity)"},
				svgText{X: -40, Y: -4, Size: 12, Text: "unallocated GPU %"})
			for i, s := range ss {
				var pts []string
				for _, p := range s.Curve {
					x := float64(p.ArrivedPct)
					if x < xmin || x > xmax {
						continue
					}
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", sx(x), sy(math.Min(math.Max(p.UnallocatedPct, ymin), ymax))))
				}
				color := policyColor(i, s.Policy)
				g.Polylines = append(g.Polylines, svgPoly{Points: strings.Join(pts, " "), Stroke: color, Width: 1.8, Fill: "none"})
				ly := 16 + float64(i)*16
				g.Lines = append(g.Lines, svgLine{X1: panelW - 170, Y1: ly - 4, X2: panelW - 150, Y2: ly - 4, Stroke: color, Width: 2.5})
				label := s.Policy
				if p, ok := At(s.Curve, 100); ok {
					label = fmt.Sprintf("%s (%.2f%% @100)", s.Policy, p.UnallocatedPct)
				}
				g.Texts = append(g.Texts, svgText{X: panelW - 145, Y: ly, Size: 11, Fill: color, Text: label})
			}
			doc.Groups = append(doc.Groups, g)
		}
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return fmt.Errorf("write svg: %w", err)
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", " ")
	if err := enc.Encode(doc); err != nil {
		return fmt.Errorf("write svg: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("write svg: %w", err)
	}
	return nil
}
