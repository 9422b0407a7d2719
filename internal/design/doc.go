// Package design holds no code: its tests check the contracts of
// docs/DESIGN.md that can be checked mechanically, so that the document
// and the code cannot drift apart unnoticed.
//
//   - layers_test.go: the layering ("a package never imports one to its
//     right"), read from the module's own sources with go/parser.
//   - names_test.go: the names DESIGN.md cites (Type.field and
//     Type.method, counters, files, tests) exist in the code.
package design
