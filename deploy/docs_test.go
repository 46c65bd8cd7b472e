package deploy

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/volume"
)

// installDocs are the pages that describe these manifests.
var installDocs = []string{"../docs/install.md", "../docs/operations.md", "../docs/security.md", "README.md"}

func readDoc(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var mdLink = regexp.MustCompile(`\]\(([^)\s]*)\)`)

// TestDocs_LinksResolve: every relative link of the install docs names a
// file that exists and, with a fragment, a heading in it.
func TestDocs_LinksResolve(t *testing.T) {
	for _, doc := range installDocs {
		for _, m := range mdLink.FindAllStringSubmatch(readDoc(t, doc), -1) {
			link := m[1]
			if strings.Contains(link, "://") {
				continue
			}
			file, frag, _ := strings.Cut(link, "#")
			target := doc
			if file != "" {
				target = filepath.Join(filepath.Dir(doc), file)
			}
			fi, err := os.Stat(target)
			if err != nil {
				t.Errorf("%s: link %s: %v", doc, link, err)
				continue
			}
			if frag != "" && !fi.IsDir() && !headingAnchors(readDoc(t, target))[frag] {
				t.Errorf("%s: link %s: no heading #%s in %s", doc, link, frag, target)
			}
		}
	}
}

// versionRefs finds the places where docs and manifests name pathmend's
// own release: the image tag and the version pathmend logs (the tags a
// doc names are TestVersion_DocsNameOnlyReleasedTags's).
var versionRefs = regexp.MustCompile(`(?:pathmend/pathmend:|version=")(v\d+\.\d+\.\d+)`)

// TestDocs_NameTheVersionRelease: every mention of a pathmend release in
// the install docs and under deploy/ is deploy/VERSION.
func TestDocs_NameTheVersionRelease(t *testing.T) {
	version := readVersion(t)
	files := slices.Clone(installDocs)
	files = append(files, manifestFiles(t)...)
	found := 0
	for _, f := range files {
		for _, m := range versionRefs.FindAllStringSubmatch(readDoc(t, f), -1) {
			found++
			if m[1] != version {
				t.Errorf("%s: %q names %s, deploy/VERSION is %s", f, m[0], m[1], version)
			}
		}
	}
	if found == 0 {
		t.Error("no release named anywhere; the pattern is stale")
	}
}

// TestDocs_SidecarVersionsAreTheManifests: install.md names the sidecar
// releases the DaemonSet runs.
func TestDocs_SidecarVersionsAreTheManifests(t *testing.T) {
	install := readDoc(t, "../docs/install.md")
	in := loadInstall(t, "base")
	for _, name := range []string{registrarContainer, livenessContainer} {
		img := in.container(t, name).Image
		tag := img[strings.LastIndex(img, ":")+1:]
		if !strings.Contains(install, name+"` "+tag) {
			t.Errorf("docs/install.md does not name %s %s", name, tag)
		}
	}
}

var (
	shellOverlay = regexp.MustCompile(`kubectl (?:apply|delete) -k [^\n]*?deploy/(overlays/[a-z]+)`)
	exampleFile  = regexp.MustCompile(`deploy/examples/([a-z0-9-]+\.yaml)`)
)

// TestDocs_CommandsNameExistingManifests: the overlays and example files
// the docs tell people to apply exist.
func TestDocs_CommandsNameExistingManifests(t *testing.T) {
	for _, doc := range installDocs {
		text := readDoc(t, doc)
		for _, m := range shellOverlay.FindAllStringSubmatch(text, -1) {
			if _, ok := installs[m[1]]; !ok {
				t.Errorf("%s: %q: no such overlay", doc, m[0])
			}
		}
		for _, m := range exampleFile.FindAllStringSubmatch(text, -1) {
			if _, err := os.Stat(filepath.Join("examples", m[1])); err != nil {
				t.Errorf("%s: %s: %v", doc, m[0], err)
			}
		}
	}
}

// tableRows returns the cells of the Markdown table rows under a heading
// (up to the next heading of any level), header and separator excluded.
func tableRows(t *testing.T, md, heading string) [][]string {
	t.Helper()
	_, rest, ok := strings.Cut(md, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no heading %q", heading)
	}
	var rows [][]string
	for i, line := range strings.Split(rest, "\n") {
		if strings.HasPrefix(line, "#") && i > 0 {
			break
		}
		if !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "| ---") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), " | ") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		t.Fatalf("no table under %q", heading)
	}
	return rows[1:]
}

var backticked = regexp.MustCompile("`([^`]+)`")

// TestDocs_OperationsListsEveryMetric: the metrics table of
// docs/operations.md lists exactly the metrics pkg/metrics registers, with
// their labels.
func TestDocs_OperationsListsEveryMetric(t *testing.T) {
	fams := pathmendMetrics(t)
	listed := map[string]bool{}
	for _, row := range tableRows(t, readDoc(t, "../docs/operations.md"), "## Metrics") {
		name := strings.Trim(row[0], "`")
		listed[name] = true
		f, ok := fams[name]
		if !ok {
			t.Errorf("operations.md lists %s, which pathmend does not export", name)
			continue
		}
		var got []string
		for _, m := range backticked.FindAllStringSubmatch(row[2], -1) {
			got = append(got, m[1])
		}
		slices.Sort(got)
		if want := slices.Sorted(maps.Keys(f.labels)); !slices.Equal(got, want) {
			t.Errorf("operations.md: %s labels %v, pathmend's %v", name, got, want)
		}
		if !strings.EqualFold(row[1], f.typ) {
			t.Errorf("operations.md: %s is a %s, not a %s", name, strings.ToLower(f.typ), row[1])
		}
	}
	for name, f := range fams {
		if name == f.name && !listed[name] {
			t.Errorf("operations.md does not list %s", name)
		}
	}
}

// TestDocs_OperationsListsEveryAlert: the alerts table names every alert
// of the example rules, with its severity.
func TestDocs_OperationsListsEveryAlert(t *testing.T) {
	rows := map[string][]string{}
	for _, row := range tableRows(t, readDoc(t, "../docs/operations.md"), "## Alerts") {
		rows[strings.Trim(row[0], "`")] = row
	}
	n := 0
	for _, g := range loadAlerts(t).Spec.Groups {
		for _, r := range g.Rules {
			n++
			row, ok := rows[r.Alert]
			if !ok {
				t.Errorf("operations.md does not list alert %s", r.Alert)
				continue
			}
			if row[1] != r.Labels["severity"] {
				t.Errorf("operations.md: %s severity %s, the rule says %s", r.Alert, row[1], r.Labels["severity"])
			}
		}
	}
	if len(rows) != n {
		t.Errorf("operations.md lists %d alerts, the rules hold %d", len(rows), n)
	}
}

// TestDocs_OperationsVolumeContextTable: the short key table of
// docs/operations.md agrees with volume.Keys on every key, its transport,
// whether it is required and whether it is a secret.
func TestDocs_OperationsVolumeContextTable(t *testing.T) {
	docs := map[string]volume.KeyDoc{}
	for _, k := range volume.Keys() {
		docs[k.Key] = k
	}
	seen := map[string]bool{}
	for _, row := range tableRows(t, readDoc(t, "../docs/operations.md"), "## Volume context") {
		for _, m := range backticked.FindAllStringSubmatch(row[0], -1) {
			key := m[1]
			seen[key] = true
			k, ok := docs[key]
			if !ok {
				t.Errorf("operations.md lists %s, which is not a volume-context key", key)
				continue
			}
			transport := string(k.Transport)
			if transport == "" {
				transport = "all"
			}
			required := map[bool]string{true: "yes", false: "no"}[k.Required]
			if row[2] == "one of them" {
				required = row[2] // nsid, nguid, uuid: at least one, none alone
			}
			secret := map[bool]string{true: "yes", false: "no"}[k.Secret]
			if got := []string{row[1], row[2], row[3]}; !slices.Equal(got, []string{transport, required, secret}) {
				t.Errorf("operations.md: %s is %v, volume.Keys says transport %s, required %s, secret %s", key, got, transport, required, secret)
			}
		}
	}
	for key := range docs {
		if !seen[key] {
			t.Errorf("operations.md does not list %s", key)
		}
	}
}

// TestDocs_ReasonClassesAreTheCode: the reason classes table of
// docs/metrics.md is heal.Classes() (which pkg/heal's tests pin to the
// Class constants in its source), in order, with each meaning; and
// docs/operations.md names every class.
func TestDocs_ReasonClassesAreTheCode(t *testing.T) {
	var got, want [][2]string
	for _, row := range tableRows(t, readDoc(t, "../docs/metrics.md"), "## Reason classes") {
		got = append(got, [2]string{strings.Trim(row[0], "`"), row[1]})
	}
	ops := readDoc(t, "../docs/operations.md")
	for _, c := range heal.Classes() {
		want = append(want, [2]string{string(c), c.Meaning()})
		if !strings.Contains(ops, "`"+string(c)+"`") {
			t.Errorf("operations.md does not name the reason class %s", c)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("metrics.md reason classes (-code +doc):\n%s", diff)
	}
}
