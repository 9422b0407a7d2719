package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// rxed devinfo -v prints the multicast limits with ibv_devinfo -v's names, tabs and order
// (after max_mw, before max_srq); without -v it prints no limits.
func TestDevinfoVerboseMcastLimits(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runDevinfo([]string{"--addr", "127.0.0.1", "-v"}, &out, &errb), errb.String())
	s := out.String()
	want := "\tmax_mw:\t\t\t4096\n" +
		"\tmax_mcast_grp:\t\t\t8192\n" +
		"\tmax_mcast_qp_attach:\t\t56\n" +
		"\tmax_total_mcast_qp_attach:\t458752\n" +
		"\tmax_srq:\t\t\t16384\n"
	require.Contains(t, s, want)

	out.Reset()
	require.Equal(t, 0, runDevinfo([]string{"--addr", "127.0.0.1"}, &out, &errb), errb.String())
	require.False(t, strings.Contains(out.String(), "max_mcast_grp"), out.String())
	require.Contains(t, out.String(), "hca_id:\trxed0\n")
}
