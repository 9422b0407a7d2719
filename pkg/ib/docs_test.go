package ib

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestEveryExportedNameDocumented is a living guard for the package's
// promise that every exported name is documented: it parses the
// non-test sources and lists each exported function, method (on an
// exported type), type, struct field, interface method, constant and
// variable without a doc comment. A constant or variable inside a
// parenthesised block counts as documented when the block has a doc
// comment (the godoc convention for enumerations); a field or constant
// may also be documented by a trailing line comment.
func TestEveryExportedNameDocumented(t *testing.T) {
	fset := token.NewFileSet()
	files, err := parseSources(fset, ".")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no source files parsed")
	}
	var missing []string
	for _, f := range files {
		missing = append(missing, undocumented(fset, f)...)
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("undocumented exported name: %s", m)
	}
}

// TestNoPromotedForeignMethods keeps every method of the package's
// exported types declared (and so documented) here: an exported struct
// embedding a type of another package promotes that type's methods into
// this API, undocumented and unchecked. (issue 15: ib.CQ embedded
// *qp.CQ, which made Push, an unchecked Close and a second
// SetNotifyHandler public, and go doc showed nothing for CQ.WaitPoll.)
func TestNoPromotedForeignMethods(t *testing.T) {
	fset := token.NewFileSet()
	files, err := parseSources(fset, ".")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		for _, e := range embeddedForeign(fset, f) {
			t.Errorf("exported type embeds a type of another package: %s", e)
		}
	}
}

// TestEmbeddedForeignDetected checks the embedding guard on a known
// source.
func TestEmbeddedForeignDetected(t *testing.T) {
	const src = `package x

type Leaks struct {
	*qp.CQ
	n int
}

type LeaksValue struct{ sync.Mutex }

type Fine struct {
	c *qp.CQ
	local
}

type hidden struct{ *qp.CQ }

type local struct{}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range embeddedForeign(fset, f) {
		names = append(names, g[strings.LastIndex(g, " ")+1:])
	}
	sort.Strings(names)
	want := []string{"Leaks.qp.CQ", "LeaksValue.sync.Mutex"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("embeddedForeign = %v, want %v", names, want)
	}
}

// The CQ's API is its own: what only the engine or Destroy may do is not
// reachable from outside, and what users call is there.
func TestCQSurfaceIsItsOwn(t *testing.T) {
	cqType := reflect.TypeOf((*CQ)(nil))
	for _, name := range []string{"Push", "Close", "CQ"} {
		if _, ok := cqType.MethodByName(name); ok {
			t.Errorf("*ib.CQ has method %s: the engine's, not the API's (issue 15)", name)
		}
	}
	if _, ok := cqType.Elem().FieldByName("CQ"); ok {
		t.Error("ib.CQ has a field CQ: the qp-level queue is reachable")
	}
	for _, name := range []string{"Poll", "PollCQ", "Wait", "WaitPoll", "ReqNotify", "Notify",
		"SetNotifyHandler", "Destroy", "Len", "Cap", "Resize", "Overflowed", "Notifications"} {
		if _, ok := cqType.MethodByName(name); !ok {
			t.Errorf("*ib.CQ lacks method %s", name)
		}
	}
}

// embeddedForeign lists "file:line Type.pkg.Name" for each embedded
// field of an exported struct type whose type comes from another
// package.
func embeddedForeign(fset *token.FileSet, f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		d, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range d.Specs {
			s, ok := spec.(*ast.TypeSpec)
			if !ok || !s.Name.IsExported() {
				continue
			}
			st, ok := s.Type.(*ast.StructType)
			if !ok {
				continue
			}
			for _, fld := range st.Fields.List {
				if len(fld.Names) > 0 {
					continue
				}
				t := fld.Type
				if star, ok := t.(*ast.StarExpr); ok {
					t = star.X
				}
				if sel, ok := t.(*ast.SelectorExpr); ok {
					p := fset.Position(fld.Pos())
					out = append(out, p.Filename+":"+strconv.Itoa(p.Line)+" "+s.Name.Name+"."+
						sel.X.(*ast.Ident).Name+"."+sel.Sel.Name)
				}
			}
		}
	}
	return out
}

// TestUndocumentedDetectsGaps checks the guard itself on a source with a
// known set of documented and undocumented names, so a bug in the
// checker cannot make the real test pass vacuously.
func TestUndocumentedDetectsGaps(t *testing.T) {
	const src = `package x

// Doc is documented.
type Doc struct {
	// A is documented.
	A int
	B int // B is documented by a line comment.
	C int
	d int
}

type Bare struct{}

// M is documented.
func (Doc) M() {}

func (Doc) N() {}

func (bare) Hidden() {} // a method on an unexported type is not API

type bare struct{}

// Grouped constants.
const (
	K1 = 1
	K2 = 2
)

const (
	// L1 is documented.
	L1 = 1
	L2 = 2
	L3 = 3 // L3 is documented.
)

var V = 1

// I is documented.
type I interface {
	// Do is documented.
	Do()
	Undo()
}

func F() {}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "x.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	got := undocumented(fset, f)
	var names []string
	for _, g := range got {
		names = append(names, g[strings.LastIndex(g, " ")+1:])
	}
	sort.Strings(names)
	want := []string{"Bare", "Doc.C", "Doc.N", "F", "I.Undo", "L2", "V"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("undocumented = %v, want %v", names, want)
	}
}

func parseSources(fset *token.FileSet, dir string) ([]*ast.File, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var files []*ast.File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, dir+"/"+n, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// undocumented lists "file:line Name" for each exported name of f that
// has no doc comment.
func undocumented(fset *token.FileSet, f *ast.File) []string {
	var out []string
	report := func(pos token.Pos, name string) {
		p := fset.Position(pos)
		out = append(out, p.Filename+":"+strconv.Itoa(p.Line)+" "+name)
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			name := d.Name.Name
			if d.Recv != nil {
				recv := receiverName(d.Recv)
				if !ast.IsExported(recv) {
					continue
				}
				name = recv + "." + name
			}
			if d.Doc == nil {
				report(d.Pos(), name)
			}
		case *ast.GenDecl:
			grouped := d.Lparen.IsValid()
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					if s.Doc == nil && s.Comment == nil && (grouped || d.Doc == nil) {
						report(s.Pos(), s.Name.Name)
					}
					checkMembers(s, report)
				case *ast.ValueSpec:
					for _, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						documented := s.Doc != nil || s.Comment != nil || d.Doc != nil
						if !documented {
							report(n.Pos(), n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// checkMembers reports the exported fields of an exported struct type
// and the methods of an exported interface type that lack comments.
func checkMembers(s *ast.TypeSpec, report func(token.Pos, string)) {
	var fields *ast.FieldList
	switch tt := s.Type.(type) {
	case *ast.StructType:
		fields = tt.Fields
	case *ast.InterfaceType:
		fields = tt.Methods
	default:
		return
	}
	for _, fld := range fields.List {
		if fld.Doc != nil || fld.Comment != nil {
			continue
		}
		for _, n := range fld.Names {
			if n.IsExported() {
				report(n.Pos(), s.Name.Name+"."+n.Name)
			}
		}
	}
}

func receiverName(r *ast.FieldList) string {
	if r == nil || len(r.List) == 0 {
		return ""
	}
	t := r.List[0].Type
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
