package daemon

import (
	"errors"
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/stretchr/testify/require"
)

// The final key of perftest -R's exchange is the server's answer; the
// client disconnects as soon as it has read it. When the client's ACK for
// it is lost (TestPerfRDMACM/write_bw_faults: 2% loss, about one run in
// three), the server's QP is flushed by the disconnection before the SEND
// completes, and the server used to fail with "control QP completion
// WR_FLUSH_ERR" after a successful run. A flush after the connection ended
// completes the send; any other failed completion, or a flush while the
// connection is up, is still an error.
func TestCMControlFlushAfterDisconnect(t *testing.T) {
	ended := make(chan struct{})
	close(ended)
	for _, c := range []struct {
		name    string
		done    chan struct{}
		wcs     []ib.WC
		wantErr bool
	}{
		{"send and receives flushed after the peer left", ended,
			[]ib.WC{{ID: cmCtrlSend, Status: ib.WCWRFlushErr}, {ID: 1, Status: ib.WCWRFlushErr}, {ID: 2, Status: ib.WCWRFlushErr}}, false},
		{"send flushed while connected", make(chan struct{}),
			[]ib.WC{{ID: cmCtrlSend, Status: ib.WCWRFlushErr}}, true},
		{"send flushed before any connection", nil,
			[]ib.WC{{ID: cmCtrlSend, Status: ib.WCWRFlushErr}}, true},
		{"another error after the peer left", ended,
			[]ib.WC{{ID: cmCtrlSend, Status: ib.WCRetryExcErr}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctl := &CMControl{peer: "192.0.2.1:18515", sendBusy: true}
			if c.done != nil {
				ctl.done = c.done
			}
			n := copy(ctl.wcs[:], c.wcs)
			err := ctl.handle(n, "key message")
			if c.wantErr {
				require.Error(t, err)
				require.True(t, errors.Is(err, oob.ErrClosed), "%v", err)
				return
			}
			require.NoError(t, err)
			require.False(t, ctl.sendBusy, "the send is complete")
			require.Empty(t, ctl.inbox, "flushed receives carry nothing")
		})
	}
}
