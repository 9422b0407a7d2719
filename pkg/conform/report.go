package conform

import (
	"fmt"
	"html/template"
	"io"
	"time"
)

// WriteHTML writes one self-contained page (no external assets): the
// verdict table and, per scenario, an SVG ladder diagram of its packets,
// time down the page, the engine and the peer as the two columns, each
// arrow labelled with opcode, PSN and the deciding field.
func WriteHTML(w io.Writer, title string, results []Result) error {
	type arrow struct {
		Y        int
		X1, X2   int
		Label    string
		At       string
		Color    string
		TextX    int
		TextSide string
	}
	type ladder struct {
		Result
		Arrows []arrow
		Height int
	}
	var ls []ladder
	for _, r := range results {
		l := ladder{Result: r}
		for i, e := range r.Trace {
			a := arrow{Y: 40 + 22*i, Label: e.Label(), At: fmt.Sprintf("%.3f ms", float64(e.At)/float64(time.Millisecond))}
			if e.Dir == Out {
				a.X1, a.X2, a.Color = 150, 750, "#1f5fbf"
			} else {
				a.X1, a.X2, a.Color = 750, 150, "#b5461f"
				if e.Note != "" {
					a.Color = "#c00"
				}
			}
			a.TextX = 450
			l.Arrows = append(l.Arrows, a)
		}
		l.Height = 60 + 22*len(r.Trace)
		ls = append(ls, l)
	}
	return reportTmpl.Execute(w, struct {
		Title   string
		Results []ladder
	}{title, ls})
}

var reportTmpl = template.Must(template.New("report").Funcs(template.FuncMap{
	"lower": func(v Verdict) string {
		return map[Verdict]string{Pass: "pass", Fail: "fail", Deviation: "dev", Skip: "skip", Error: "err"}[v]
	},
}).Parse(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{{.Title}}</title>
<style>
body{font-family:sans-serif;margin:1.5em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 6px;font-size:13px;vertical-align:top}
.pass{background:#d8f5d8}.fail{background:#f8c8c8}.dev{background:#fbe8b0}.skip{background:#eee}.err{background:#f0d0f0}
svg text{font-family:monospace;font-size:11px}
section{margin-top:2em}
</style></head><body>
<h1>{{.Title}}</h1>
<table><tr><th>ID</th><th>title</th><th>rule</th><th>verdict</th><th>evidence</th></tr>
{{range .Results}}<tr><td><a href="#{{.ID}}">{{.ID}}</a></td><td>{{.Title}}</td><td>{{.Rule}}</td><td class="{{lower .Verdict}}">{{.Verdict}}</td><td>{{.Evidence}}</td></tr>
{{end}}</table>
{{range .Results}}<section id="{{.ID}}"><h2>{{.ID}}: {{.Title}} <span class="{{lower .Verdict}}">{{.Verdict}}</span></h2>
<p>{{.Rule}}. {{.Evidence}}</p>
{{if .Arrows}}<svg width="900" height="{{.Height}}" xmlns="http://www.w3.org/2000/svg">
<defs><marker id="h-{{.ID}}" markerWidth="8" markerHeight="8" refX="8" refY="4" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#444"/></marker></defs>
<text x="150" y="16" text-anchor="middle">engine {{.Local}}</text><text x="750" y="16" text-anchor="middle">peer {{.Peer}}</text>
<line x1="150" y1="24" x2="150" y2="{{.Height}}" stroke="#888"/><line x1="750" y1="24" x2="750" y2="{{.Height}}" stroke="#888"/>
{{$id := .ID}}{{range .Arrows}}<text x="4" y="{{.Y}}" fill="#666">{{.At}}</text>
<line x1="{{.X1}}" y1="{{.Y}}" x2="{{.X2}}" y2="{{.Y}}" stroke="{{.Color}}" marker-end="url(#h-{{$id}})"/>
<text x="{{.TextX}}" y="{{.Y}}" dy="-3" text-anchor="middle" fill="{{.Color}}">{{.Label}}</text>
{{end}}</svg>{{else}}<p>(no packets)</p>{{end}}
</section>{{end}}
</body></html>
`))
