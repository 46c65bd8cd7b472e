package driver

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The size limits of the CSI spec (spec.md, "Size Limits"): a field SHALL
// NOT exceed them unless its description in csi.proto says otherwise.
const (
	// maxStringBytes is the general limit of a string field.
	maxStringBytes = 128
	// maxMapBytes is the general limit of a map<string, string> field:
	// its keys and values together.
	maxMapBytes = 4 << 10
	// maxPathBytes bounds the path fields, which override the general
	// limit: "SP SHOULD support the maximum path length allowed by the
	// operating system", at least 128 bytes. Linux's PATH_MAX is 4096
	// bytes with the terminating NUL.
	maxPathBytes = 4095
	// maxMountFlagsBytes is the limit csi.proto sets for mount_flags: "The
	// total size of this repeated field SHALL NOT exceed 4 KiB."
	maxMountFlagsBytes = 4 << 10
)

// pathFields are the request fields that carry a path: csi.proto lifts
// the general limit for each of them.
var pathFields = map[protoreflect.Name]bool{
	"staging_target_path": true,
	"target_path":         true,
	"volume_path":         true,
	"volume_publish_path": true,
}

// doorInterceptor checks every request against the spec's size limits and
// the path rules before any handler runs, so no lock is taken, no volume
// context parsed and no record written for a request that breaks them:
// InvalidArgument naming the field and the limit, never repeating the
// value.
func (d *Driver) doorInterceptor(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		if err := d.checkRequest(m.ProtoReflect(), ""); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

// checkRequest walks every field of m that is set, in field-number order
// so the same request always reports the same field. prefix is the path of
// m in the request ("volume_capability.mount."). The walk is linear in the
// size of the request.
func (d *Driver) checkRequest(m protoreflect.Message, prefix string) error {
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		name := prefix + string(fd.Name())
		v := m.Get(fd)
		switch {
		case fd.IsMap():
			if err := d.checkMap(name, fd, v.Map()); err != nil {
				return err
			}
		case fd.IsList():
			if err := d.checkList(name, fd, v.List()); err != nil {
				return err
			}
		case fd.Kind() == protoreflect.MessageKind:
			if err := d.checkRequest(v.Message(), name+"."); err != nil {
				return err
			}
		case fd.Kind() == protoreflect.StringKind && pathFields[fd.Name()]:
			if err := d.checkPathField(name, v.String()); err != nil {
				return err
			}
		case fd.Kind() == protoreflect.StringKind, fd.Kind() == protoreflect.BytesKind:
			if n := len(v.String()); n > maxStringBytes {
				return tooLong(name, n, "a string", maxStringBytes)
			}
		}
	}
	return nil
}

// checkMap bounds a map field: a string map by its keys and values
// together, a map of messages by each message.
func (d *Driver) checkMap(name string, fd protoreflect.FieldDescriptor, m protoreflect.Map) error {
	var err error
	total := 0
	m.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
		total += len(k.String())
		switch fd.MapValue().Kind() {
		case protoreflect.StringKind, protoreflect.BytesKind:
			total += len(v.String())
		case protoreflect.MessageKind:
			err = d.checkRequest(v.Message(), name+"[].")
		}
		return err == nil
	})
	if err != nil {
		return err
	}
	if total > maxMapBytes {
		return tooLong(name, total, "a map (keys and values together)", maxMapBytes)
	}
	return nil
}

// checkList bounds a repeated field: mount_flags by its total, every other
// list of strings by each element, a list of messages by each message.
func (d *Driver) checkList(name string, fd protoreflect.FieldDescriptor, l protoreflect.List) error {
	total := 0
	for i := range l.Len() {
		switch fd.Kind() {
		case protoreflect.StringKind, protoreflect.BytesKind:
			n := len(l.Get(i).String())
			total += n
			if fd.Name() != "mount_flags" && n > maxStringBytes {
				return tooLong(fmt.Sprintf("%s[%d]", name, i), n, "a string", maxStringBytes)
			}
		case protoreflect.MessageKind:
			if err := d.checkRequest(l.Get(i).Message(), fmt.Sprintf("%s[%d].", name, i)); err != nil {
				return err
			}
		}
	}
	if fd.Name() == "mount_flags" && total > maxMountFlagsBytes {
		return tooLong(name, total, "mount_flags (all flags together)", maxMountFlagsBytes)
	}
	return nil
}

// checkPathField applies the rules of every path a request carries: at
// most maxPathBytes, no NUL or other control character (no path kubelet
// makes has one, and a line break would forge lines of the mount table),
// and, when the driver is confined to the kubelet root, inside it —
// strictly below it for the paths pathmend mounts at. The comparison is
// lexical, after cleaning (see within).
func (d *Driver) checkPathField(name, p string) error {
	if n := len(p); n > maxPathBytes {
		return tooLong(name, n, "a path", maxPathBytes)
	}
	for i := 0; i < len(p); i++ {
		if p[i] < ' ' || p[i] == 0x7f {
			return invalidArgument("%s contains a control character at byte %d", name, i)
		}
	}
	if d.cfg.KubeletRoot == "" || !filepath.IsAbs(p) {
		// A relative path is refused by the handler, naming the field.
		return nil
	}
	clean := filepath.Clean(p)
	if !within(d.cfg.KubeletRoot, clean) {
		return invalidArgument("%s %s is outside the kubelet root directory %s (--kubelet-root)", name, quoteShort(p), d.cfg.KubeletRoot)
	}
	if clean == d.cfg.KubeletRoot && mountFields[name] {
		// A mount over the root would hide every pod volume, plugin
		// socket and staging mount under it.
		return invalidArgument("%s %s is the kubelet root directory itself (--kubelet-root); pathmend mounts only strictly below it", name, quoteShort(p))
	}
	return nil
}

// mountFields are the path fields pathmend mounts at: they must lie
// strictly below the kubelet root.
var mountFields = map[string]bool{"staging_target_path": true, "target_path": true}

// within reports whether the clean absolute path p is root or below it.
// It compares names only: symlinks below the root are kubelet's, and a
// caller who can plant one there can do anything on the node already.
func within(root, p string) bool {
	if root == "/" || p == root {
		return true
	}
	return strings.HasPrefix(p, root+"/")
}

// tooLong is the InvalidArgument of a field over its limit. It names the
// field, its size and the limit, and repeats nothing of the value.
func tooLong(name string, n int, what string, limit int) error {
	return invalidArgument("%s is %d bytes; the CSI limit for %s is %d bytes", name, n, what, limit)
}
