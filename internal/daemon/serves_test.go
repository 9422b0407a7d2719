package daemon

import (
	"testing"

	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// TestServesTest (issue 15): the tests the daemon refuses in the version
// reply, so an rxed client learns why at once.
func TestServesTest(t *testing.T) {
	rw := &Daemon{target: &Export{Spec: ExportSpec{Name: "rw"}}}
	ro := &Daemon{target: &Export{Spec: ExportSpec{Name: "ro", ReadOnly: true}}}
	for _, c := range []struct {
		d    *Daemon
		test oob.Test
		want oob.ExtStatus
	}{
		{rw, oob.Test{Verb: oob.VerbWrite}, oob.ExtOK},
		{rw, oob.Test{Verb: oob.VerbRead}, oob.ExtOK},
		{rw, oob.Test{Verb: oob.VerbAtomic}, oob.ExtOK},
		{rw, oob.Test{Verb: oob.VerbWrite, Latency: true}, oob.ExtUnsupportedTest},
		{rw, oob.Test{Verb: oob.VerbRead, Latency: true}, oob.ExtUnsupportedTest},
		{rw, oob.Test{Verb: oob.VerbSend}, oob.ExtUnsupportedTest},
		{ro, oob.Test{Verb: oob.VerbRead}, oob.ExtOK},
		{ro, oob.Test{Verb: oob.VerbWrite}, oob.ExtReadOnlyExport},
		{ro, oob.Test{Verb: oob.VerbAtomic}, oob.ExtReadOnlyExport},
		{ro, oob.Test{Verb: oob.VerbSend}, oob.ExtUnsupportedTest},
	} {
		require.Equal(t, c.want, c.d.servesTest(c.test), "%s export, %v", c.d.target.Spec.Name, c.test)
	}
}
