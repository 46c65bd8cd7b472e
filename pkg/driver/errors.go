package driver

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/scrub"
	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// codedError is an error that already knows its gRPC code. The driver builds
// them where it decides the code (argument checks, state conflicts); every
// other error is classified by ToStatus.
type codedError struct {
	code codes.Code
	msg  string
	err  error // optional cause, kept for errors.Is/As
}

func (e *codedError) Error() string {
	if e.err != nil {
		return e.msg + ": " + e.err.Error()
	}
	return e.msg
}

func (e *codedError) Unwrap() error { return e.err }

func invalidArgument(format string, args ...any) error {
	return &codedError{code: codes.InvalidArgument, msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &codedError{code: codes.NotFound, msg: fmt.Sprintf(format, args...)}
}

func failedPrecondition(format string, args ...any) error {
	return &codedError{code: codes.FailedPrecondition, msg: fmt.Sprintf(format, args...)}
}

func resourceExhausted(format string, args ...any) error {
	return &codedError{code: codes.ResourceExhausted, msg: fmt.Sprintf(format, args...)}
}

func alreadyExists(format string, args ...any) error {
	return &codedError{code: codes.AlreadyExists, msg: fmt.Sprintf(format, args...)}
}

// isCoded reports whether err is one the driver coded with c.
func isCoded(err error, c codes.Code) bool {
	var ce *codedError
	return errors.As(err, &ce) && ce.code == c
}

// maxQuoted bounds how much of a caller's value an error or a log line
// repeats: errors end up in Kubernetes events, which keep about a
// kilobyte.
const maxQuoted = 64

// quoteShort quotes s, cut to its first maxQuoted bytes and marked when
// cut. It scrubs s first: a secret cut in two would not be recognised
// later.
func quoteShort(s string) string {
	s = scrub.String(s)
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return strconv.Quote(s)
}

// internal wraps an unexpected failure with what the driver was doing.
func internal(err error, format string, args ...any) error {
	return &codedError{code: codes.Internal, msg: fmt.Sprintf(format, args...), err: err}
}

// ToStatus is the one place an error becomes a gRPC status: field errors of
// the volume context are InvalidArgument, context ends are Canceled or
// DeadlineExceeded, errors the driver coded keep their code, a kernel
// write that did not return in time is Unavailable, and anything else is
// Internal. The server's interceptor passes every RPC's error
// through it.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	// A record that cannot be read, or a teardown it blocks, is the
	// node's state, not a bug: the operator fixes or removes the file
	// (docs/state.md), and the CO retries.
	if errors.Is(err, volume.ErrUnreadableRecord) || errors.Is(err, volume.ErrTeardownBlocked) {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	var ce *codedError
	var fe *volume.FieldError
	switch {
	case errors.As(err, &fe):
		return status.Error(codes.InvalidArgument, fe.Error())
	case errors.As(err, &ce):
		if ce.code == codes.Internal {
			// An Internal error may wrap a context error deeper down:
			// report the cancellation, not a bug.
			if code, ok := contextCode(err); ok {
				return status.Error(code, err.Error())
			}
		}
		return status.Error(ce.code, err.Error())
	case errors.Is(err, volume.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, sysfs.ErrWriteTimedOut):
		// A kernel object is wedged (a controller's delete never
		// returns): the CO retries; the write goes on in the kernel.
		return status.Error(codes.Unavailable, err.Error())
	}
	if code, ok := contextCode(err); ok {
		return status.Error(code, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func contextCode(err error) (codes.Code, bool) {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded, true
	case errors.Is(err, context.Canceled):
		return codes.Canceled, true
	}
	return codes.OK, false
}
