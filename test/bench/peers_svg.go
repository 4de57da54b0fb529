package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"
)

// systemColor is each system's colour in the plot.
var systemColor = map[string]string{
	sysKube:    "#8c8c8c",
	sysTessera: "#1f77b4",
	sysPlugin:  "#9467bd",
	sysHAMi:    "#ff7f0e",
	sysSP:      "#2ca02c",
}

// peersSVG draws the results as two bar charts side by side: pods/s per
// node count and workload (whole, mixed), and the mean gang bind latency
// per node count. One bar per system; a missing bar is a workload the
// system does not run, or a run that failed ("failed" is written there).
func peersSVG(c *config, results []peerResult) string {
	type key struct {
		nodes            int
		system, workload string
		members          int // gang
	}
	byKey := map[key]peerResult{}
	for _, r := range results {
		if r.workload != "" {
			byKey[key{r.nodes, r.system, r.workload, r.gangMembers}] = r
		}
	}
	systems := c.peers.systems
	var rateGroups, gangGroups []key // system empty: a group of bars
	for _, n := range c.nodes {
		for _, wl := range c.peers.workloads {
			if wl == wlTrace {
				continue // a table only (reportTrace)
			}
			if wl == wlGang {
				for _, m := range c.peers.gangMembers {
					gangGroups = append(gangGroups, key{nodes: n, workload: wl, members: m})
				}
			} else {
				rateGroups = append(rateGroups, key{nodes: n, workload: wl})
			}
		}
	}

	const (
		panelH  = 300.0
		top     = 60.0
		left    = 60.0
		barW    = 16.0
		groupGp = 22.0
		gapP    = 90.0
	)
	groupW := float64(len(systems))*barW + groupGp
	rateW := math.Max(float64(len(rateGroups))*groupW, 300)
	gangW := math.Max(float64(len(gangGroups))*groupW, 340)
	width := left + rateW + gapP + gangW + 30
	height := top + panelH + 60 + 18*float64(len(systems)) + 10

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%.0f" y="20" font-size="14" font-weight="bold">The same GPU pods on fake 8-GPU nodes (%d pods per throughput run)</text>`+"\n", left, c.pods)

	panel := func(x0, w float64, title, unit string, groups []key, value func(key) (float64, bool, bool)) {
		maxV := 0.0
		for _, g := range groups {
			for _, s := range systems {
				if v, ok, _ := value(key{g.nodes, s, g.workload, g.members}); ok {
					maxV = math.Max(maxV, v)
				}
			}
		}
		maxV = niceCeil(maxV)
		y0 := top + panelH
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="12" font-weight="bold">%s</text>`+"\n", x0, top-12, html.EscapeString(title))
		for i := 0; i <= 4; i++ {
			v := maxV * float64(i) / 4
			y := y0 - panelH*float64(i)/4
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x0+w, y)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-4, y+4, trimFloat(v))
		}
		fmt.Fprintf(&b, `<text transform="translate(%.1f,%.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", x0-42, top+panelH/2, unit)
		for gi, g := range groups {
			gx := x0 + float64(gi)*groupW + groupGp/2
			for si, s := range systems {
				x := gx + float64(si)*barW
				v, ok, failed := value(key{g.nodes, s, g.workload, g.members})
				switch {
				case ok && maxV > 0:
					h := panelH * v / maxV
					fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %s, %d nodes: %s %s</title></rect>`+"\n",
						x, y0-h, barW-2, h, systemColor[s], html.EscapeString(systemLabel[s]), g.workload, g.nodes, trimFloat(v), unit)
					fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="9">%s</text>`+"\n", x+barW/2-1, y0-h-3, trimFloat(v))
				case failed:
					fmt.Fprintf(&b, `<text transform="translate(%.1f,%.1f) rotate(-90)" font-size="9" fill="#c00">failed</text>`+"\n", x+barW/2+2, y0-4)
				}
			}
			label := g.workload
			if g.workload == wlGang {
				label = fmt.Sprintf("%d x %d GPUs", g.members, c.peers.gangGPUs)
			}
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", gx+float64(len(systems))*barW/2, y0+14, label)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d nodes</text>`+"\n", gx+float64(len(systems))*barW/2, y0+27, g.nodes)
		}
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", x0, y0, x0+w, y0)
	}
	panel(left, rateW, "Throughput (higher is better)", "pods/s", rateGroups, func(k key) (float64, bool, bool) {
		r, ok := byKey[k]
		if !ok {
			return 0, false, false
		}
		if r.err != nil || r.res.pods == 0 {
			return 0, false, r.err != nil
		}
		return r.res.podsPerSecond(), true, false
	})
	panel(left+rateW+gapP, gangW, "Gangs: last created -> all bound (lower is better)", "seconds (mean)", gangGroups, func(k key) (float64, bool, bool) {
		r, ok := byKey[k]
		if !ok {
			return 0, false, false
		}
		if len(r.gangs) == 0 {
			return 0, false, r.err != nil
		}
		var sum time.Duration
		for _, d := range r.gangs {
			sum += d
		}
		return (sum / time.Duration(len(r.gangs))).Seconds(), true, false
	})
	ly := top + panelH + 50
	for i, s := range systems {
		x := left
		y := ly + float64(i)*18
		aon := ""
		if contains(c.peers.workloads, wlGang) && !allOrNothing(s) {
			aon = " (gangs not all-or-nothing)"
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="12" height="12" fill="%s"/><text x="%.1f" y="%.1f">%s%s</text>`+"\n",
			x, y-10, systemColor[s], x+16, y, html.EscapeString(systemLabel[s]), aon)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
