//go:build linux

package interop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Network layout of the private namespace. Nothing in it has a route to the outside.
const (
	Netns     = "rxedlab"
	Bridge    = "rxedbr0"
	HostVeth  = "rxedh0"  // rxed's interface (holds HostIP); its peer HostPort is a bridge port
	HostPort  = "rxedh0p" // bridge side of HostVeth
	HostIP    = "10.78.0.1"
	HostIP6   = "fd78::1"
	netPrefix = "10.78.0"
)

// VM is one rdma_rxe guest.
type VM struct {
	Index     int
	IP, IP6   string
	Tap       string
	GID4      int // GID index of the IPv4 RoCEv2 GID
	GID6      int // GID index of the IPv6 RoCEv2 GID
	Console   string
	BootTime  time.Duration
	qemu      *exec.Cmd
	sshMaster *exec.Cmd
	ctlPath   string
}

// Lab is the namespace, its bridge, and the guests on it.
type Lab struct {
	Img   string // directory with vmlinuz, initrd.img, base.img (build.sh's IMG)
	Cache string // /var/tmp/rxed-interop: ssh key, run/ state
	Accel string // "kvm" or "tcg"
	MemMB int
	Log   io.Writer
	VMs   []*VM

	run  string
	mtu  int
	mu   sync.Mutex
	down bool
}

func (l *Lab) logf(format string, a ...any) {
	if l.Log != nil {
		fmt.Fprintf(l.Log, "[lab] "+format+"\n", a...)
	}
}

// PickAccel returns "kvm" when /dev/kvm is usable for a stock kernel, else "tcg". A PVM host
// (kvm_pvm loaded) has a /dev/kvm that only runs PVM-enabled guest kernels.
func PickAccel() string {
	if v := os.Getenv("RXED_INTEROP_ACCEL"); v != "" {
		return v
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg"
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "tcg"
	}
	return "kvm"
}

// sh runs a host command and returns its combined output.
func sh(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// nsh runs a command inside the namespace.
func nsh(ctx context.Context, args ...string) (string, error) {
	return sh(ctx, "ip", append([]string{"netns", "exec", Netns}, args...)...)
}

// childAttr makes children die with the harness (SIGKILL when it exits, however it exits) and
// puts each in its own process group.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// stopCmd ends a child started by the harness: SIGTERM, then SIGKILL after a grace period.
func stopCmd(c *exec.Cmd) {
	if c == nil || c.Process == nil || c.ProcessState != nil {
		return
	}
	_ = c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		_ = c.Process.Kill()
		<-done
	}
}

// Cleanup removes what an earlier, killed run may have left: the namespace (its bridge, veth
// and taps go with it). Guests and tools of earlier runs died with their harness (Pdeathsig).
func Cleanup(ctx context.Context) {
	if out, _ := sh(ctx, "ip", "netns", "list"); nsListed(out) {
		_, _ = sh(ctx, "ip", "netns", "del", Netns)
	}
}

func nsListed(list string) bool {
	for _, l := range strings.Split(list, "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == Netns {
			return true
		}
	}
	return false
}

// SetupNet creates the namespace: bridge, rxed's veth with HostIP/HostIP6, one tap per guest.
func (l *Lab) SetupNet(ctx context.Context, nvm int) error {
	Cleanup(ctx)
	l.run = filepath.Join(l.Cache, "run")
	if err := os.MkdirAll(l.run, 0o755); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "netns", "add", Netns},
		{"ip", "-n", Netns, "link", "set", "lo", "up"},
		{"ip", "-n", Netns, "link", "add", Bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"ip", "-n", Netns, "link", "set", Bridge, "addrgenmode", "none"},
		{"ip", "-n", Netns, "link", "add", HostVeth, "type", "veth", "peer", "name", HostPort},
		{"ip", "-n", Netns, "link", "set", HostPort, "addrgenmode", "none"},
		{"ip", "-n", Netns, "link", "set", HostPort, "master", Bridge, "up"},
		{"ip", "-n", Netns, "addr", "add", HostIP + "/24", "dev", HostVeth},
		{"ip", "-n", Netns, "-6", "addr", "add", HostIP6 + "/64", "dev", HostVeth, "nodad"},
		{"ip", "-n", Netns, "link", "set", HostVeth, "up"},
		{"ip", "-n", Netns, "link", "set", Bridge, "up"},
		// multicast cells (runner_mcast.go): the bridge floods multicast to every port instead
		// of learning from IGMP reports (nothing here is a querier), rxed's extra receiver
		// addresses, and a route for the groups out of rxed's veth
		{"ip", "-n", Netns, "link", "set", Bridge, "type", "bridge", "mcast_snooping", "0"},
		{"ip", "-n", Netns, "addr", "add", HostIP2 + "/24", "dev", HostVeth},
		{"ip", "-n", Netns, "addr", "add", HostIP3 + "/24", "dev", HostVeth},
		{"ip", "-n", Netns, "route", "add", "224.0.0.0/4", "dev", HostVeth},
	}
	l.VMs = nil
	for i := 1; i <= nvm; i++ {
		vm := &VM{Index: i, IP: fmt.Sprintf("%s.%d", netPrefix, 10+i), IP6: fmt.Sprintf("fd78::%d", 10+i),
			Tap: fmt.Sprintf("rxedtap%d", i), GID4: -1, GID6: -1}
		l.VMs = append(l.VMs, vm)
		steps = append(steps,
			[]string{"ip", "-n", Netns, "tuntap", "add", "dev", vm.Tap, "mode", "tap"},
			[]string{"ip", "-n", Netns, "link", "set", vm.Tap, "addrgenmode", "none"},
			[]string{"ip", "-n", Netns, "link", "set", vm.Tap, "master", Bridge, "up"})
	}
	for _, s := range steps {
		if _, err := sh(ctx, s[0], s[1:]...); err != nil {
			return err
		}
	}
	l.mtu = 1500
	l.logf("netns %s: bridge %s, %s %s/%s, %d tap(s)", Netns, Bridge, HostVeth, HostIP, HostIP6, nvm)
	return nil
}

// Boot starts every guest (in parallel) and waits until each has sshd up, rxe0 PORT_ACTIVE and
// its RoCEv2 GIDs listed.
func (l *Lab) Boot(ctx context.Context) error {
	for _, vm := range l.VMs {
		if err := l.startVM(ctx, vm); err != nil {
			return err
		}
	}
	t0 := time.Now()
	errs := make(chan error, len(l.VMs))
	for _, vm := range l.VMs {
		go func() { errs <- l.waitVM(ctx, vm, t0) }()
	}
	var first error
	for range l.VMs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// startVM starts vm's qemu on a fresh copy-on-write overlay of the base image.
func (l *Lab) startVM(ctx context.Context, vm *VM) error {
	vm.Console = filepath.Join(l.run, fmt.Sprintf("vm%d.console", vm.Index))
	overlay := filepath.Join(l.run, fmt.Sprintf("vm%d.qcow2", vm.Index))
	_ = os.Remove(overlay)
	if _, err := sh(ctx, "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", filepath.Join(l.Img, "base.img"), overlay); err != nil {
		return err
	}
	accel := []string{"-accel", l.Accel, "-cpu", "max"}
	if l.Accel == "kvm" {
		accel = []string{"-accel", "kvm", "-cpu", "host"}
	}
	args := append([]string{"netns", "exec", Netns, "qemu-system-x86_64"}, accel...)
	args = append(args,
		"-m", strconv.Itoa(l.MemMB), "-smp", "1", "-name", fmt.Sprintf("rxedvm%d", vm.Index),
		"-kernel", filepath.Join(l.Img, "vmlinuz"), "-initrd", filepath.Join(l.Img, "initrd.img"),
		"-append", fmt.Sprintf("console=ttyS0 root=/dev/vda rw net.ifnames=0 init=/sbin/rxed-interop-init rxed.name=rxevm%d rxed.ip=%s/24 rxed.ip6=%s/64",
			vm.Index, vm.IP, vm.IP6),
		"-drive", "file="+overlay+",if=virtio,format=qcow2,cache=unsafe",
		"-netdev", "tap,id=n0,ifname="+vm.Tap+",script=no,downscript=no",
		"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:78:00:%02x", 10+vm.Index),
		"-device", "virtio-rng-pci",
		"-display", "none", "-serial", "file:"+vm.Console, "-monitor", "none", "-no-reboot")
	cmd := exec.Command("ip", args...)
	cmd.SysProcAttr = childAttr()
	var errb bytes.Buffer
	cmd.Stderr = &errb
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("qemu: %w", err)
	}
	vm.qemu = cmd
	vm.ctlPath = filepath.Join(l.run, fmt.Sprintf("vm%d.ssh", vm.Index))
	l.logf("vm%d booting: %s (%s), console %s", vm.Index, vm.IP, l.Accel, vm.Console)
	return nil
}

// Reboot replaces vm by a freshly booted guest (a new overlay of the base image, as Boot
// starts it) and waits until it is up; the guest's link MTU is set back to the lab's. It is
// how the harness recovers a guest whose kernel a scenario panicked (guest_crash.go). The
// old console is moved to keepConsole (a run's log directory) unless that is "". Loss set by
// SetLoss is not restored.
func (l *Lab) Reboot(ctx context.Context, vm *VM, keepConsole string) error {
	l.mu.Lock()
	if l.down {
		l.mu.Unlock()
		return errors.New("lab: torn down")
	}
	stopCmd(vm.sshMaster)
	stopCmd(vm.qemu)
	vm.sshMaster, vm.qemu = nil, nil
	if keepConsole != "" {
		if err := os.Rename(vm.Console, keepConsole); err != nil {
			l.logf("vm%d: keeping the console: %v", vm.Index, err)
		}
	}
	l.logf("vm%d rebooting", vm.Index)
	err := l.startVM(ctx, vm)
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if err := l.waitVM(ctx, vm, time.Now()); err != nil {
		return err
	}
	if l.mtu != 1500 {
		return l.setGuestMTU(ctx, vm, l.mtu)
	}
	return nil
}

func (l *Lab) waitVM(ctx context.Context, vm *VM, t0 time.Time) error {
	key := filepath.Join(l.Cache, "ssh", "id_ed25519")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	tail := func() string {
		b, _ := os.ReadFile(vm.Console)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		return strings.Join(lines[max(0, len(lines)-20):], "\n")
	}
	if err := awaitConsole(ctx, vm, "interop-init: READY"); err != nil {
		return fmt.Errorf("vm%d: booting: %w; console:\n%s", vm.Index, err, tail())
	}
	// one multiplexed ssh connection per guest: every later command reuses it (a fresh ssh
	// handshake costs about a second under TCG)
	for {
		m := exec.Command("ip", "netns", "exec", Netns, "ssh", "-M", "-N", "-S", vm.ctlPath,
			"-i", key, "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
			"-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5", "-o", "BatchMode=yes",
			"-o", "ServerAliveInterval=5", "root@"+vm.IP)
		m.SysProcAttr = childAttr()
		_ = os.Remove(vm.ctlPath)
		if err := m.Start(); err != nil {
			return err
		}
		ok := false
		for range 50 {
			if _, err := os.Stat(vm.ctlPath); err == nil {
				ok = true
				break
			}
			if !alive(m) {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if ok {
			vm.sshMaster = m
			break
		}
		stopCmd(m)
		select {
		case <-ctx.Done():
			return fmt.Errorf("vm%d: ssh: %w", vm.Index, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	out, err := l.Guest(ctx, vm, `for i in $(seq 150); do ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE && break; sleep 0.2; done
ibv_devinfo -d rxe0 | grep -q PORT_ACTIVE || { echo "rxe0 not active"; exit 1; }
cd /sys/class/infiniband/rxe0/ports/1/gids && grep -H . 0 1 2 3 4 5 6 7 2>/dev/null`, time.Minute)
	if err != nil {
		return fmt.Errorf("vm%d: %w\n%s", vm.Index, err, out)
	}
	vm.GID4, vm.GID6 = ParseGIDs(out, netip.MustParseAddr(vm.IP), netip.MustParseAddr(vm.IP6))
	if vm.GID4 < 0 || vm.GID6 < 0 {
		return fmt.Errorf("vm%d: RoCEv2 GIDs for %s/%s not found in:\n%s", vm.Index, vm.IP, vm.IP6, out)
	}
	vm.BootTime = time.Since(t0)
	l.logf("vm%d up after %.1fs: rxe0 active, GID %d = ::ffff:%s, GID %d = %s", vm.Index, vm.BootTime.Seconds(), vm.GID4, vm.IP, vm.GID6, vm.IP6)
	return nil
}

// awaitConsole waits until vm's serial console holds marker (read every 500 ms). It fails
// when ctx ends first, or when qemu exits without the marker on the console.
func awaitConsole(ctx context.Context, vm *VM, marker string) error {
	for {
		b, _ := os.ReadFile(vm.Console)
		if bytes.Contains(b, []byte(marker)) {
			return nil
		}
		if vm.qemu == nil || vm.qemu.ProcessState != nil || !alive(vm.qemu) {
			return fmt.Errorf("qemu exited before %q reached the console", marker)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no %q on the console: %w", marker, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func alive(c *exec.Cmd) bool {
	return c.Process != nil && c.Process.Signal(syscall.Signal(0)) == nil && !zombie(c.Process.Pid)
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z'
	}
	return false
}

// guestCmd builds the ssh command that runs script in vm over the multiplexed connection.
func (l *Lab) guestCmd(ctx context.Context, vm *VM, script string) *exec.Cmd {
	c := exec.CommandContext(ctx, "ssh", "-S", vm.ctlPath, "-o", "ControlMaster=no", "-o", "BatchMode=yes",
		"-o", "LogLevel=ERROR", "root@"+vm.IP, script)
	c.SysProcAttr = childAttr()
	c.WaitDelay = 2 * time.Second
	return c
}

// Guest runs a shell script in vm and returns its combined output.
func (l *Lab) Guest(ctx context.Context, vm *VM, script string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := l.guestCmd(ctx, vm, script).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vm%d: %q: %w", vm.Index, firstLine(script), err)
	}
	return string(out), nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// SetMTU sets the link MTU of every device on the bridge and in the guests, and waits until
// rxe0's active_mtu follows (9000 bytes gives IB MTU 4096, 1500 gives 1024).
func (l *Lab) SetMTU(ctx context.Context, mtu int) error {
	if mtu == l.mtu {
		return nil
	}
	m := strconv.Itoa(mtu)
	devs := []string{HostVeth, HostPort}
	for _, vm := range l.VMs {
		devs = append(devs, vm.Tap)
	}
	if mtu < l.mtu {
		devs = append([]string{Bridge}, devs...) // a bridge cannot exceed its ports' MTU: shrink it first
	}
	for _, d := range devs {
		if _, err := sh(ctx, "ip", "-n", Netns, "link", "set", d, "mtu", m); err != nil {
			return err
		}
	}
	if mtu > l.mtu {
		if _, err := sh(ctx, "ip", "-n", Netns, "link", "set", Bridge, "mtu", m); err != nil {
			return err
		}
	}
	for _, vm := range l.VMs {
		if err := l.setGuestMTU(ctx, vm, mtu); err != nil {
			return err
		}
	}
	l.mtu = mtu
	l.logf("link MTU %d (rxe active_mtu %s)", mtu, rxeMTU(mtu))
	return nil
}

// rxeMTU is the active_mtu rxe derives from a link MTU (the largest IB MTU that fits with
// the RoCEv2 headers).
func rxeMTU(mtu int) string {
	if mtu >= 4200 {
		return "4096"
	}
	return "1024"
}

// setGuestMTU sets vm's eth0 MTU and waits until rxe0's active_mtu follows.
func (l *Lab) setGuestMTU(ctx context.Context, vm *VM, mtu int) error {
	want := rxeMTU(mtu)
	out, err := l.Guest(ctx, vm, fmt.Sprintf(`ip link set eth0 mtu %d
for i in $(seq 50); do ibv_devinfo -d rxe0 | grep -q 'active_mtu:.*%s' && exit 0; sleep 0.2; done
ibv_devinfo -d rxe0 | grep mtu; exit 1`, mtu, want), 30*time.Second)
	if err != nil {
		return fmt.Errorf("vm%d: rxe0 active_mtu did not become %s: %w\n%s", vm.Index, want, err, out)
	}
	return nil
}

// SetLoss adds tc netem loss (percent; 0 removes it) inside guest 1, on eth0's egress and, via
// an ifb device, on its ingress: every packet between the guest under test and its peer meets
// one lossy queue in each direction. (It is done in the guest because the host kernel need not
// have sch_netem; the Debian guest kernel does.)
func (l *Lab) SetLoss(ctx context.Context, pct float64) error {
	vm := l.VMs[0]
	script := `tc qdisc del dev eth0 root 2>/dev/null; tc qdisc del dev eth0 ingress 2>/dev/null; tc qdisc del dev ifb0 root 2>/dev/null; true`
	if pct > 0 {
		loss := fmt.Sprintf("%g%%", pct)
		script = `set -e
modprobe sch_netem; modprobe ifb numifbs=1; modprobe act_mirred; modprobe cls_matchall
ip link set ifb0 mtu $(cat /sys/class/net/eth0/mtu) up
tc qdisc replace dev eth0 root netem loss ` + loss + `
tc qdisc replace dev ifb0 root netem loss ` + loss + `
tc qdisc add dev eth0 handle ffff: ingress
tc filter add dev eth0 parent ffff: matchall action mirred egress redirect dev ifb0`
	}
	if out, err := l.Guest(ctx, vm, script, 30*time.Second); err != nil {
		return fmt.Errorf("%w: %s", err, out)
	}
	return nil
}

// Teardown stops the guests and ssh masters and deletes the namespace. Safe to call twice.
func (l *Lab) Teardown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.down {
		return
	}
	l.down = true
	for _, vm := range l.VMs {
		stopCmd(vm.sshMaster)
		stopCmd(vm.qemu)
		vm.sshMaster, vm.qemu = nil, nil
		if l.run != "" {
			_ = os.Remove(filepath.Join(l.run, fmt.Sprintf("vm%d.qcow2", vm.Index)))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	Cleanup(ctx)
	l.logf("torn down: guests stopped, netns %s deleted", Netns)
}

// ErrSkip marks a precondition that is missing (not root, no qemu): the harness skips, or fails
// under CI=true.
var ErrSkip = errors.New("interop: cannot run here")
