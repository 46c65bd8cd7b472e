package fabrics

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

func intp(i int) *int { return &i }

func fullOptions() Options {
	return Options{
		Transport: "tcp", Traddr: "127.0.0.1", Trsvcid: "4420",
		NQN: "nqn.2014-08.io.pathmend.test:sub1", HostNQN: "nqn.2014-08.org.nvmexpress:uuid:6f1b2c3d-0000-4000-8000-000000000001",
		HostID: "6f1b2c3d-0000-4000-8000-000000000001", HostTraddr: "127.0.0.2", HostIface: "lo",
		CtrlLossTmo: intp(-1), ReconnectDelay: intp(2), FastIOFailTmo: intp(0), KeepAliveTmo: intp(5), NrIOQueues: intp(4), QueueSize: intp(128),
		DHCHAPSecret: "DHHC-1:00:c2VjcmV0:", DHCHAPCtrlSecret: "DHHC-1:00:Y3RybA==:",
	}
}

func TestOptions_Encode(t *testing.T) {
	got, err := fullOptions().encode(false)
	if err != nil {
		t.Fatal(err)
	}
	want := "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=nqn.2014-08.io.pathmend.test:sub1," +
		"hostnqn=nqn.2014-08.org.nvmexpress:uuid:6f1b2c3d-0000-4000-8000-000000000001,hostid=6f1b2c3d-0000-4000-8000-000000000001," +
		"host_traddr=127.0.0.2,host_iface=lo,ctrl_loss_tmo=-1,reconnect_delay=2,fast_io_fail_tmo=0,keep_alive_tmo=5,nr_io_queues=4,queue_size=128," +
		"dhchap_secret=DHHC-1:00:c2VjcmV0:,dhchap_ctrl_secret=DHHC-1:00:Y3RybA==:"
	if got != want {
		t.Errorf("encode =\n%s\nwant\n%s", got, want)
	}
	s := fullOptions().String()
	if strings.Contains(s, "c2VjcmV0") || strings.Contains(s, "Y3RybA") || !strings.Contains(s, "dhchap_secret=<redacted>") {
		t.Errorf("String leaks or drops secrets: %s", s)
	}
	if ep := fullOptions().Endpoint(); ep != "tcp 127.0.0.1:4420 host_traddr=127.0.0.2 host_iface=lo" {
		t.Errorf("Endpoint = %q", ep)
	}
	v6 := Options{Transport: "tcp", Traddr: "fd00::1", Trsvcid: "4420"}
	if ep := v6.Endpoint(); ep != "tcp [fd00::1]:4420" {
		t.Errorf("IPv6 Endpoint = %q", ep)
	}
}

func TestOptions_EncodeRejects(t *testing.T) {
	for name, mutate := range map[string]func(*Options){
		"no nqn":                 func(o *Options) { o.NQN = "" },
		"no hostid":              func(o *Options) { o.HostID = "" },
		"smuggled option in nqn": func(o *Options) { o.NQN = "nqn.a:b,ctrl_loss_tmo=1" },
		"newline in traddr":      func(o *Options) { o.Traddr = "127.0.0.1\nnqn=x" },
		"comma in secret":        func(o *Options) { o.DHCHAPSecret = "DHHC-1:00:a,b:" },
	} {
		o := fullOptions()
		mutate(&o)
		if _, err := o.encode(false); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "DHHC-1") {
			t.Errorf("%s: error carries a secret: %v", name, err)
		}
	}
}

func TestParseResult(t *testing.T) {
	for in, want := range map[string]Result{
		"instance=3,cntlid=1\n":             {Instance: 3, CntlID: 1},
		"instance=12,cntlid=65519":          {Instance: 12, CntlID: 65519},
		"instance=0,cntlid=7,extra=9\n\x00": {Instance: 0, CntlID: 7},
	} {
		got, err := parseResult(in)
		if err != nil || got != want {
			t.Errorf("parseResult(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "cntlid=1", "instance=x,cntlid=1", "instance=-1"} {
		if _, err := parseResult(in); err == nil {
			t.Errorf("parseResult(%q) accepted", in)
		}
	}
}

func FuzzParseResult(f *testing.F) {
	for _, s := range []string{"instance=3,cntlid=1\n", "instance=,", "=,=", "instance=99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := parseResult(s)
		if err == nil && (r.Instance < 0 || r.Name() == "") {
			t.Fatalf("accepted %q as %+v", s, r)
		}
	})
}

func TestClassify(t *testing.T) {
	for errno, want := range map[syscall.Errno]error{
		syscall.EALREADY:     ErrAlreadyConnected,
		syscall.ECONNREFUSED: ErrUnreachable,
		syscall.ETIMEDOUT:    ErrUnreachable,
		syscall.EHOSTUNREACH: ErrUnreachable,
		syscall.EINVAL:       ErrInvalidOptions,
		syscall.EKEYREJECTED: ErrAuthFailed,
		syscall.ENOENT:       ErrNoFabrics,
	} {
		err := classify(errno)
		if !errors.Is(err, want) || !errors.Is(err, errno) {
			t.Errorf("classify(%v) = %v, want %v wrapping the errno", errno, err, want)
		}
	}
	if err := classify(syscall.EIO); !errors.Is(err, syscall.EIO) || errors.Is(err, ErrUnreachable) {
		t.Errorf("classify(EIO) = %v", err)
	}
}

// scriptedDevice stands in for /dev/nvme-fabrics: what is written goes to
// a temp file (the record), the answer or the errno is scripted.
type scriptedDevice struct {
	rec      *os.File
	answer   string
	writeErr error
	block    chan struct{}
}

func (d *scriptedDevice) Write(p []byte) (int, error) {
	if d.block != nil {
		<-d.block
	}
	if d.writeErr != nil {
		return 0, &os.PathError{Op: "write", Path: "/dev/nvme-fabrics", Err: d.writeErr}
	}
	return d.rec.Write(p)
}

func (d *scriptedDevice) Read(p []byte) (int, error) { return copy(p, d.answer), nil }
func (d *scriptedDevice) Close() error               { return nil }

func newScripted(t *testing.T, answer string, writeErr error) (*Connector, *scriptedDevice, string) {
	t.Helper()
	dir := t.TempDir()
	recPath := filepath.Join(dir, "nvme-fabrics")
	f, err := os.Create(recPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	dev := &scriptedDevice{rec: f, answer: answer, writeErr: writeErr}
	c := NewConnector(dir, sysfs.New(dir))
	c.open = func(p string) (device, error) {
		if p != recPath {
			t.Errorf("opened %s, want %s", p, recPath)
		}
		return dev, nil
	}
	return c, dev, recPath
}

func TestConnect_WritesTheOptionStringAndReadsTheAnswer(t *testing.T) {
	c, _, rec := newScripted(t, "instance=4,cntlid=2\n", nil)
	r, err := c.Connect(context.Background(), fullOptions())
	if err != nil {
		t.Fatal(err)
	}
	if r.Name() != "nvme4" || r.CntlID != 2 {
		t.Errorf("result = %+v", r)
	}
	written, _ := os.ReadFile(rec)
	want, _ := fullOptions().encode(false)
	if string(written) != want {
		t.Errorf("written %q, want %q", written, want)
	}
}

func TestConnect_MapsErrnosAndNeverLeaksSecrets(t *testing.T) {
	for errno, want := range map[syscall.Errno]error{
		syscall.EALREADY:     ErrAlreadyConnected,
		syscall.ECONNREFUSED: ErrUnreachable,
		syscall.EINVAL:       ErrInvalidOptions,
		syscall.EKEYREJECTED: ErrAuthFailed,
	} {
		c, _, _ := newScripted(t, "", errno)
		_, err := c.Connect(context.Background(), fullOptions())
		if !errors.Is(err, want) {
			t.Errorf("errno %v: %v, want %v", errno, err, want)
		}
		if strings.Contains(err.Error(), "c2VjcmV0") || strings.Contains(err.Error(), "DHHC") {
			t.Errorf("errno %v: error leaks a secret: %v", errno, err)
		}
		if !strings.Contains(err.Error(), "127.0.0.1:4420") {
			t.Errorf("errno %v: error does not name the endpoint: %v", errno, err)
		}
	}
}

func TestConnect_ReturnsWhenTheContextEnds(t *testing.T) {
	c, dev, _ := newScripted(t, "instance=1,cntlid=1", nil)
	dev.block = make(chan struct{})
	defer close(dev.block)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err := c.Connect(ctx, fullOptions())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want DeadlineExceeded", err)
	}
}

func TestConnect_NoFabricsDevice(t *testing.T) {
	dir := t.TempDir()
	c := NewConnector(dir, sysfs.New(dir)) // no nvme-fabrics file
	_, err := c.Connect(context.Background(), fullOptions())
	if !errors.Is(err, ErrNoFabrics) {
		t.Errorf("err = %v, want ErrNoFabrics", err)
	}
}

func TestDisconnectAndRescan(t *testing.T) {
	dir := t.TempDir()
	ctrl := filepath.Join(dir, "class", "nvme", "nvme3")
	os.MkdirAll(ctrl, 0o755)
	for _, f := range []string{"delete_controller", "rescan_controller"} {
		if err := os.WriteFile(filepath.Join(ctrl, f), nil, 0o200); err != nil {
			t.Fatal(err)
		}
	}
	c := NewConnector(dir, sysfs.New(dir))
	if err := c.Rescan("nvme3"); err != nil {
		t.Fatal(err)
	}
	if err := c.Disconnect("nvme3"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"delete_controller", "rescan_controller"} {
		if b, _ := os.ReadFile(filepath.Join(ctrl, f)); string(b) != "1" {
			t.Errorf("%s = %q, want 1", f, b)
		}
	}
	if err := c.Disconnect("nvme9"); err != nil {
		t.Errorf("disconnect of a vanished controller: %v", err)
	}
	if err := c.Rescan("nvme9"); err == nil {
		t.Error("rescan of a vanished controller succeeded")
	}
}

func TestHostIdentity(t *testing.T) {
	dir := t.TempDir()
	nqnP, idP := filepath.Join(dir, "etc/nvme/hostnqn"), filepath.Join(dir, "etc/nvme/hostid")
	first, err := LoadOrCreateHostIdentity(nqnP, idP)
	if err != nil {
		t.Fatal(err)
	}
	if !uuidRE.MatchString(first.ID) || first.NQN != "nqn.2014-08.org.nvmexpress:uuid:"+first.ID {
		t.Errorf("generated %+v", first)
	}
	again, err := LoadOrCreateHostIdentity(nqnP, idP)
	if err != nil || again != first {
		t.Errorf("reload = %+v, %v; want %+v", again, err, first)
	}

	// A uuid-form NQN without a hostid: the ID is taken from the NQN.
	os.Remove(idP)
	os.WriteFile(nqnP, []byte("nqn.2014-08.org.nvmexpress:uuid:0b9a3a56-4bd4-4a4c-9f5e-3f2b7c1d9e01\n"), 0o644)
	got, err := LoadOrCreateHostIdentity(nqnP, idP)
	if err != nil || got.ID != "0b9a3a56-4bd4-4a4c-9f5e-3f2b7c1d9e01" {
		t.Errorf("id from nqn = %+v, %v", got, err)
	}

	// A malformed present file is an error, never replaced.
	os.WriteFile(idP, []byte("not-a-uuid\n"), 0o644)
	if _, err := LoadOrCreateHostIdentity(nqnP, idP); err == nil {
		t.Error("malformed hostid accepted")
	}
	if b, _ := os.ReadFile(idP); string(b) != "not-a-uuid\n" {
		t.Errorf("malformed hostid rewritten: %q", b)
	}
}

// TestConnector_AWedgedDeleteIsBounded: delete_controller of a controller
// the kernel left resetting for good never returns (Debian's 6.1 after an
// nvme-tcp oops). Through a BoundedWriter, Disconnect gives up at the
// deadline with ErrWriteTimedOut instead of hanging NodeUnstage. The
// attribute here is a FIFO nobody reads: its open for writing blocks as
// the kernel's write does.
func TestConnector_AWedgedDeleteIsBounded(t *testing.T) {
	dir := t.TempDir()
	ctrl := filepath.Join(dir, "class/nvme/nvme3")
	if err := os.MkdirAll(ctrl, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(ctrl, "delete_controller")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC))
	c := NewConnector(dir, sysfs.NewBoundedWriter(sysfs.New(dir).WriteAttr, clk, time.Minute))
	done := make(chan error, 1)
	go func() { done <- c.Disconnect("nvme3") }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(time.Minute)
	if err := <-done; !errors.Is(err, sysfs.ErrWriteTimedOut) {
		t.Fatalf("disconnect of a wedged controller: %v, want ErrWriteTimedOut", err)
	}
	// Let the blocked write end: the kernel returning.
	r, err := os.OpenFile(fifo, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	b := make([]byte, 1)
	if _, err := r.Read(b); err != nil || string(b) != "1" {
		t.Errorf("the write that went on wrote %q, %v", b, err)
	}
}
