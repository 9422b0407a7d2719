package transport

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseFaultSpec(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want FaultConfig
	}{
		{"", FaultConfig{}},
		{"  ", FaultConfig{}},
		{"loss=0.1,dup=0.05,reorder=0.05,corrupt=0.01,delay=1ms,seed=7",
			FaultConfig{Loss: 0.1, Dup: 0.05, Reorder: 0.05, Corrupt: 0.01, Delay: time.Millisecond, Seed: 7}},
		{"loss=10%, dup = 5% ,dir=send", FaultConfig{Loss: 0.1, Dup: 0.05, Direction: DirSend}},
		{"LOSS=1,dir=recv,jitter=250us,hold=2ms,depth=3,queue=10,seed=-4",
			FaultConfig{Loss: 1, Direction: DirReceive, Jitter: 250 * time.Microsecond, ReorderHold: 2 * time.Millisecond, ReorderDepth: 3, QueueLen: 10, Seed: -4}},
		{"dir=both,loss=0", FaultConfig{}},
		{"dir=receive", FaultConfig{Direction: DirReceive}},
	} {
		got, err := ParseFaultSpec(tc.spec)
		require.NoError(t, err, tc.spec)
		require.Equal(t, tc.want, got, tc.spec)
		back, err := ParseFaultSpec(got.String())
		require.NoError(t, err)
		require.Equal(t, got, back, "round trip of %q via %q", tc.spec, got.String())
	}
}

func TestParseFaultSpecErrors(t *testing.T) {
	for _, spec := range []string{
		"loss", "loss=", "=0.1", "loss=0.1,", ",loss=0.1", "loss=0.1,,dup=0.1",
		"loss=abc", "loss=1.5", "loss=-0.1", "loss=NaN", "loss=200%", "dup=Inf",
		"delay=5", "delay=-1ms", "jitter=x", "hold=-1s", "depth=-1", "depth=1.5", "queue=-3",
		"seed=1.5", "seed=99999999999999999999", "dir=sideways",
		"loss=0.1,loss=0.2", "wat=1",
	} {
		_, err := ParseFaultSpec(spec)
		require.Error(t, err, spec)
	}
}

func TestFaultConfigString(t *testing.T) {
	c := FaultConfig{Loss: 0.25, Corrupt: 1e-3, Delay: 1500 * time.Microsecond, Seed: 7, Direction: DirSend}
	require.Equal(t, "loss=0.25,corrupt=0.001,delay=1.5ms,seed=7,dir=send", c.String())
	require.Equal(t, "", FaultConfig{}.String())
	require.True(t, c.Enabled())
	empty, err := ParseFaultSpec("seed=3,dir=send,depth=2")
	require.NoError(t, err)
	require.False(t, empty.Enabled())
	jit, _ := ParseFaultSpec("jitter=1ms")
	require.True(t, jit.Enabled())
}

func FuzzParseFaultSpec(f *testing.F) {
	for _, s := range []string{"", "loss=0.1,dup=0.05,reorder=0.05,corrupt=0.01,delay=1ms,seed=7",
		"dir=recv,jitter=1us,depth=2", "loss=5%", "x=1", "loss=0x1p-3,hold=1h2m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		cfg, err := ParseFaultSpec(spec)
		if err != nil {
			return
		}
		require.NoError(t, cfg.Validate())
		back, err := ParseFaultSpec(cfg.String())
		require.NoError(t, err, "String() = %q", cfg.String())
		require.Equal(t, cfg, back)
	})
}
