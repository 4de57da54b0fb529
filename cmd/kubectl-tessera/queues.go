package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/tessera-gpu/tessera/api"
	"github.com/tessera-gpu/tessera/extender"
)

// queueRow is one Queue as the queues table shows it.
type queueRow struct {
	spec   *api.Queue
	status api.QueueStatus
	err    error
}

// queues prints every Queue's spec and the status the extender wrote.
func (e *env) queues(ctx context.Context, w io.Writer) error {
	rows, err := e.readQueues(ctx)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "No Queue (queues.tessera.dev) is defined.")
		return err
	}
	// The share that orders the queues needs the usage half-life, which
	// only the extender knows: ask it.
	shares, note := map[string]float64(nil), "SHARE orders the queues (recent and current use over the entitlement, smaller first): "
	if e.ext == nil {
		note += "not asked (--extender=none)"
	} else {
		var views []extender.QueueView
		if err := e.ext.Get(ctx, extender.StatusQueuesPath, &views); err != nil {
			note += fmt.Sprintf("unknown, %v", err)
		} else {
			shares = map[string]float64{}
			for _, v := range views {
				shares[v.Name] = v.Share
			}
			note += "from tessera-extender at " + e.ext.Where()
		}
	}
	return renderQueues(w, rows, shares, note, e.now())
}

func (e *env) readQueues(ctx context.Context) ([]queueRow, error) {
	list, err := e.dyn.Resource(api.QueueGVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading queues.tessera.dev from the API server %s: %w (is the Queue CRD of deploy/crds installed?)", e.server, err)
		}
		return nil, e.apiErr("queues.tessera.dev", err)
	}
	rows := make([]queueRow, 0, len(list.Items))
	for i := range list.Items {
		rows = append(rows, queueRowOf(&list.Items[i]))
	}
	slices.SortFunc(rows, func(a, b queueRow) int { return strings.Compare(a.spec.Name, b.spec.Name) })
	return rows, nil
}

func queueRowOf(u *unstructured.Unstructured) queueRow {
	r := queueRow{spec: &api.Queue{Name: u.GetName()}}
	if q, err := api.QueueFromUnstructured(u); err != nil {
		r.err = err
	} else {
		r.spec = q
	}
	st, err := api.QueueStatusFromUnstructured(u)
	if err != nil && r.err == nil {
		r.err = err
	}
	r.status = st
	return r
}

// queueResources are the resources shown, in order (governedResources):
// those a row's spec names or its status counts.
func queueResources(rows []queueRow) []corev1.ResourceName {
	var seen []corev1.ResourceName
	for _, row := range rows {
		seen = append(seen, slices.Collect(maps.Keys(row.spec.Resources))...)
		seen = append(seen, slices.Collect(maps.Keys(row.status.Used))...)
		seen = append(seen, slices.Collect(maps.Keys(row.status.FairShare))...)
	}
	var out []corev1.ResourceName
	for _, r := range governedResources(seen) {
		for _, row := range rows {
			_, spec := row.spec.Resources[r]
			if spec || row.status.Used[r] != 0 || row.status.FairShare[r] != 0 {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// governedResources is the order resources are shown in: api.QuotaResources,
// then the MIG profiles' resources among seen, by name (quotas and queues
// govern both, api.QuotaGoverned).
func governedResources(seen []corev1.ResourceName) []corev1.ResourceName {
	mig := slices.DeleteFunc(slices.Clone(seen), func(r corev1.ResourceName) bool { return !api.IsMIGResource(r) })
	slices.Sort(mig)
	return append(api.QuotaResources(), slices.Compact(mig)...)
}

func renderQueues(w io.Writer, rows []queueRow, shares map[string]float64, note string, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tSHARE\tPARENT\tNAMESPACES\tRESOURCE\tGUARANTEED\tLIMIT\tWEIGHT\tUSED\tFAIR SHARE\tUSED/FAIR\tBORROWING\tUSAGE (DAYS)\tSTATUS AGE")
	res := queueResources(rows)
	for _, row := range rows {
		q, st := row.spec, row.status
		age := "never written"
		if !st.UsageUpdated.IsZero() {
			age = now.Sub(st.UsageUpdated).Round(time.Second).String()
		}
		first := true
		cols := func(r string) []string {
			if !first {
				return []string{"", "", "", "", r}
			}
			first = false
			ns := strings.Join(q.Namespaces, ",")
			if ns == "" {
				ns = "-"
			}
			parent := q.Parent
			if parent == "" {
				parent = "-"
			}
			sh := "-"
			if v, ok := shares[q.Name]; ok {
				sh = fmt.Sprintf("%.2f", v)
			}
			return []string{q.Name, sh, parent, ns, r}
		}
		if row.err != nil {
			fmt.Fprintf(tw, "%s\tinvalid: %v\n", strings.Join(cols("-"), "\t"), row.err)
			continue
		}
		shown := 0
		for _, r := range res {
			spec, named := q.Resources[r]
			if !named && st.Used[r] == 0 && st.FairShare[r] == 0 {
				continue
			}
			shown++
			rr := q.Resource(r)
			limit := "-"
			if rr.Limited {
				limit = strconv.FormatInt(rr.Limit, 10)
			}
			guaranteed := st.Guaranteed[r]
			if _, ok := st.Guaranteed[r]; !ok {
				guaranteed = spec.Guaranteed
			}
			borrowing := "no"
			if b := st.Used[r] - guaranteed; b > 0 {
				borrowing = fmt.Sprintf("yes (+%d)", b)
			}
			c := append(cols(shortResource(r)), fmt.Sprint(guaranteed), limit, fmt.Sprint(rr.Weight), fmt.Sprint(st.Used[r]),
				fmt.Sprint(st.FairShare[r]), share(st.Used[r], st.FairShare[r]), borrowing, usageDays(st.Usage[r]), age)
			fmt.Fprintln(tw, strings.Join(c, "\t"))
			age = ""
		}
		if shown == 0 {
			fmt.Fprintln(tw, strings.Join(append(cols("-"), "0", "-", "1", "0", "0", "-", "no", "0", age), "\t"))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\n"+note+";\n"+
		"USED/FAIR above 1: the queue runs more than its fair share (reclaimed from first); USAGE is the decayed usage\n"+
		"history in resource-days (units x 24 h); the other columns are the Queue's spec and the status the extender wrote.")
	return err
}

func shortResource(r corev1.ResourceName) string {
	return strings.TrimPrefix(string(r), api.Domain+"/")
}

func share(used, fair int64) string {
	switch {
	case fair > 0:
		return fmt.Sprintf("%.2f", float64(used)/float64(fair))
	case used > 0:
		return "inf"
	}
	return "-"
}

func usageDays(resourceSeconds float64) string {
	if resourceSeconds == 0 || math.IsNaN(resourceSeconds) {
		return "0"
	}
	return fmt.Sprintf("%.2f", resourceSeconds/86400)
}
