package design

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
)

// decls is what the module's non-test sources declare: for each type
// (by name, and by package.name) its fields and methods, for each package
// (by name) its top-level names, and every string literal.
type decls struct {
	members map[string]map[string]bool
	pkgs    map[string]map[string]bool
	aliases map[string][]string // type name -> the types it aliases (pkg.Name and Name)
	strs    map[string]bool
	tests   map[string]bool // Test functions of the _test.go files
	files   map[string]bool // base names of the module's files
}

func (d *decls) add(m map[string]map[string]bool, k, v string) {
	if m[k] == nil {
		m[k] = map[string]bool{}
	}
	m[k][v] = true
}

// parseModule reads every Go file under root.
func parseModule(t *testing.T, root string) *decls {
	t.Helper()
	d := &decls{members: map[string]map[string]bool{}, pkgs: map[string]map[string]bool{},
		aliases: map[string][]string{}, strs: map[string]bool{}, tests: map[string]bool{}, files: map[string]bool{}}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := e.Name()
		if e.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		d.files[name] = true
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if strings.HasSuffix(name, "_test.go") {
			for _, decl := range f.Decls {
				if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Test") {
					d.tests[fd.Name.Name] = true
				}
			}
			return nil
		}
		d.collect(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// collect records f's declarations and string literals.
func (d *decls) collect(f *ast.File) {
	pkg := f.Name.Name
	member := func(typ, m string) {
		d.add(d.members, typ, m)
		d.add(d.members, pkg+"."+typ, m)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.BasicLit:
			if x.Kind == token.STRING {
				if s, err := strconv.Unquote(x.Value); err == nil {
					d.strs[s] = true
				}
			}
		case *ast.FuncDecl:
			if x.Recv == nil {
				d.add(d.pkgs, pkg, x.Name.Name)
				break
			}
			if id := baseIdent(x.Recv.List[0].Type); id != "" {
				member(id, x.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range x.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, nm := range s.Names {
						d.add(d.pkgs, pkg, nm.Name)
					}
				case *ast.TypeSpec:
					d.add(d.pkgs, pkg, s.Name.Name)
					d.addType(pkg, s, member)
				}
			}
		}
		return true
	})
}

// addType records a type's fields (embedded ones by their type's name)
// and interface methods, or what it aliases.
func (d *decls) addType(pkg string, s *ast.TypeSpec, member func(typ, m string)) {
	name := s.Name.Name
	switch t := s.Type.(type) {
	case *ast.StructType:
		for _, fl := range t.Fields.List {
			for _, nm := range fl.Names {
				member(name, nm.Name)
			}
			if len(fl.Names) == 0 {
				if id := baseIdent(fl.Type); id != "" {
					member(name, id)
					d.aliases[name] = append(d.aliases[name], id) // promoted members
				}
			}
		}
	case *ast.InterfaceType:
		for _, fl := range t.Methods.List {
			for _, nm := range fl.Names {
				member(name, nm.Name)
			}
		}
	case *ast.SelectorExpr:
		if x, ok := t.X.(*ast.Ident); ok {
			d.aliases[name] = append(d.aliases[name], x.Name+"."+t.Sel.Name)
			d.aliases[pkg+"."+name] = append(d.aliases[pkg+"."+name], x.Name+"."+t.Sel.Name)
		}
	case *ast.Ident:
		d.aliases[name] = append(d.aliases[name], pkg+"."+t.Name)
	}
}

// baseIdent is the name of a (receiver or embedded) type expression:
// T, *T, T[P], pkg.T.
func baseIdent(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.SelectorExpr:
			return x.Sel.Name
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}

// hasMember reports whether typ (a type name, or pkg.Type) has m,
// following aliases and embedded types.
func (d *decls) hasMember(typ, m string, depth int) bool {
	if d.members[typ][m] {
		return true
	}
	if depth > 4 {
		return false
	}
	for _, a := range d.aliases[typ] {
		if d.hasMember(a, m, depth+1) {
			return true
		}
	}
	return false
}

// known reports whether typ is a type the module declares (through its
// aliases: one of a type of another module is not known).
func (d *decls) known(typ string, depth int) bool {
	if d.members[typ] != nil {
		return true
	}
	if depth > 4 {
		return false
	}
	return slices.ContainsFunc(d.aliases[typ], func(a string) bool { return d.known(a, depth+1) })
}

var (
	codeSpan  = regexp.MustCompile("`([^`]+)`")
	qualified = regexp.MustCompile(`^[A-Za-z_]\w*(\.[A-Za-z_]\w*){1,2}$`)
	snakeName = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)+$`)
	fileName  = regexp.MustCompile(`\b[a-z][a-z0-9_]*\.(go|s)\b`)
	testName  = regexp.MustCompile(`\bTest[A-Z]\w*`)
	dropName  = regexp.MustCompile(`\bdrop_[a-z0-9_]+\b`)
)

// cNames start the snake_case names DESIGN.md cites from the kernel,
// rdma-core and librdmacm (not counters of ours): they are not looked for
// among the code's strings.
var cNames = []string{"rxe_", "cma_", "ucma_", "ib_", "rdma_", "validate_", "conn_param"}

func designDoc(t *testing.T) (root, doc string) {
	t.Helper()
	root = testenv.RepoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "DESIGN.md"))
	if err != nil {
		t.Fatal(err)
	}
	return root, string(b)
}

// TestDesignNamesExist checks that what docs/DESIGN.md names by code
// span exists: a Type.field or Type.method (pkg.Type.member, and
// pkg.Name for a package of the module) on a type the module declares,
// and every counter (a snake_case name: a string of the code). Names of
// things the module does not declare (ctx.Err, runtime.Gosched, a
// variable's field) are not checked. Nothing checked these names before
// the DESIGN.md audit: a lock, field, method or counter renamed in the
// code now fails here instead of leaving the document naming nothing.
func TestDesignNamesExist(t *testing.T) {
	root, doc := designDoc(t)
	d := parseModule(t, root)
	for _, bad := range d.missingNames(doc) {
		t.Errorf("docs/DESIGN.md names %s", bad)
	}
}

// missingNames lists the code spans and counters of doc the module does
// not declare.
func (d *decls) missingNames(doc string) []string {
	var out []string
	seen := map[string]bool{}
	for _, m := range codeSpan.FindAllStringSubmatch(doc, -1) {
		span := strings.TrimSuffix(m[1], "()")
		if seen[span] || fileName.MatchString(span) {
			continue
		}
		seen[span] = true
		switch {
		case qualified.MatchString(span):
			parts := strings.Split(span, ".")
			if len(parts) == 3 {
				typ := parts[0] + "." + parts[1]
				if d.known(typ, 0) {
					if !d.hasMember(typ, parts[2], 0) {
						out = append(out, "`"+span+"`: "+typ+" has no "+parts[2])
					}
				}
				continue
			}
			if d.known(parts[0], 0) {
				if !d.hasMember(parts[0], parts[1], 0) {
					out = append(out, "`"+span+"`: type "+parts[0]+" has no field or method "+parts[1])
				}
			} else if top := d.pkgs[parts[0]]; top != nil && !top[parts[1]] {
				out = append(out, "`"+span+"`: package "+parts[0]+" declares no "+parts[1])
			}
		case snakeName.MatchString(span):
			if !slices.ContainsFunc(cNames, func(p string) bool { return strings.HasPrefix(span, p) }) && !d.strs[span] {
				out = append(out, "`"+span+"`: no such counter (string) in the code")
			}
		}
	}
	for _, name := range dropName.FindAllString(doc, -1) {
		if !seen[name] && !d.strs[name] {
			seen[name] = true
			out = append(out, name+": no such drop counter in the code")
		}
	}
	return out
}

// TestDesignFilesAndTestsExist checks the files (foo.go) and tests
// (TestFoo) DESIGN.md cites as evidence.
func TestDesignFilesAndTestsExist(t *testing.T) {
	root, doc := designDoc(t)
	d := parseModule(t, root)
	for _, f := range fileName.FindAllString(doc, -1) {
		if !d.files[f] {
			t.Errorf("docs/DESIGN.md cites %s, which is no file of the module", f)
		}
	}
	for _, tn := range testName.FindAllString(doc, -1) {
		if !d.tests[tn] {
			t.Errorf("docs/DESIGN.md cites %s, which is no test of the module", tn)
		}
	}
}

// TestMissingNamesFound checks the checker on a made-up document and
// source.
func TestMissingNamesFound(t *testing.T) {
	const src = `package roce

type worker struct {
	own    sync.Mutex
	kicked kickedSet
	*inner
}

type inner struct{ deep int }

type Alias = other.Thing

func (w *worker) settle() {}

var counters = []string{"send_err"}
`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &decls{members: map[string]map[string]bool{}, pkgs: map[string]map[string]bool{},
		aliases: map[string][]string{}, strs: map[string]bool{}}
	d.collect(f)
	doc := "`worker.own`, `worker.settle()`, `worker.deep`, `roce.worker.kicked`, `worker.gone`, " +
		"`roce.worker.lost`, `roce.Missing`, `ctx.Err`, `send_err`, `recv_err`, `rxe_qp_chk_init`, " +
		"drop_nothing, `Alias.Anything`"
	got := d.missingNames(doc)
	want := []string{
		"`worker.gone`: type worker has no field or method gone",
		"`roce.worker.lost`: roce.worker has no lost",
		"`roce.Missing`: package roce declares no Missing",
		"`recv_err`: no such counter (string) in the code",
		"drop_nothing: no such drop counter in the code",
	}
	if !slices.Equal(got, want) {
		t.Errorf("missing names:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
