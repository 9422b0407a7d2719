package rdmacm_test

import (
	"testing"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/stretchr/testify/require"
)

// TestNilConnParamRetriesAsLibrdmacm: Dial and Accept given a nil
// *ConnParam, as the package doc's example does, set up both QPs with
// retry count 7 and RNR retry count 7, librdmacm's values for a NULL
// conn_param (ucma_copy_conn_param_to_kern), and an explicit zero
// ConnParam still means none. Bug (found by the RPC adopter's test,
// TestConnSharedByManyPosters): nil meant zero retries, so a client
// whose sends outran the server's receives failed with RNR_RETRY_EXC_ERR
// at the first RNR NAK, and over a lossy network the first lost packet
// failed the connection's work with RETRY_EXC_ERR.
func TestNilConnParamRetriesAsLibrdmacm(t *testing.T) {
	for _, tc := range []struct {
		name          string
		p             *rdmacm.ConnParam
		retry, rnrTry uint8
	}{
		{"nil", nil, 7, 7},
		{"zero", &rdmacm.ConnParam{}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := memHosts(t, nil, "10.54.0.1", "10.54.0.2")
			srv, cli := hs[0], hs[1]
			ctx := testCtx(t)
			l, err := rdmacm.Listen(srv.dev, ap("10.54.0.1:7471"), nil)
			require.NoError(t, err)
			defer l.Close()
			sq := srv.qp(ib.RC)
			accepted := make(chan error, 1)
			go func() {
				req, err := l.Accept(ctx)
				if err == nil {
					_, err = req.Accept(ctx, sq, tc.p)
				}
				accepted <- err
			}()
			cq := cli.qp(ib.RC)
			_, err = rdmacm.Dial(ctx, cq, ap("10.54.0.1:7471"), tc.p)
			require.NoError(t, err)
			require.NoError(t, <-accepted)
			for side, q := range map[string]*ib.QP{"Dial": cq, "Accept": sq} {
				attr, _, err := q.Query()
				require.NoError(t, err)
				require.Equal(t, tc.retry, attr.RetryCnt, "%s's retry count", side)
				require.Equal(t, tc.rnrTry, attr.RNRRetry, "%s's RNR retry count", side)
			}
		})
	}
}
