package main

import "testing"

// TestMissingBindAddressNamesTheToolsFlag: a server started with neither
// --addr nor its bind flag is told the flag its own command has. Bug
// (newcomer walkthrough of docs/tools.md): cmatose, udaddy and mckey said
// "--addr is required when the server binds any address (or give -a)",
// rping's -a, which they do not have (their bind flag is -b).
func TestMissingBindAddressNamesTheToolsFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"rping", "-s"}, "-a"},
		{[]string{"cmatose"}, "-b"},
		{[]string{"udaddy"}, "-b"},
		{[]string{"mckey", "-m", "239.1.1.1"}, "-b"},
	} {
		r := runCmd(c.args...)
		requireOneLineError(t, r, "rxed "+c.args[0]+": --addr or "+c.flag+" is required: the address this engine binds")
		if r.code != 2 {
			t.Errorf("%v: exit status %d, want 2 (a usage error)", c.args, r.code)
		}
	}
}
