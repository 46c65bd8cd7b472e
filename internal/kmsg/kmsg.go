package kmsg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Path is the kernel log device.
const Path = "/dev/kmsg"

// maxRecord bounds one record: the kernel's own limit (CONSOLE_EXT_LOG_MAX)
// is 8 KiB.
const maxRecord = 8192

// Record is one kernel log record.
type Record struct {
	// Seq is the record's sequence number: strictly increasing, never
	// reused while the machine runs.
	Seq uint64
	// Level is the log level (0 emergency … 7 debug); Facility is the
	// syslog facility (0 for the kernel's own messages).
	Level, Facility int
	// At is when it was logged, as time since boot (the kernel's local
	// clock, which /proc/uptime matches on a machine that never
	// suspended).
	At time.Duration
	// Msg is the message with \xNN escapes decoded and without the
	// dictionary lines.
	Msg string
}

// String renders the record the way dmesg does: "[   12.345678] msg".
func (r Record) String() string {
	return fmt.Sprintf("[%5d.%06d] %s", r.At/time.Second, (r.At%time.Second)/time.Microsecond, r.Msg)
}

// Parse reads one record as a read of /dev/kmsg returns it.
func Parse(raw string) (Record, error) {
	head, body, ok := strings.Cut(raw, ";")
	if !ok {
		return Record{}, fmt.Errorf("kmsg record %q: no ';' after the header", clip(raw))
	}
	f := strings.Split(head, ",")
	if len(f) < 4 {
		return Record{}, fmt.Errorf("kmsg record header %q: want prefix,seq,usec,flags", clip(head))
	}
	prefix, err := strconv.ParseUint(f[0], 10, 32)
	if err != nil {
		return Record{}, fmt.Errorf("kmsg record header %q: prefix: %w", clip(head), err)
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return Record{}, fmt.Errorf("kmsg record header %q: sequence: %w", clip(head), err)
	}
	usec, err := strconv.ParseUint(f[2], 10, 63)
	if err != nil || usec > uint64(1<<63-1)/uint64(time.Microsecond) {
		return Record{}, fmt.Errorf("kmsg record header %q: timestamp out of range", clip(head))
	}
	msg, _, _ := strings.Cut(body, "\n")
	return Record{
		Seq: seq, Level: int(prefix & 7), Facility: int(prefix >> 3),
		At:  time.Duration(usec) * time.Microsecond,
		Msg: unescape(msg),
	}, nil
}

// unescape decodes the kernel's \xNN escapes; anything else is kept as is.
func unescape(s string) string {
	if !strings.Contains(s, `\x`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && s[i+1] == 'x' {
			if v, err := strconv.ParseUint(s[i+2:i+4], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Since returns every record still in the kernel's buffer whose sequence
// number is above after (0: all of them), oldest first. Unparsable records
// are skipped.
func Since(path string, after uint64) ([]Record, error) {
	fd, err := open(path)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	var out []Record
	err = drain(fd, path, func(r Record) {
		if r.Seq > after {
			out = append(out, r)
		}
	})
	return out, err
}

// open opens path for non-blocking reads with a raw descriptor: an
// *os.File would hand a non-blocking descriptor to the runtime's poller,
// which then waits for data instead of returning EAGAIN.
func open(path string) (int, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, nil
}

// drain reads records from a non-blocking /dev/kmsg until none is left.
func drain(fd int, path string, fn func(Record)) error {
	buf := make([]byte, maxRecord)
	for {
		n, err := syscall.Read(fd, buf)
		switch {
		case errors.Is(err, syscall.EAGAIN) || (err == nil && n == 0):
			return nil
		case errors.Is(err, syscall.EPIPE):
			continue // overwritten while reading: go on with the oldest left
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil:
			return &os.PathError{Op: "read", Path: path, Err: err}
		}
		if r, err := Parse(string(buf[:n])); err == nil {
			fn(r)
		}
	}
}

// Cursor returns the sequence number of the newest record: Since(path,
// Cursor(path)) is what the kernel logged after the call.
func Cursor(path string) (uint64, error) {
	var last uint64
	rs, err := Since(path, 0)
	if len(rs) > 0 {
		last = rs[len(rs)-1].Seq
	}
	return last, err
}

// Follow calls fn with every record logged after the call, in order, until
// ctx ends or a read fails. It reads what is new every interval (a
// blocking read of /dev/kmsg cannot be interrupted by a context).
func Follow(ctx context.Context, path string, interval time.Duration, fn func(Record)) error {
	fd, err := open(path)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	// SEEK_END on /dev/kmsg moves the reader past the newest record.
	if _, err := syscall.Seek(fd, 0, io.SeekEnd); err != nil {
		return &os.PathError{Op: "seek", Path: path, Err: err}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := drain(fd, path, fn); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
