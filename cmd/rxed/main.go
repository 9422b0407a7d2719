// Command rxed is a userspace Soft-RoCE (RoCEv2) daemon and its operator tools.
//
// Every subcommand lives in its own file (cmd_<name>.go) and registers itself
// with register() from an init function, so subcommands can be added without
// touching this file.
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
)

// command is one rxed subcommand. run receives the arguments after the
// command name and returns the process exit status.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("rxed: duplicate command " + c.name)
	}
	commands[c.name] = c
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: rxed COMMAND [flags] [args]")
	fmt.Fprintln(w, "commands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "rxed COMMAND -h (or rxed help COMMAND) lists its flags and arguments; docs/tools.md has examples")
}

func main() {
	setMaxProcs = runtime.GOMAXPROCS // cpus.go
	// exit (interrupt.go) lets an interrupt that is closing the engine
	// give the status.
	exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	// rxed help COMMAND [SUB] is COMMAND [SUB] -h, as go help and git
	// help go on to the command's own help (it printed the list again).
	if len(args) > 1 && args[0] == "help" {
		c, ok := commands[args[1]]
		if !ok {
			fmt.Fprintf(stderr, "rxed help: unknown command %q (rxed help lists them)\n", args[1])
			return 2
		}
		return c.run(append(args[2:], "-h"), stdout, stderr)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "rxed: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(args[1:], stdout, stderr)
}
