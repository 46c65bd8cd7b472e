package uevent

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"time"
)

// Action is the kernel's kobject action (lib/kobject_uevent.c,
// kobject_actions): what happened to the object the event names.
type Action string

// The kernel's actions. Others may come with a newer kernel; they parse
// and are kept as the kernel spelled them.
const (
	Add     Action = "add"
	Remove  Action = "remove"
	Change  Action = "change"
	Move    Action = "move"
	Online  Action = "online"
	Offline Action = "offline"
	Bind    Action = "bind"
	Unbind  Action = "unbind"
)

// Bounds of one message. The kernel builds a uevent as "ACTION@DEVPATH\0"
// followed by at most UEVENT_BUFFER_SIZE (2048) bytes of "KEY=value\0"
// pairs, at most UEVENT_NUM_ENVP (64) of them; a DEVPATH is far shorter
// than a page. Anything larger is not a kernel uevent.
const (
	// MaxMessage is the largest message Parse accepts, in bytes.
	MaxMessage = 8192
	// MaxKeys is the most KEY=value pairs Parse accepts.
	MaxKeys = 128
)

// Event is one kernel uevent. Values are never mutated after Parse.
type Event struct {
	// Seq is the kernel's SEQNUM: it grows by one with every uevent the
	// kernel sends, so a gap between two events a listener received means
	// events it did not see (another network namespace's, or lost).
	Seq uint64
	// Action is ACTION.
	Action Action
	// DevPath is DEVPATH, the object's path below /sys
	// ("/devices/virtual/nvme-fabrics/ctl/nvme3").
	DevPath string
	// Subsystem is SUBSYSTEM ("nvme", "block", "iscsi_session").
	Subsystem string
	// Env holds every key the kernel sent, the four above included.
	Env map[string]string
	// Received is when the listener received it (its clock); zero when it
	// was not received from a socket (a fixture, a test).
	Received time.Time
}

// Get returns the value of key, "" when the event has none.
func (e Event) Get(key string) string { return e.Env[key] }

// Name is the kernel name of the object: DEVPATH's last element
// ("nvme3", "sda", "session4").
func (e Event) Name() string { return path.Base(e.DevPath) }

// String renders the event for logs: "remove nvme nvme3 (seq 812)".
func (e Event) String() string {
	return fmt.Sprintf("%s %s %s (seq %d)", e.Action, e.Subsystem, e.Name(), e.Seq)
}

// ErrNotKernel is returned by Parse for a message udev sent (its
// "libudev" frames on the udev group): pathmend listens to the kernel
// only.
var ErrNotKernel = errors.New("uevent: not a kernel message (udev frame)")

// udevMagic starts every message udev re-broadcasts (libudev's
// monitor_netlink_header).
var udevMagic = []byte("libudev\x00")

// Parse parses one message as the kernel sends it on the
// NETLINK_KOBJECT_UEVENT socket:
//
//	ACTION@DEVPATH\0ACTION=…\0DEVPATH=…\0SUBSYSTEM=…\0[KEY=value\0…]SEQNUM=…\0
//
// It requires ACTION, DEVPATH (an absolute path), SUBSYSTEM and SEQNUM,
// and a header that agrees with ACTION and DEVPATH; it refuses a message
// larger than MaxMessage, more than MaxKeys pairs, a pair without "=", a
// key that is not [A-Za-z0-9_]+, a key given twice, and a udev frame
// (ErrNotKernel). The error names what was wrong; nothing is returned
// with it.
func Parse(msg []byte) (Event, error) {
	if len(msg) == 0 {
		return Event{}, errors.New("uevent: empty message")
	}
	if len(msg) > MaxMessage {
		return Event{}, fmt.Errorf("uevent: message of %d bytes is larger than %d", len(msg), MaxMessage)
	}
	if bytes.HasPrefix(msg, udevMagic) {
		return Event{}, ErrNotKernel
	}
	msg = bytes.TrimSuffix(msg, []byte{0})
	header, rest, _ := bytes.Cut(msg, []byte{0})
	hAction, hPath, ok := bytes.Cut(header, []byte{'@'})
	if !ok {
		return Event{}, fmt.Errorf("uevent: header %q is not ACTION@DEVPATH", trunc(header))
	}
	env := map[string]string{}
	for len(rest) > 0 {
		var field []byte
		field, rest, _ = bytes.Cut(rest, []byte{0})
		k, v, ok := bytes.Cut(field, []byte{'='})
		if !ok {
			return Event{}, fmt.Errorf("uevent: field %q has no '='", trunc(field))
		}
		if !validKey(k) {
			return Event{}, fmt.Errorf("uevent: key %q is not [A-Za-z0-9_]+", trunc(k))
		}
		if _, dup := env[string(k)]; dup {
			return Event{}, fmt.Errorf("uevent: key %s given twice", k)
		}
		if len(env) == MaxKeys {
			return Event{}, fmt.Errorf("uevent: more than %d keys", MaxKeys)
		}
		env[string(k)] = string(v)
	}
	e := Event{Action: Action(env["ACTION"]), DevPath: env["DEVPATH"], Subsystem: env["SUBSYSTEM"], Env: env}
	for _, k := range []string{"ACTION", "DEVPATH", "SUBSYSTEM", "SEQNUM"} {
		if env[k] == "" {
			return Event{}, fmt.Errorf("uevent: %s is missing", k)
		}
	}
	if e.DevPath[0] != '/' {
		return Event{}, fmt.Errorf("uevent: DEVPATH %q is not absolute", trunc([]byte(e.DevPath)))
	}
	if string(hAction) != env["ACTION"] || string(hPath) != e.DevPath {
		return Event{}, fmt.Errorf("uevent: header %q disagrees with ACTION=%s DEVPATH=%s", trunc(header), trunc([]byte(env["ACTION"])), trunc([]byte(e.DevPath)))
	}
	seq, err := strconv.ParseUint(env["SEQNUM"], 10, 64)
	if err != nil {
		return Event{}, fmt.Errorf("uevent: SEQNUM %q: %w", trunc([]byte(env["SEQNUM"])), err)
	}
	e.Seq = seq
	return e, nil
}

// Encode renders e as the kernel sends it: the inverse of Parse, with the
// keys other than the header's in sorted order (the kernel's own order is
// not kept by Env). Fixtures and tests use it.
func Encode(e Event) []byte {
	var b bytes.Buffer
	b.WriteString(string(e.Action) + "@" + e.DevPath)
	b.WriteByte(0)
	for _, k := range sortedKeys(e.Env) {
		b.WriteString(k + "=" + e.Env[k])
		b.WriteByte(0)
	}
	return b.Bytes()
}

func validKey(k []byte) bool {
	if len(k) == 0 {
		return false
	}
	for _, c := range k {
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// trunc bounds what an error quotes of the input.
func trunc(b []byte) string {
	const max = 64
	if len(b) > max {
		return string(b[:max]) + "…"
	}
	return string(b)
}

func sortedKeys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
