package mr_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/rxed/rxed/pkg/mr"
)

// A responder resolving an RDMA WRITE and an atomic against a registered
// buffer.
func ExampleTable_Lookup() {
	tb := mr.NewTable(nil) // crypto/rand key parts
	pd, _ := tb.AllocPD()
	buf := make([]byte, 4096)
	region, err := tb.RegMR(pd, buf, mr.LocalWrite|mr.RemoteWrite|mr.RemoteAtomic)
	if err != nil {
		panic(err)
	}

	// RETH: va, rkey, length from the peer.
	reg, err := tb.Lookup(region.RKey(), mr.RKey, pd, region.IOVA()+16, 5, mr.RemoteWrite)
	if err != nil {
		panic(err)
	}
	copy(reg.Bytes(), "hello")
	reg.Release()
	fmt.Println(string(buf[16:21]))

	// AtomicETH: FetchAdd at an aligned address.
	reg, _ = tb.Lookup(region.RKey(), mr.RKey, pd, region.IOVA()+64, 8, mr.RemoteAtomic)
	fmt.Println(mr.FetchAdd(reg.Bytes(), 5), mr.FetchAdd(reg.Bytes(), 5))
	reg.Release()

	// A read was not granted: the responder NAKs with a remote access error.
	_, err = tb.Lookup(region.RKey(), mr.RKey, pd, region.IOVA(), 8, mr.RemoteRead)
	fmt.Println(err, mr.RemoteNAK(err))

	// After deregistration the key is stale.
	key := region.RKey()
	_ = region.Dereg()
	_, err = tb.Lookup(key, mr.RKey, pd, region.IOVA(), 8, mr.RemoteWrite)
	fmt.Println(errors.Is(err, mr.ErrInvalidKey))
	// Output:
	// hello
	// 0 5
	// mr: access not permitted 2
	// true
}

// Exporting a file: writes through the region reach the file.
func ExampleMapFile() {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("rxed-example-%d", os.Getpid()))
	defer os.Remove(path)
	_ = os.WriteFile(path, make([]byte, 4096), 0o600)

	m, err := mr.MapFile(path, 4096, true)
	if err != nil {
		panic(err)
	}
	tb := mr.NewTable(nil)
	pd, _ := tb.AllocPD()
	region, _ := tb.RegMR(pd, m.Bytes(), mr.LocalWrite|mr.RemoteWrite, mr.WithIOVA(0), mr.WithMapping(m))

	reg, _ := tb.Lookup(region.RKey(), mr.RKey, pd, 100, 4, mr.RemoteWrite)
	copy(reg.Bytes(), "rxed")
	reg.Release()

	_ = region.Dereg()
	_ = m.Sync()
	_ = m.Close()
	data, _ := os.ReadFile(path)
	fmt.Println(string(data[100:104]))
	// Output: rxed
}

// Binding a type 2 window with a BIND_MW work request and invalidating it
// remotely (SEND_WITH_INV).
func ExampleTable_BindMW() {
	tb := mr.NewTable(nil)
	pd, _ := tb.AllocPD()
	buf := make([]byte, 256)
	region, _ := tb.RegMR(pd, buf, mr.LocalWrite|mr.MWBind)
	w, _ := tb.AllocMW(pd, mr.MWType2)
	const qpn = 0x11

	rkey, err := tb.BindMW(pd, qpn, mr.Bind{
		MWKey: w.RKey(), NewKey: mr.IncKey(w.RKey()), MRKey: region.LKey(),
		Addr: region.IOVA() + 128, Length: 64, Access: mr.RemoteRead | mr.ZeroBased,
	})
	if err != nil {
		panic(err)
	}
	reg, err := tb.LookupQP(rkey, mr.RKey, pd, qpn, 0, 64, mr.RemoteRead) // zero based
	fmt.Println(err, reg.Len())
	reg.Release()

	fmt.Println(tb.Invalidate(pd, qpn, rkey))
	_, err = tb.LookupQP(rkey, mr.RKey, pd, qpn, 0, 64, mr.RemoteRead)
	fmt.Println(err)
	// Output:
	// <nil> 64
	// <nil>
	// mr: key invalidated
}
