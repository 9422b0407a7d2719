package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/stretchr/testify/require"
)

// toolsDocSection is the text of docs/tools.md under heading (up to the
// next "## "), and the common text before the first command's heading,
// which documents the engine flags every command takes.
func toolsDocSection(t *testing.T, heading string) (section, common string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "docs", "tools.md"))
	require.NoError(t, err)
	doc := string(b)
	common, _, _ = strings.Cut(doc, "\n## ")
	i := strings.Index(doc, "\n## "+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "docs/tools.md has no heading %q", heading)
	section = doc[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	return section, common
}

// codeSpans are the `...` spans of markdown text, where the docs name
// flags (not the indented examples, which use the peers' tools' flags too).
var codeSpans = regexp.MustCompile("`[^`]+`")

// helpFlags is the flags a command's --help lists.
func helpFlags(t *testing.T, args ...string) []string {
	t.Helper()
	r := runCmd(append(args, "--help")...)
	require.Equal(t, 0, r.code, "%v --help: %s", args, r.stderr)
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(r.stderr, -1) {
		names = append(names, m[1])
	}
	require.NotEmpty(t, names, "%v --help lists no flags:\n%s", args, r.stderr)
	return names
}

// toolDocs pairs each command (and subcommand) with its docs/tools.md
// section; decode and conform have docs of their own (docs/decode.md,
// docs/conform.md).
var toolDocs = []struct {
	heading string
	args    []string
}{
	{"rxed pingpong", []string{"pingpong"}},
	{"rxed perf write|read|send|atomic", []string{"perf", "write"}},
	{"rxed perf tcp", []string{"perf", "tcp"}},
	{"rxed rping", []string{"rping"}},
	{"rxed cmatose", []string{"cmatose"}},
	{"rxed udaddy", []string{"udaddy"}},
	{"rxed mckey", []string{"mckey"}},
	{"rxed serve", []string{"serve"}},
	{"rxed devinfo", []string{"devinfo"}},
	{"rxed stat", []string{"stat"}},
	{"rxed kv serve|get|put|del|bench", []string{"kv", "serve"}},
	{"rxed kv serve|get|put|del|bench", []string{"kv", "get"}},
	{"rxed kv serve|get|put|del|bench", []string{"kv", "bench"}},
	{"rxed allreduce", []string{"allreduce"}},
	{"rxed demo", []string{"demo"}},
}

// TestToolsDocsNameEveryFlag: every flag a tool's --help lists is named in
// a code span of its docs/tools.md section or, for the engine flags, of
// the common text (as -x or --name, alone or with its argument). Bug
// (newcomer walkthrough, item 5): pingpong's -d and -i were in --help,
// not in the pingpong table; so were udaddy's --wait, devinfo's -d, kv
// bench's --tcp-port and allreduce's -v in theirs.
func TestToolsDocsNameEveryFlag(t *testing.T) {
	t.Parallel()
	covered := map[string]bool{"decode": true, "conform": true}
	for _, c := range toolDocs {
		covered[c.args[0]] = true
		section, common := toolsDocSection(t, c.heading)
		for _, name := range helpFlags(t, c.args...) {
			dash := "-" + name
			if len(name) > 1 {
				dash = "--" + name
			}
			token := regexp.MustCompile(`(^|[\s(])` + regexp.QuoteMeta(dash) + `([\s=,.)]|$)`)
			named := false
			for _, span := range codeSpans.FindAllString(section, -1) {
				named = named || token.MatchString(strings.Trim(span, "`"))
			}
			for _, span := range codeSpans.FindAllString(common, -1) {
				named = named || token.MatchString(strings.Trim(span, "`"))
			}
			if !named {
				t.Errorf("docs/tools.md's %q section (or the common flags) does not name %s, which %v --help lists", c.heading, dash, c.args)
			}
		}
	}
	for name := range commands {
		require.True(t, covered[name], "command %q is not in toolDocs", name)
	}
}

// faultKeys are the keys of a key=value list such as a --fault spec.
var faultKeys = regexp.MustCompile("(?:^|[\\s,(`])([a-z]+)=")

// TestFaultHelpNamesEveryKey: every command's --fault help lists the keys
// docs/tools.md's --fault row lists, and each of them parses. Bug
// (newcomer walkthrough, item 5): the help left out jitter.
func TestFaultHelpNamesEveryKey(t *testing.T) {
	t.Parallel()
	_, common := toolsDocSection(t, "rxed pingpong")
	row := regexp.MustCompile("(?m)^\\| `--fault SPEC` \\|.*$").FindString(common)
	require.NotEmpty(t, row, "docs/tools.md has no --fault row")
	var docKeys []string
	for _, m := range faultKeys.FindAllStringSubmatch(row, -1) {
		docKeys = append(docKeys, m[1])
	}
	slices.Sort(docKeys)
	docKeys = slices.Compact(docKeys)
	require.Contains(t, docKeys, "jitter")
	sample := map[string]string{"delay": "1ms", "jitter": "1ms", "hold": "1ms", "seed": "7", "depth": "2", "queue": "8", "dir": "send"}
	for _, k := range docKeys {
		v, ok := sample[k]
		if !ok {
			v = "0.1"
		}
		_, err := transport.ParseFaultSpec(k + "=" + v)
		require.NoError(t, err, "docs/tools.md's --fault key %q", k)
	}

	seen := 0
	for _, c := range toolDocs {
		r := runCmd(append(c.args, "--help")...)
		help := regexp.MustCompile(`(?m)^  -fault spec\n\s+(.*)$`).FindStringSubmatch(r.stderr)
		if help == nil {
			continue
		}
		seen++
		var keys []string
		for _, m := range faultKeys.FindAllStringSubmatch(help[1], -1) {
			keys = append(keys, m[1])
		}
		slices.Sort(keys)
		require.Equal(t, docKeys, slices.Compact(keys), "%v --help's --fault: %s", c.args, help[1])
	}
	require.Greater(t, seen, 5, "commands with --fault")
}
