// Command timings keeps the measured table of hack/lab/README.md true: the
// table is rendered from runs.tsv, the lab's own records of real runs, and
// never typed by hand.
//
//	go run ./hack/lab/timings [-add hack/lab/out/timings.tsv]
//
// Every `make lab`, `make e2e` and `make soak` appends one line to
// hack/lab/out/timings.tsv (hack/lab/run.sh: record). -add copies the
// lines runs.tsv does not have yet into it; then the table between the
// README's timings markers is rendered again from runs.tsv. `make
// lab-timings` does both. TestREADMETableIsRendered fails when the README
// and runs.tsv disagree.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Columns of a run line, as hack/lab/run.sh writes them.
const (
	colDate = iota
	colCommand
	colRun
	colImage
	colGoCache
	colBuild
	colGuest
	colTotal
	colResult
	colTests
	colSlowest
	colKernel
	colCores
	colMem
	// Columns added later; older lines end at colMem.
	colLoad    // the host's mean 1-minute load average, ", N burners" under hack/lab/underload.sh
	colRetries // retries the run needed (e2e: each a finding)
	colWaitMin // the smallest ratio of a wait's limit to the time it took
	numCols
	oldCols = colLoad
)

const (
	beginMarker = "<!-- timings: rendered by `make lab-timings` from hack/lab/timings/runs.tsv; do not edit -->"
	endMarker   = "<!-- end of timings -->"
)

// run is one recorded lab or e2e run.
type run struct {
	fields []string
	total  int
	tests  map[string]float64 // e2e: top-level test → seconds
}

func parseRuns(data string) ([]run, error) {
	var runs []run
	sc := bufio.NewScanner(strings.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, "\t")
		switch len(f) {
		case numCols:
		case oldCols:
			f = append(f, "-", "-", "-")
		default:
			return nil, fmt.Errorf("line %d: %d fields, want %d (or %d)", n, len(f), numCols, oldCols)
		}
		total, err := strconv.Atoi(f[colTotal])
		if err != nil {
			return nil, fmt.Errorf("line %d: total %q: %v", n, f[colTotal], err)
		}
		r := run{fields: f, total: total, tests: map[string]float64{}}
		if f[colSlowest] != "-" && f[colSlowest] != "" {
			for _, kv := range strings.Split(f[colSlowest], ",") {
				name, secs, ok := strings.Cut(kv, "=")
				v, err := strconv.ParseFloat(secs, 64)
				if !ok || err != nil {
					return nil, fmt.Errorf("line %d: test time %q", n, kv)
				}
				r.tests[name] = v
			}
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

// group is the runs of one row of the table.
type group struct {
	label string
	runs  []run
}

func (g group) span() string {
	lo, hi := g.runs[0].total, g.runs[0].total
	for _, r := range g.runs {
		lo, hi = min(lo, r.total), max(hi, r.total)
	}
	if lo == hi {
		return human(lo)
	}
	return human(lo) + "–" + human(hi)
}

// label is how a run is named in the table: its make command, marked
// when CPU burners ran beside it (make e2e-under-load).
func label(r run) string {
	if burners(r) {
		return strings.TrimSuffix(plainLabel(r), "`") + "` under load"
	}
	return plainLabel(r)
}

func burners(r run) bool { return strings.Contains(r.fields[colLoad], "burners") }

func plainLabel(r run) string {
	switch {
	case r.fields[colCommand] == "e2e" && r.fields[colRun] != ".":
		return "`make e2e E2E_RUN='" + r.fields[colRun] + "'`"
	case r.fields[colCommand] == "soak" && r.fields[colRun] != "-":
		return "`make soak " + r.fields[colRun] + "`"
	}
	return "`make " + r.fields[colCommand] + "`"
}

// cell escapes the pipes of a -test.run regexp for a Markdown table.
func cell(s string) string { return strings.ReplaceAll(s, "|", `\|`) }

func human(s int) string {
	if s < 120 {
		return fmt.Sprintf("%d s", s)
	}
	return fmt.Sprintf("%.1f min", float64(s)/60)
}

// render is the README section (markers included) for runs: one row per
// kind of run, each with how many runs it covers and the spread of their
// totals; for e2e runs the tests and the slowest of each test's runs.
func render(runs []run) string {
	var b strings.Builder
	b.WriteString(beginMarker + "\n\n")
	if len(runs) == 0 {
		b.WriteString("No run recorded yet.\n\n" + endMarker)
		return b.String()
	}
	machines := map[string]bool{}
	for _, r := range runs {
		machines[fmt.Sprintf("%s cores, %s of memory, guest kernel %s", r.fields[colCores], r.fields[colMem], r.fields[colKernel])] = true
	}
	b.WriteString("Recorded by the lab itself (`hack/lab/out/timings.tsv`, one line per run) on " +
		strings.Join(sortedKeys(machines), "; ") + "; TCG. Wall-clock seconds of the whole command.\n\n")
	b.WriteString("| run | image | Go build cache | runs | time | notes |\n| --- | --- | --- | --- | --- | --- |\n")

	groups := map[string]*group{}
	var order []string
	for _, r := range runs {
		if r.fields[colResult] != "pass" {
			continue
		}
		image := r.fields[colImage]
		if strings.HasPrefix(image, "built") {
			image = "built"
		}
		key := label(r) + "\t" + image + "\t" + r.fields[colGoCache]
		if groups[key] == nil {
			groups[key] = &group{label: key}
			order = append(order, key)
		}
		groups[key].runs = append(groups[key].runs, r)
	}
	sort.Strings(order)
	for _, k := range order {
		g := groups[k]
		f := strings.Split(k, "\t")
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s |\n", cell(f[0]), f[1], f[2], len(g.runs), g.span(), cell(notes(*g)))
	}
	var failed []string
	for _, r := range runs {
		if r.fields[colResult] == "pass" {
			continue
		}
		line := fmt.Sprintf("- %s, %s: failed after %s", label(r), r.fields[colDate][:10], human(r.total))
		if t := r.fields[colTests]; t != "-" && r.fields[colCommand] != "soak" {
			line += " (tests passed/failed/skipped " + t + ")"
		}
		if n := notes(group{runs: []run{r}}); n != "" {
			line += "; " + n
		}
		failed = append(failed, line)
	}
	if len(failed) > 0 {
		b.WriteString("\nRuns that failed, left out of the table above (their times still count):\n\n" + strings.Join(failed, "\n") + "\n")
	}
	b.WriteString("\n" + endMarker)
	return b.String()
}

// notes says what a group's runs built and, for e2e, which tests ran and
// the slowest time each took over the group's runs.
func notes(g group) string {
	return strings.Join(append(runNotes(g), loadNotes(g)...), "; ")
}

// loadNotes gives the host's load during the group's runs, the retries
// they needed and how close a wait came to its limit.
func loadNotes(g group) []string {
	var loads, retries []string
	minRatio := 0.0
	for _, r := range g.runs {
		if l := r.fields[colLoad]; l != "-" {
			loads = append(loads, strings.SplitN(l, ",", 2)[0])
		}
		if x := r.fields[colRetries]; x != "-" {
			retries = append(retries, x)
		}
		if v, err := strconv.ParseFloat(r.fields[colWaitMin], 64); err == nil && (minRatio == 0 || v < minRatio) {
			minRatio = v
		}
	}
	var parts []string
	if len(loads) > 0 {
		l := "host load " + strings.Join(loads, ", ")
		if burners(g.runs[0]) {
			l += " (" + strings.TrimSpace(strings.SplitN(g.runs[0].fields[colLoad], ",", 2)[1]) + " at normal priority)"
		}
		parts = append(parts, l)
	}
	if len(retries) > 0 {
		parts = append(parts, "retries "+strings.Join(retries, ", "))
	}
	if minRatio > 0 {
		parts = append(parts, fmt.Sprintf("closest wait 1/%.1f of its limit", minRatio))
	}
	return parts
}

func runNotes(g group) []string {
	var parts []string
	var builds []string
	for _, r := range g.runs {
		if strings.HasPrefix(r.fields[colImage], "built") {
			builds = append(builds, strings.TrimPrefix(r.fields[colImage], "built "))
		}
	}
	if len(builds) > 0 {
		parts = append(parts, "image build "+strings.Join(builds, ", "))
	}
	switch g.runs[0].fields[colCommand] {
	case "soak":
		return append(parts, soakNotes(g)...)
	case "kubelet-lab":
		return append(parts, kubeletNotes(g)...)
	case "e2e":
	default:
		return parts
	}
	slowest := map[string]float64{}
	for _, r := range g.runs {
		for name, s := range r.tests {
			slowest[name] = max(slowest[name], s)
		}
	}
	names := sortedKeys(slowest)
	sort.SliceStable(names, func(i, j int) bool { return slowest[names[i]] > slowest[names[j]] })
	parts = append(parts, fmt.Sprintf("%d tests", len(names)))
	var top []string
	for i, n := range names {
		if i == 3 {
			break
		}
		top = append(top, fmt.Sprintf("%s %.0f s", n, slowest[n]))
	}
	if len(top) > 0 {
		parts = append(parts, "slowest (max over the runs): "+strings.Join(top, ", "))
	}
	return parts
}

// soakNotes: a soak run records its faults done/skipped/failed where an
// e2e run has its test counts, and each fault kind's longest heal latency
// (fault undone until every path of its volumes was live) where an e2e
// run has its tests' times.
func soakNotes(g group) []string {
	var parts []string
	var faults []string
	for _, r := range g.runs {
		if t := r.fields[colTests]; t != "-" {
			faults = append(faults, t)
		}
	}
	if len(faults) > 0 {
		parts = append(parts, "faults done/skipped/failed "+strings.Join(faults, ", "))
	}
	longest := map[string]float64{}
	for _, r := range g.runs {
		for kind, s := range r.tests {
			longest[kind] = max(longest[kind], s)
		}
	}
	var kinds []string
	for _, k := range sortedKeys(longest) {
		kinds = append(kinds, fmt.Sprintf("%s %.0f s", k, longest[k]))
	}
	if len(kinds) > 0 {
		parts = append(parts, "longest heal (fault undone → every path live) per kind: "+strings.Join(kinds, ", "))
	}
	return parts
}

// kubeletNotes: a kubelet lab run records its three longest steps where
// an e2e run has its tests' times.
func kubeletNotes(g group) []string {
	longest := map[string]float64{}
	for _, r := range g.runs {
		for step, s := range r.tests {
			longest[step] = max(longest[step], s)
		}
	}
	names := sortedKeys(longest)
	sort.SliceStable(names, func(i, j int) bool { return longest[names[i]] > longest[names[j]] })
	var top []string
	for i, n := range names {
		if i == 3 {
			break
		}
		top = append(top, fmt.Sprintf("%s %.0f s", n, longest[n]))
	}
	if len(top) == 0 {
		return nil
	}
	return []string{"longest steps (max over the runs): " + strings.Join(top, "; ")}
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// replaceSection puts section in place of the README's marked one.
func replaceSection(readme, section string) (string, error) {
	i := strings.Index(readme, beginMarker)
	j := strings.Index(readme, endMarker)
	if i < 0 || j < i {
		return "", fmt.Errorf("README has no %q … %q section", beginMarker, endMarker)
	}
	return readme[:i] + section + readme[j+len(endMarker):], nil
}

// addNew appends the lines of add that runs does not hold yet.
func addNew(runsData, add string) string {
	have := map[string]bool{}
	for _, l := range strings.Split(runsData, "\n") {
		have[l] = true
	}
	out := runsData
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	for _, l := range strings.Split(add, "\n") {
		if l != "" && !have[l] {
			out += l + "\n"
			have[l] = true
		}
	}
	return out
}

func main() {
	dir := flag.String("dir", "hack/lab", "the lab directory (README.md, timings/runs.tsv)")
	add := flag.String("add", "", "a timings.tsv whose new lines are added to runs.tsv first")
	flag.Parse()
	if err := update(*dir, *add); err != nil {
		fmt.Fprintln(os.Stderr, "timings:", err)
		os.Exit(1)
	}
}

func update(dir, add string) error {
	runsPath, readmePath := dir+"/timings/runs.tsv", dir+"/README.md"
	data, err := os.ReadFile(runsPath)
	if err != nil {
		return err
	}
	if add != "" {
		extra, err := os.ReadFile(add)
		if err != nil {
			return err
		}
		data = []byte(addNew(string(data), string(extra)))
		if err := os.WriteFile(runsPath, data, 0o644); err != nil {
			return err
		}
	}
	runs, err := parseRuns(string(data))
	if err != nil {
		return fmt.Errorf("%s: %w", runsPath, err)
	}
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	out, err := replaceSection(string(readme), render(runs))
	if err != nil {
		return err
	}
	return os.WriteFile(readmePath, []byte(out), 0o644)
}
