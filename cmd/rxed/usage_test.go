package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestHelpSaysHowToRunEachCommand: -h and rxed help say how a command is
// run, not only its flags. Bugs (newcomer walkthrough of docs/tools.md):
// the usage lines were "usage: rxed NAME [flags]" for commands whose
// client takes the server's address (pingpong, perf) or that take
// arguments (kv get|put|del); rxed kv -h was `unknown subcommand "-h"`,
// exit 2; rxed help pingpong printed the command list again; the list did
// not say how to get a command's flags.
func TestHelpSaysHowToRunEachCommand(t *testing.T) {
	firstLine := func(r result) string {
		line, _, _ := strings.Cut(r.stderr, "\n")
		return line
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"pingpong", "-h"}, "usage: rxed pingpong [flags] [SERVER]"},
		{[]string{"perf", "write", "-h"}, "usage: rxed perf write [flags] [SERVER]"},
		{[]string{"perf", "tcp", "-h"}, "usage: rxed perf tcp [flags] [SERVER]"},
		{[]string{"perf", "-h"}, "usage: rxed perf write|read|send|atomic|tcp [--lat] [flags] [SERVER]"},
		{[]string{"kv", "get", "-h"}, "usage: rxed kv get [flags] SERVER KEY"},
		{[]string{"kv", "put", "-h"}, "usage: rxed kv put [flags] SERVER KEY VALUE"},
		{[]string{"kv", "-h"}, "usage: rxed kv serve|get|put|del|bench"},
		{[]string{"help", "pingpong"}, "usage: rxed pingpong [flags] [SERVER]"},
		{[]string{"help", "kv", "del"}, "usage: rxed kv del [flags] SERVER KEY"},
		{[]string{"help", "rping"}, "usage: rxed rping [flags]"},
	} {
		r := runCmd(c.args...)
		require.Equal(t, 0, r.code, "%v: %s", c.args, r.stderr)
		require.True(t, strings.HasPrefix(firstLine(r), c.want), "%v: usage line %q, want %q...", c.args, firstLine(r), c.want)
	}
	require.Contains(t, runCmd("kv", "-h").stderr, "rxed kv get|del --addr IP SERVER KEY", "kv -h shows each subcommand")
	require.Contains(t, runCmd("help", "pingpong").stderr, "\n  -addr address\n", "rxed help CMD is CMD -h")
	require.Contains(t, runCmd("--help").stderr, "rxed COMMAND -h (or rxed help COMMAND) lists its flags")

	r := runCmd("help", "pingpnog")
	requireOneLineError(t, r, `rxed help: unknown command "pingpnog"`)
	require.Equal(t, 2, r.code)

	// Flags after kv get's arguments are arguments (Go's flag package);
	// the error says so instead of a bare "want SERVER KEY".
	r = runCmd("kv", "get", "--addr", "127.0.2.1", "127.0.2.2", "k", "--timeout", "1s")
	requireOneLineError(t, r, "want SERVER KEY after the flags, got 4 argument(s)", "flags after them are taken for arguments")
	require.Equal(t, 2, r.code)
}
