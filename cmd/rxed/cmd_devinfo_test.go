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

// rxed devinfo -v prints device_cap_flags as ibv_devinfo -v does on an
// rxe device: after max_qp_wr, the word, then a line per flag in
// print_device_cap_flags's order (it printed none; QueryDevice said 0).
func TestDevinfoVerboseCapFlags(t *testing.T) {
	var out, errb bytes.Buffer
	require.Equal(t, 0, runDevinfo([]string{"--addr", "127.0.0.1", "-v"}, &out, &errb), errb.String())
	want := "\tmax_qp_wr:\t\t\t16384\n" +
		"\tdevice_cap_flags:\t\t0x01a23c76\n" +
		"\t\t\t\t\tBAD_PKEY_CNTR\n\t\t\t\t\tBAD_QKEY_CNTR\n\t\t\t\t\tAUTO_PATH_MIG\n" +
		"\t\t\t\t\tCHANGE_PHY_PORT\n\t\t\t\t\tUD_AV_PORT_ENFORCE\n\t\t\t\t\tPORT_ACTIVE_EVENT\n" +
		"\t\t\t\t\tSYS_IMAGE_GUID\n\t\t\t\t\tRC_RNR_NAK_GEN\n\t\t\t\t\tSRQ_RESIZE\n" +
		"\t\t\t\t\tMEM_WINDOW\n\t\t\t\t\tMEM_MGT_EXTENSIONS\n" +
		"\t\t\t\t\tMEM_WINDOW_TYPE_2A\n\t\t\t\t\tMEM_WINDOW_TYPE_2B\n" +
		"\tmax_sge:\t\t\t32\n"
	require.Contains(t, out.String(), want)
	require.Equal(t, "0x80000000\n\t\t\t\t\tUnknown flags: 0x80000000", capFlags(1<<31))
}
