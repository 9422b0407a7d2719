package mr

import (
	"strconv"
	"strings"
)

// Access is a set of IBV_ACCESS_* flags (same bit values as libibverbs and
// the kernel's IB_ACCESS_*), used for regions, windows and lookups.
type Access uint32

// Access flags. Local read access is always granted and has no flag.
const (
	LocalWrite   Access = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	RemoteWrite  Access = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	RemoteRead   Access = 1 << 2 // IBV_ACCESS_REMOTE_READ
	RemoteAtomic Access = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	MWBind       Access = 1 << 4 // IBV_ACCESS_MW_BIND
	// ZeroBased makes a memory window addressed by offsets from 0 instead
	// of by virtual addresses (IBV_ACCESS_ZERO_BASED). Windows only, as rxe.
	ZeroBased Access = 1 << 5
	// OnDemand is IBV_ACCESS_ON_DEMAND; rejected (no ODP here).
	OnDemand Access = 1 << 6
	// HugeTLB is IBV_ACCESS_HUGETLB; rejected.
	HugeTLB Access = 1 << 7
	// FlushGlobal allows RDMA FLUSH to the global visibility point.
	FlushGlobal Access = 1 << 8
	// FlushPersistent allows RDMA FLUSH to persistence; only regions over a
	// writable file mapping qualify (their Persist is an msync).
	FlushPersistent Access = 1 << 9
	// RelaxedOrdering is IBV_ACCESS_RELAXED_ORDERING, the first of the
	// optional flags a provider may ignore; accepted and ignored.
	RelaxedOrdering Access = 1 << 20
)

// RemoteAccess is every right a peer can be granted through an rkey.
const RemoteAccess = RemoteWrite | RemoteRead | RemoteAtomic

// optionalAccess is the IBV_ACCESS_OPTIONAL_RANGE: bits a provider ignores
// when it does not implement them.
const optionalAccess Access = 0x3ff << 20

// mrSupported is what rxe accepts on a memory region (RXE_ACCESS_SUPPORTED_MR
// minus on-demand paging, which needs a page-fault path we do not have).
const mrSupported = LocalWrite | RemoteWrite | RemoteRead | RemoteAtomic | MWBind |
	FlushGlobal | FlushPersistent | optionalAccess

// mwSupported is what rxe accepts when binding a window (RXE_ACCESS_SUPPORTED_MW).
const mwSupported = mrSupported | ZeroBased

var accessNames = [...]struct {
	a    Access
	name string
}{
	{LocalWrite, "LOCAL_WRITE"},
	{RemoteWrite, "REMOTE_WRITE"},
	{RemoteRead, "REMOTE_READ"},
	{RemoteAtomic, "REMOTE_ATOMIC"},
	{MWBind, "MW_BIND"},
	{ZeroBased, "ZERO_BASED"},
	{OnDemand, "ON_DEMAND"},
	{HugeTLB, "HUGETLB"},
	{FlushGlobal, "FLUSH_GLOBAL"},
	{FlushPersistent, "FLUSH_PERSISTENT"},
	{RelaxedOrdering, "RELAXED_ORDERING"},
}

// String lists the flags with libibverbs' names joined by '|'; "0" for none.
func (a Access) String() string {
	if a == 0 {
		return "0"
	}
	var sb strings.Builder
	rest := a
	for _, n := range accessNames {
		if a&n.a == 0 {
			continue
		}
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		sb.WriteString(n.name)
		rest &^= n.a
	}
	if rest != 0 {
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		sb.WriteString("0x" + strconv.FormatUint(uint64(rest), 16))
	}
	return sb.String()
}

// Has reports whether every flag of need is in a.
func (a Access) Has(need Access) bool { return a&need == need }

// checkMRAccess applies ib_check_mr_access's rules to region access flags.
func checkMRAccess(a Access) error {
	// IBA and ib_check_mr_access: remote write or atomic lets a peer
	// change memory, which the owner itself must be allowed to do.
	if a&(RemoteWrite|RemoteAtomic) != 0 && a&LocalWrite == 0 {
		return wrapf(ErrAccessCombo, "access %v: REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE", a)
	}
	if bad := a &^ mrSupported; bad != 0 {
		return wrapf(ErrUnsupportedAccess, "access %v: %v not supported on a memory region", a, bad)
	}
	return nil
}
