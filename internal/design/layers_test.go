package design

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
)

const module = "github.com/rxed/rxed"

// layers is docs/DESIGN.md's data flow as an order: a package may import
// (from its non-test files) only module packages listed before it. An
// entry ending in "/" covers every package under it. Every package of the
// module must be listed, so a new one is placed on purpose (and in
// DESIGN.md).
var layers = []string{
	"pkg/wire",
	"pkg/wire/wirepcap", // reads pcaps for wire's and mad's tests and internal/decode
	"pkg/wire/mad",
	"pkg/oob", // the out-of-band TCP exchanges: nothing of the module
	"pkg/mr",
	"pkg/qp",
	"pkg/roce/transport",
	"pkg/roce",
	"pkg/ib",
	"pkg/cm",
	"pkg/cm/cmtest",
	"pkg/rdmacm",
	"pkg/conform",
	"examples/",
	"internal/testenv",
	"internal/netns",
	"internal/polltest",
	"internal/design",
	"internal/decode",
	"internal/daemon",
	"cmd/rxed",
	"test/",
}

// testHelpers are the packages a test file of any layer may import: what
// tests share about their environment, below every layer that uses them
// (checked: a helper's own imports must come before the importer).
var testHelpers = []string{"internal/testenv", "internal/netns", "internal/polltest",
	"pkg/wire/wirepcap", "pkg/cm/cmtest"}

// onlyImports narrows a package's module imports (non-test files) beyond
// the order: pkg/cm is the pure IB CM state machine (no I/O, no verbs:
// pkg/rdmacm drives it), and pkg/conform crafts its packets with pkg/wire
// on a socket of its own, never through the engine it judges.
var onlyImports = map[string][]string{
	"pkg/wire":     {},
	"pkg/wire/mad": {"pkg/wire"},
	"pkg/oob":      {},
	"pkg/cm":       {"pkg/wire/mad"},
	"pkg/conform":  {"pkg/wire", "pkg/oob"},
}

// layerOf returns the index of pkg in layers, or -1.
func layerOf(pkg string) int {
	for i, l := range layers {
		if pkg == l || (strings.HasSuffix(l, "/") && strings.HasPrefix(pkg, l)) {
			return i
		}
	}
	return -1
}

// pkgImports are one package's module imports, by kind of file.
type pkgImports struct {
	code, tests map[string][]string // imported package -> files importing it
}

// moduleImports parses every Go file of the module under root (imports
// only) and returns each package's imports of module packages, keyed by
// the package's path relative to the module (its directory).
func moduleImports(t *testing.T, root string) map[string]*pkgImports {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string]*pkgImports{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		p := pkgs[rel]
		if p == nil {
			p = &pkgImports{code: map[string][]string{}, tests: map[string][]string{}}
			pkgs[rel] = p
		}
		into := p.code
		if strings.HasSuffix(name, "_test.go") {
			into = p.tests
		}
		for _, im := range f.Imports {
			ip, err := strconv.Unquote(im.Path.Value)
			if err != nil {
				return err
			}
			if dep, ok := strings.CutPrefix(ip, module+"/"); ok && dep != rel {
				into[dep] = append(into[dep], name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestNoPackageImportsOneAboveIt checks docs/DESIGN.md's layering on the
// module's sources. DESIGN.md stated it but nothing checked it, and it
// named neither pkg/oob nor pkg/conform (found by the DESIGN.md audit).
func TestNoPackageImportsOneAboveIt(t *testing.T) {
	root := testenv.RepoRoot(t)
	pkgs := moduleImports(t, root)
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under %s", len(pkgs), root)
	}
	for _, v := range layeringViolations(pkgs) {
		t.Error(v)
	}
}

// layeringViolations lists every import that breaks the layering.
func layeringViolations(pkgs map[string]*pkgImports) []string {
	var out []string
	names := make([]string, 0, len(pkgs))
	for p := range pkgs {
		names = append(names, p)
	}
	slices.Sort(names)
	for _, p := range names {
		li := layerOf(p)
		if li < 0 {
			out = append(out, p+": not in the layer table (internal/design/layers_test.go and docs/DESIGN.md): place it")
			continue
		}
		imp := pkgs[p]
		for _, dep := range sortedKeys(imp.code) {
			if d := layerOf(dep); d < 0 || d > li || (d == li && !isGroup(li)) {
				out = append(out, p+" imports "+dep+" ("+strings.Join(imp.code[dep], ", ")+"), which is not below it")
			}
			if strings.HasPrefix(p, "pkg/") && strings.HasPrefix(dep, "internal/") {
				out = append(out, p+" imports "+dep+" outside its tests ("+strings.Join(imp.code[dep], ", ")+")")
			}
			if only, ok := onlyImports[p]; ok && !slices.Contains(only, dep) {
				may := "nothing of the module"
				if len(only) > 0 {
					may = strings.Join(only, ", ")
				}
				out = append(out, p+" imports "+dep+" ("+strings.Join(imp.code[dep], ", ")+"); it may import only "+may)
			}
		}
		for _, dep := range sortedKeys(imp.tests) {
			if slices.Contains(testHelpers, dep) {
				// A helper sits below its users: its own imports must be.
				if h := pkgs[dep]; h != nil {
					for _, hd := range sortedKeys(h.code) {
						if d := layerOf(hd); d >= li && p != hd {
							out = append(out, p+"'s tests import the helper "+dep+", which imports "+hd+", not below "+p)
						}
					}
				}
				continue
			}
			if d := layerOf(dep); d < 0 || d > li {
				out = append(out, p+"'s tests import "+dep+" ("+strings.Join(imp.tests[dep], ", ")+"), which is above it")
			}
		}
	}
	return out
}

// isGroup reports whether layer i is a directory of packages (its
// packages may import one another: Go refuses cycles).
func isGroup(i int) bool { return strings.HasSuffix(layers[i], "/") }

func sortedKeys(m map[string][]string) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// TestLayeringViolationsFound checks the checker on made-up imports: an
// upward import, a pure package importing a lower one it may not, a pkg
// importing internal/, a test importing above its package, and a package
// nobody placed.
func TestLayeringViolationsFound(t *testing.T) {
	mk := func(code []string, tests ...string) *pkgImports {
		p := &pkgImports{code: map[string][]string{}, tests: map[string][]string{}}
		for _, c := range code {
			p.code[c] = []string{"x.go"}
		}
		for _, c := range tests {
			p.tests[c] = []string{"x_test.go"}
		}
		return p
	}
	pkgs := map[string]*pkgImports{
		"pkg/qp":            mk([]string{"pkg/roce"}),
		"pkg/cm":            mk([]string{"pkg/wire/mad", "pkg/wire"}),
		"pkg/roce":          mk([]string{"pkg/qp", "internal/testenv"}),
		"pkg/mr":            mk(nil, "pkg/ib"),
		"pkg/ib":            mk(nil, "internal/polltest", "internal/testenv"),
		"internal/polltest": mk([]string{"pkg/roce/transport"}),
		"pkg/new":           mk(nil),
	}
	got := layeringViolations(pkgs)
	want := []string{
		"pkg/cm imports pkg/wire",
		"pkg/mr's tests import pkg/ib",
		"pkg/new: not in the layer table",
		"pkg/qp imports pkg/roce",
		"pkg/roce imports internal/testenv (x.go), which is not below it",
		"pkg/roce imports internal/testenv outside its tests",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d violations, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("violation %d = %q, want it to start %q", i, got[i], want[i])
		}
	}
}

// The layer table must not name packages that no longer exist either.
func TestLayerTableNamesLivePackages(t *testing.T) {
	root := testenv.RepoRoot(t)
	for _, l := range layers {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(l))); err != nil {
			t.Errorf("layer table names %s: %v", l, err)
		}
	}
}
