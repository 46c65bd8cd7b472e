package report

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
)

// JSON writes the report as one indented JSON document.
func (r Report) JSON(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(r)
}

// Text writes the report for a person: the verdict and its checks, the
// faults, heals and latencies, each volume's I/O, and on failure the
// seed and the timeline around each failure.
func (r Report) Text(w io.Writer) {
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "soak %s: seed %d, %s from %s (replay: SOAK_SEED=%d); %d retries\n\n", verdict, r.Seed,
		(time.Duration(r.Duration * float64(time.Second))).Round(time.Second), r.Start.UTC().Format(time.RFC3339), r.Seed, r.RetryCount)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "must be 0\tvalue")
	fmt.Fprintf(tw, "data mismatches\t%d\n", r.Checks.DataMismatches)
	fmt.Fprintf(tw, "teardowns of a live, healthy path\t%d\n", r.Checks.HealthyTeardowns)
	fmt.Fprintf(tw, "read-only remounts no outage explains\t%d\n", r.Checks.ReadOnlyUnexplained)
	fmt.Fprintf(tw, "orphaned kernel objects at the end\t%d\n", r.Checks.Orphans)
	tw.Flush()
	for _, f := range r.Failures {
		fmt.Fprintf(w, "  FAILED: %s\n", f)
	}
	if len(r.Retries) > 0 {
		fmt.Fprintf(w, "\nretries (each made again, with its cause)\n")
		for _, x := range r.Retries {
			fmt.Fprintf(w, "  %s\n", x)
		}
	}

	fmt.Fprintln(w, "\nfaults injected")
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "kind\tdone\tskipped\tfailed\theal latency p50\tp99\tmax\tnot healed")
	for _, k := range sortedKeys(r.Faults) {
		l, ok := r.HealLatency[k]
		lat := "\t\t\t"
		if ok {
			lat = fmt.Sprintf("%s\t%s\t%s\t%d", secs(l.P50, l.N), secs(l.P99, l.N), secs(l.Max, l.N), l.Unhealed)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\n", k, r.Faults[k]["done"], r.Faults[k]["skipped"], r.Faults[k]["failed"], lat)
	}
	tw.Flush()
	fmt.Fprintln(w, "  (heal latency: from the fault undone — a single action: done; a stuck session: stuck — until every path of every volume it touched is live)")

	fmt.Fprintln(w, "\npathmend's heals")
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "kind\tverdicts")
	for _, k := range sortedKeys(r.Heals) {
		var parts []string
		for _, v := range sortedKeys(r.Heals[k]) {
			parts = append(parts, fmt.Sprintf("%s %d", v, r.Heals[k][v]))
		}
		fmt.Fprintf(tw, "%s\t%s\n", k, strings.Join(parts, ", "))
	}
	tw.Flush()
	if r.Bounced > 0 {
		fmt.Fprintf(w, "  healthy sessions bounced by an iscsid restart: %d\n", r.Bounced)
	}

	fmt.Fprintln(w, "\nvolumes")
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "volume\twrites\treads\twrite errors\tread errors\tmismatches\tundefined\tstalls\tslowest op\tevery path down")
	for _, v := range r.Volumes {
		var down time.Duration
		for _, s := range v.AllDown {
			down += s.Len(r.Start.Add(time.Duration(r.Duration * float64(time.Second))))
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%.1fs\t%d× %s\n", v.ID, v.Writes, v.Reads, v.WriteErrors, v.ReadErrors,
			v.Mismatches, v.Undefined, v.Stalls, v.SlowestOp, len(v.AllDown), down.Round(100*time.Millisecond))
	}
	tw.Flush()
	for _, v := range r.Volumes {
		for _, x := range v.ErrorWindows {
			faults := "no fault on its paths"
			if len(x.Faults) > 0 {
				faults = strings.Join(x.Faults, ", ")
			}
			down := ""
			if x.AllDown {
				down = ", every path down"
			}
			fmt.Fprintf(w, "  %s I/O errors %s–%s (%d; first: %s) during %s%s\n", v.ID, x.From.Format("15:04:05.0"), x.To.Format("15:04:05.0"), x.Errors, x.First, faults, down)
		}
		for _, f := range v.Findings {
			fmt.Fprintf(w, "  %s %s block %d: %s\n", v.ID, f.At.Format("15:04:05.000"), f.Block, f.Detail)
		}
		for _, x := range v.Verifications {
			e := ""
			if x.Err != "" {
				e = ", " + x.Err
			}
			fmt.Fprintf(w, "  %s verified %s (%s): %d blocks, %d mismatched, %d undefined%s\n", v.ID, x.At.Format("15:04:05"), x.Why, x.Blocks, x.Mismatched, x.Undefined, e)
		}
		for _, rp := range v.Replaced {
			fmt.Fprintf(w, "  %s device replaced %s: %s → %s\n", v.ID, rp.At.Format("15:04:05.0"), rp.From, rp.To)
		}
	}
	for _, ro := range r.ReadOnly {
		fmt.Fprintf(w, "  read-only: %s at %s (%s): every path down up to %.0fs, window %.0fs, explained %v\n", ro.Volume, ro.At.Format("15:04:05.0"), ro.Source, ro.AllDown, ro.Window, ro.Explained)
	}
	for _, td := range r.Unverifiable {
		fmt.Fprintf(w, "  teardown not judged (a fault hit its path between the samples): %s %s, last seen healthy %s%s\n", td.Object.Name, td.Object.Endpoint, td.LastSeen.Format("15:04:05.000"), suffix(td.Verdict))
	}
	fmt.Fprintf(w, "\nobserver: %d samples, longest gap %.1fs\n", r.Samples, r.MaxGap)

	if !r.Pass {
		fmt.Fprintf(w, "\nseed %d; the timeline around each failure:\n", r.Seed)
		for _, at := range r.failureTimes() {
			fmt.Fprintf(w, "--- around %s\n", at.Format("15:04:05.000"))
			for _, e := range r.Timeline {
				if d := e.At.Sub(at); d >= -60*time.Second && d <= 20*time.Second {
					fmt.Fprintf(w, "  %s %s\n", e.At.Format("15:04:05.000"), e.What)
				}
			}
		}
	}
}

// FullTimeline writes every event of the run.
func (r Report) FullTimeline(w io.Writer) {
	for _, e := range r.Timeline {
		fmt.Fprintf(w, "%s %s\n", e.At.Format("15:04:05.000"), e.What)
	}
}

// failureTimes are the moments the timeline is shown around.
func (r Report) failureTimes() []time.Time {
	var ts []time.Time
	for _, td := range r.Teardowns {
		ts = append(ts, td.NotSeen)
	}
	for _, ro := range r.ReadOnly {
		if !ro.Explained {
			ts = append(ts, ro.At)
		}
	}
	for _, v := range r.Volumes {
		for _, f := range v.Findings {
			ts = append(ts, f.At)
			break
		}
	}
	if len(r.Orphans) > 0 {
		ts = append(ts, r.Start.Add(time.Duration(r.Duration*float64(time.Second))))
	}
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	return slices.CompactFunc(ts, func(a, b time.Time) bool { return b.Sub(a) < 30*time.Second })
}

func secs(s float64, n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fs", s)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
