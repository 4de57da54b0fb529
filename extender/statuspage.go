package extender

import (
	"bytes"
	"embed"
	"fmt"
	"html/template"
	"net/http"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/tessera-gpu/tessera/allocator/quota"
	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/internal/gpustatus"
)

//go:embed statuspage.html.tmpl
var statusPageFS embed.FS

// statusPageRefresh is how often the page reloads itself.
const statusPageRefresh = 5 * time.Second

var statusPage = template.Must(template.New("statuspage.html.tmpl").Funcs(template.FuncMap{
	"pct":       func(used, total int64) int { return gpustatus.Cells(used, total) * 100 / gpustatus.BarWidth },
	"gib":       func(mib int64) string { return fmt.Sprintf("%.1f", float64(mib)/1024) },
	"model":     gpustatus.ShortModel,
	"join":      strings.Join,
	"resources": formatResources,
	"share":     func(f float64) string { return fmt.Sprintf("%.2f", f) },
	"age":       func(now, t time.Time) string { return now.Sub(t).Round(time.Second).String() },
}).ParseFS(statusPageFS, "statuspage.html.tmpl"))

// PageData is what the status page shows.
type PageData struct {
	Now       time.Time
	Refresh   int
	Occupancy *gpustatus.Cluster
	Queues    []QueueView
	Pending   []PendingPod
	// Reservations describe the planner's reservations, a line each
	// (gpustatus.ReservationLines, as kubectl tessera status).
	Reservations []string
}

// PageView gathers the page's views of snap at now.
func PageView(snap *Snapshot, now time.Time) *PageData {
	return &PageData{Now: now.UTC(), Refresh: int(statusPageRefresh / time.Second),
		Occupancy: OccupancyView(snap), Queues: QueuesView(snap), Pending: PendingView(snap, false),
		Reservations: gpustatus.ReservationLines(snap.Reservations, now)}
}

// RenderPage writes the status page of d.
func RenderPage(d *PageData) ([]byte, error) {
	var b bytes.Buffer
	if err := statusPage.Execute(&b, d); err != nil {
		return nil, fmt.Errorf("status page: %w", err)
	}
	return b.Bytes(), nil
}

func (s *Status) handlePage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	snap, err := s.Take(ctx)
	var page []byte
	if err == nil {
		page, err = RenderPage(PageView(snap, s.now()))
	}
	if err != nil {
		klog.FromContext(ctx).Info("Status page failed", "err", err)
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// No script, no external asset: the page only needs its own styles.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
	_, _ = w.Write(page)
}

// formatResources writes quota resources as "gpu=4, ..." in a fixed
// order, leaving out zeros ("-" when nothing is left).
func formatResources(r quota.Resources) string {
	if len(r) == 0 {
		return "-"
	}
	names := make([]string, 0, len(r))
	for n, v := range r {
		if v != 0 {
			names = append(names, string(n))
		}
	}
	if len(names) == 0 {
		return "-"
	}
	sort.Strings(names)
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s=%d", strings.TrimPrefix(n, api.Domain+"/"), r[corev1.ResourceName(n)]))
	}
	return strings.Join(parts, ", ")
}
