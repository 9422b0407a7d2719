package daemon

import "github.com/rxed/rxed/pkg/oob"

// servesTest is the daemon's verdict on the test an rxed client announces
// in its version message (oob.ExtConfig.Serves). The daemon plays the
// idle server of a bandwidth test against its export: a latency test
// needs a server that answers each message, a send test one that posts
// receives, and a read-only export takes no WRITE or atomic. Refusing in
// the version reply tells the client why, at once; a perftest client
// announces nothing and is refused later, at its first key message (send
// tests) or not at all (latency tests, which then time out).
func (d *Daemon) servesTest(t oob.Test) oob.ExtStatus {
	switch {
	case t.Latency || t.Verb == oob.VerbSend:
		return oob.ExtUnsupportedTest
	case d.target.Spec.ReadOnly && t.Verb != oob.VerbRead:
		return oob.ExtReadOnlyExport
	}
	return oob.ExtOK
}
