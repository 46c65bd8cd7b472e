package fabrics

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

// Typed connect errors. Callers branch on them with errors.Is; the
// underlying errno stays in the chain.
var (
	// ErrAlreadyConnected: the kernel already has a controller to this
	// endpoint for this host (EALREADY).
	ErrAlreadyConnected = errors.New("already connected")
	// ErrUnreachable: the target did not answer (ECONNREFUSED, ETIMEDOUT,
	// EHOSTUNREACH, ENETUNREACH, ECONNRESET).
	ErrUnreachable = errors.New("target unreachable")
	// ErrInvalidOptions: the kernel rejected the option string (EINVAL).
	ErrInvalidOptions = errors.New("invalid connect options")
	// ErrAuthFailed: DH-HMAC-CHAP or the target's host ACL refused us
	// (EKEYREJECTED, EACCES, EPERM).
	ErrAuthFailed = errors.New("authentication or access refused")
	// ErrNoFabrics: the fabrics interface is missing; the nvme-fabrics or
	// nvme-tcp module is not loaded (ENOENT, ENODEV, ENXIO).
	ErrNoFabrics = errors.New("nvme-fabrics interface not available")
)

// classify maps a connect errno to a typed error.
func classify(err error) error {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err
	}
	var typed error
	switch errno {
	case syscall.EALREADY:
		typed = ErrAlreadyConnected
	case syscall.ECONNREFUSED, syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ECONNRESET:
		typed = ErrUnreachable
	case syscall.EINVAL:
		typed = ErrInvalidOptions
	case syscall.EKEYREJECTED, syscall.EACCES, syscall.EPERM:
		typed = ErrAuthFailed
	case syscall.ENOENT, syscall.ENODEV, syscall.ENXIO:
		typed = ErrNoFabrics
	default:
		return err
	}
	return fmt.Errorf("%w: %w", typed, err)
}

// device is the open fabrics interface: one write of the option string,
// then one read of the answer, on the same descriptor.
type device interface {
	io.ReadWriteCloser
}

// Connector talks to the kernel's fabrics interface and controller
// attributes. It holds no state beyond its roots and is safe for
// concurrent use.
type Connector struct {
	fabricsPath string
	writer      AttrWriter
	open        func(path string) (device, error)
}

// AttrWriter writes an attribute below the sysfs root: sysfs.FS, or a
// sysfs.BoundedWriter over it.
type AttrWriter interface {
	WriteAttr(rel, value string) error
}

// NewConnector returns a Connector writing connects to
// <devRoot>/nvme-fabrics and controller commands (delete_controller,
// rescan_controller, which block on a wedged controller) through w,
// rooted at the sysfs root.
func NewConnector(devRoot string, w AttrWriter) *Connector {
	return &Connector{
		fabricsPath: filepath.Join(devRoot, "nvme-fabrics"),
		writer:      w,
		open:        func(p string) (device, error) { return os.OpenFile(p, os.O_RDWR, 0) },
	}
}

// Connect creates one controller. The kernel's write blocks for the whole
// connect (tens of seconds against a dead target), so Connect returns when
// ctx ends; the write then finishes in the background, and a controller it
// still creates is found by the next look at sysfs like any other.
func (c *Connector) Connect(ctx context.Context, o Options) (Result, error) {
	opts, err := o.encode(false)
	if err != nil {
		return Result{}, fmt.Errorf("connect %s: %w: %w", o.Endpoint(), ErrInvalidOptions, err)
	}
	type answer struct {
		r   Result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		r, err := c.connect(opts)
		done <- answer{r, err}
	}()
	select {
	case a := <-done:
		if a.err != nil {
			return Result{}, fmt.Errorf("connect %s nqn %s: %w", o.Endpoint(), o.NQN, a.err)
		}
		klog.V(2).InfoS("Connected controller", "controller", a.r.Name(), "cntlid", a.r.CntlID, "endpoint", o.Endpoint(), "nqn", o.NQN)
		return a.r, nil
	case <-ctx.Done():
		return Result{}, fmt.Errorf("connect %s nqn %s: %w", o.Endpoint(), o.NQN, ctx.Err())
	}
}

func (c *Connector) connect(opts string) (Result, error) {
	f, err := c.open(c.fabricsPath)
	if err != nil {
		return Result{}, fmt.Errorf("open %s: %w", c.fabricsPath, classify(err))
	}
	defer f.Close()
	if _, err := f.Write([]byte(opts)); err != nil {
		// The kernel's error text is the errno; the option string (which
		// may hold a secret) is never part of the error.
		return Result{}, classify(unwrapPathError(err))
	}
	buf := make([]byte, 256)
	n, err := f.Read(buf)
	if err != nil && !errors.Is(err, io.EOF) {
		return Result{}, fmt.Errorf("read fabrics answer: %w", err)
	}
	return parseResult(string(buf[:n]))
}

// unwrapPathError strips the *os.PathError around a write errno: its Path
// is harmless, but keeping errors uniform makes classify simpler to test.
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Disconnect deletes a controller: writes "1" to its delete_controller.
// A controller that is already gone is not an error.
func (c *Connector) Disconnect(ctrl string) error {
	err := c.writer.WriteAttr("class/nvme/"+ctrl+"/delete_controller", "1")
	if sysfs.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("disconnect %s: %w", ctrl, err)
	}
	klog.V(2).InfoS("Deleted controller", "controller", ctrl)
	return nil
}

// Rescan asks a controller to rescan its namespaces: writes "1" to its
// rescan_controller.
func (c *Connector) Rescan(ctrl string) error {
	if err := c.writer.WriteAttr("class/nvme/"+ctrl+"/rescan_controller", "1"); err != nil {
		return fmt.Errorf("rescan %s: %w", ctrl, err)
	}
	return nil
}
