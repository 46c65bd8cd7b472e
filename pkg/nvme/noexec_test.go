package nvme

import (
	"bufio"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// execPackages start processes; nothing pkg/nvme links may import them.
var execPackages = []string{"os/exec", "k8s.io/utils/exec"}

// processCalls start a process without os/exec.
var processCalls = map[string][]string{"os": {"StartProcess"}, "syscall": {"ForkExec", "Exec", "StartProcess"}}

// TestNoProcessIsStarted proves that diagnosis starts no process: the
// transitive closure of pkg/nvme's non-test imports (this module, the
// standard library for this GOOS/GOARCH and the required modules), read
// with go/parser, contains no exec package, and no package of this module
// in it calls a process-starting function of os or syscall.
func TestNoProcessIsStarted(t *testing.T) {
	l := newImportLoader(t)
	from, bad := walkImports(t, l, modulePath+"/pkg/nvme")
	if bad != "" {
		t.Fatalf("pkg/nvme links %s: %s", bad, chain(from, bad))
	}
	// The walk must span all three sources of packages.
	for _, p := range []string{modulePath + "/pkg/sysfs", "k8s.io/klog/v2", "net"} {
		if _, ok := from[p]; !ok {
			t.Fatalf("the walk did not reach %s: it is broken", p)
		}
	}
	t.Logf("%d packages linked by pkg/nvme, none starts a process", len(from))

	// The same walk does find exec where it is: mount-utils formats disks
	// through k8s.io/utils/exec.
	if from, bad := walkImports(t, l, "k8s.io/mount-utils"); bad != "k8s.io/utils/exec" {
		t.Errorf("walk from k8s.io/mount-utils found %q (%d packages), want k8s.io/utils/exec", bad, len(from))
	}
}

// walkImports visits the import closure of root breadth-first and stops at
// the first exec package, which it returns with the map of who imported
// whom.
func walkImports(t *testing.T, l *importLoader, root string) (from map[string]string, bad string) {
	from = map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		pkg := queue[0]
		queue = queue[1:]
		if slices.Contains(execPackages, pkg) {
			return from, pkg
		}
		for _, imp := range l.imports(t, pkg) {
			if _, seen := from[imp]; !seen && imp != "C" {
				from[imp] = pkg
				queue = append(queue, imp)
			}
		}
	}
	return from, ""
}

const modulePath = "github.com/pathmend/pathmend"

func chain(from map[string]string, pkg string) string {
	var c []string
	for p := pkg; p != ""; p = from[p] {
		c = append([]string{p}, c...)
	}
	return strings.Join(c, " -> ")
}

type importLoader struct {
	ctx      build.Context
	modRoot  string
	requires map[string]string // module path -> version
	modCache string
}

func newImportLoader(t *testing.T) *importLoader {
	modRoot, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	l := &importLoader{ctx: build.Default, modRoot: modRoot, requires: map[string]string{}}
	l.ctx.CgoEnabled = false
	if l.ctx.GOROOT == "" {
		t.Fatal("go/build does not know GOROOT")
	}
	l.modCache = os.Getenv("GOMODCACHE")
	if l.modCache == "" {
		l.modCache = filepath.Join(build.Default.GOPATH, "pkg", "mod")
	}
	f, err := os.Open(filepath.Join(modRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && strings.Contains(fields[0], ".") && strings.HasPrefix(fields[1], "v") {
			l.requires[fields[0]] = fields[1]
		}
	}
	return l
}

// dir locates the source directory of an import path.
func (l *importLoader) dir(t *testing.T, pkg string) string {
	if rest, ok := strings.CutPrefix(pkg, modulePath); ok {
		return filepath.Join(l.modRoot, filepath.FromSlash(rest))
	}
	first, _, _ := strings.Cut(pkg, "/")
	if !strings.Contains(first, ".") {
		return filepath.Join(l.ctx.GOROOT, "src", filepath.FromSlash(pkg))
	}
	best := ""
	for m := range l.requires {
		if (pkg == m || strings.HasPrefix(pkg, m+"/")) && len(m) > len(best) {
			best = m
		}
	}
	if best == "" {
		t.Fatalf("%s: no required module provides it", pkg)
	}
	return filepath.Join(l.modCache, escapeModule(best)+"@"+l.requires[best], filepath.FromSlash(strings.TrimPrefix(pkg, best)))
}

// imports returns the imports of pkg's non-test files that build for
// this platform, and checks this module's files for process calls.
func (l *importLoader) imports(t *testing.T, pkg string) []string {
	dir := l.dir(t, pkg)
	if strings.HasPrefix(pkg, "vendor/") || strings.Contains(pkg, "/vendor/") {
		dir = filepath.Join(l.ctx.GOROOT, "src", filepath.FromSlash(pkg))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("%s: %v", pkg, err)
	}
	var out []string
	fset := token.NewFileSet()
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		if ok, err := l.ctx.MatchFile(dir, name); err != nil || !ok {
			continue
		}
		mode := parser.ImportsOnly
		if strings.HasPrefix(pkg, modulePath) {
			mode = parser.SkipObjectResolution
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, mode)
		if err != nil {
			t.Fatalf("%s: %v", pkg, err)
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(p, "golang.org/x/") && !strings.HasPrefix(pkg, modulePath) && strings.HasPrefix(dir, l.ctx.GOROOT) {
				p = "vendor/" + p // the standard library's vendored copies
			}
			out = append(out, p)
		}
		if mode != parser.ImportsOnly {
			checkProcessCalls(t, fset, f)
		}
	}
	return out
}

// checkProcessCalls fails on os.StartProcess, syscall.ForkExec and the like.
func checkProcessCalls(t *testing.T, fset *token.FileSet, f *ast.File) {
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); ok && slices.Contains(processCalls[id.Name], sel.Sel.Name) {
			t.Errorf("%s: %s.%s starts a process", fset.Position(sel.Pos()), id.Name, sel.Sel.Name)
		}
		return true
	})
}

// escapeModule applies the module cache's case encoding ("!" + lower).
func escapeModule(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
