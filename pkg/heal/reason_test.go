package heal

import (
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"
)

// ClassConstants reads every constant of type Class declared in dir's
// non-test Go files, from the source: the set the code can emit.
func classConstants(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, f := range files {
		if matched, _ := filepath.Match("*_test.go", filepath.Base(f)); matched {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || vs.Type == nil {
				return true
			}
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Class" {
				return true
			}
			for _, v := range vs.Values {
				lit, ok := v.(*ast.BasicLit)
				if !ok {
					t.Errorf("%s: a Class constant that is not a string literal", fset.Position(v.Pos()))
					continue
				}
				s, _ := strconv.Unquote(lit.Value)
				out = append(out, s)
			}
			return true
		})
	}
	sort.Strings(out)
	return out
}

var classRE = regexp.MustCompile(`^[a-z]+(_[a-z]+)*$`)

// TestClasses_EveryConstantIsListedWithItsMeaning: Classes() (what the
// docs test checks against docs/metrics.md and docs/operations.md) is
// exactly the set of Class constants in the source, each a snake_case
// label value with a meaning.
func TestClasses_EveryConstantIsListedWithItsMeaning(t *testing.T) {
	fromSource := classConstants(t, ".")
	var listed []string
	for _, c := range Classes() {
		listed = append(listed, string(c))
		if c.Meaning() == "" || !classRE.MatchString(string(c)) {
			t.Errorf("class %q: meaning %q; want a snake_case value with a meaning", c, c.Meaning())
		}
	}
	sort.Strings(listed)
	if diff := cmp.Diff(fromSource, listed); diff != "" {
		t.Errorf("Class constants (-source +Classes()):\n%s", diff)
	}
	if Class("grace: nvme4").Meaning() != "" {
		t.Error("free text has a meaning")
	}
}

// TestHeal_EveryVerdictCarriesItsClass walks the policy through each rule
// and checks the class beside the reason.
func TestHeal_EveryVerdictCarriesItsClass(t *testing.T) {
	ctx := context.Background()
	young := notContributing("4421", t0.Add(-time.Second))
	old := notContributing("4422", t0.Add(-time.Hour))
	wide := notContributing("4425", t0.Add(-time.Hour))
	wide.Scope = ScopeSubsystem
	tenants := notContributing("4426", t0.Add(-time.Hour))
	tenants.CoTenants = []CoTenant{{Namespace: "nvme0n2", Device: "/dev/nvme0n2"}}
	failing := notContributing("4427", t0.Add(-time.Hour))

	clk := clocktesting.NewFakeClock(t0)
	p, err := NewPolicy(Config{Mode: ModeRepair, Now: clk.Now, MaxScope: ScopeController})
	if err != nil {
		t.Fatal(err)
	}
	got := map[Class]Verdict{}
	for _, o := range p.Heal(ctx, []Defect{young, old, wide, tenants}, &recorder{}) {
		got[o.Class] = o.Verdict
	}
	for _, o := range p.Heal(ctx, []Defect{old}, &recorder{}) {
		got[o.Class] = o.Verdict
	}
	for _, o := range p.Heal(ctx, []Defect{failing}, &recorder{err: errors.New("write delete_controller: EBUSY")}) {
		got[o.Class] = o.Verdict
	}
	obs := newPolicy(t, ModeObserve, clk)
	for _, o := range obs.Heal(ctx, []Defect{old}, &recorder{}) {
		got[o.Class] = o.Verdict
	}
	want := map[Class]Verdict{
		ClassGrace: Deferred, ClassTornDown: Repaired, ClassScopeCap: Refused, ClassCoTenants: Refused,
		ClassCooldown: Deferred, ClassTeardownFailed: Failed, ClassObserveMode: Observed,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("class → verdict (-want +got):\n%s", diff)
	}
	for _, o := range p.Plan([]Defect{notContributing("4423", t0.Add(-time.Hour))}) {
		if o.Class != ClassObserveMode {
			t.Errorf("Plan: class %q, want observe_mode", o.Class)
		}
	}
}
