package driver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/pathmend/pathmend/pkg/scrub"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Bounds of one dumped message: a hostile request is dumped in a few
// kilobytes, whatever its size.
const (
	// maxDumpString bounds a string value in a dump.
	maxDumpString = 256
	// maxDumpEntries bounds the entries of one map or list in a dump.
	maxDumpEntries = 64
)

// stripped replaces every value a dump must not show.
const stripped = "***stripped***"

// redacted renders a request or response for the -v=5 dump. It hides
//   - every field csi.proto marks csi_secret (the secrets maps), as
//     protosanitizer does;
//   - the value of every map entry whose key is a credential by the
//     volume-context contract (volume.IsCredentialKey), in any map: a
//     chapPassword put in the volume context or the publish context by
//     mistake is as secret as one in the node-stage secret;
//   - mount_flags, which csi.proto says MAY hold sensitive information
//     that the plugin MUST NOT leak: only their count is shown;
//
// and cuts strings, keys, maps and lists to a few kilobytes in all, so a
// request rejected for its size is not logged whole. It works on a
// snapshot of the message and never changes it.
type redacted struct{ msg any }

func (r redacted) String() string {
	m, ok := r.msg.(proto.Message)
	if !ok {
		return fmt.Sprintf("%T", r.msg)
	}
	b, err := json.Marshal(redactMessage(m.ProtoReflect()))
	if err != nil {
		return fmt.Sprintf("<%T: %v>", r.msg, err)
	}
	return string(b)
}

func redactMessage(m protoreflect.Message) map[string]any {
	out := map[string]any{}
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if !m.Has(fd) {
			continue
		}
		v := m.Get(fd)
		name := fd.TextName()
		switch {
		case isCSISecret(fd):
			out[name] = stripped
		case fd.Name() == "mount_flags" && fd.IsList():
			out[name] = fmt.Sprintf("<%d flags>", v.List().Len())
		case fd.IsMap():
			out[name] = redactMap(fd, v.Map())
		case fd.IsList():
			out[name] = redactList(fd, v.List())
		default:
			out[name] = redactValue(fd, v)
		}
	}
	return out
}

func redactMap(fd protoreflect.FieldDescriptor, m protoreflect.Map) map[string]any {
	keys := make([]string, 0, m.Len())
	m.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k.String())
		return true
	})
	slices.Sort(keys)
	out := make(map[string]any, min(len(keys), maxDumpEntries)+1)
	for i, k := range keys {
		if i == maxDumpEntries {
			out["..."] = fmt.Sprintf("%d more entries", len(keys)-i)
			break
		}
		name := cut(k, maxQuoted)
		if _, dup := out[name]; dup {
			name = fmt.Sprintf("%s#%d", name, i)
		}
		if volume.IsCredentialKey(k) {
			out[name] = stripped
			continue
		}
		out[name] = redactValue(fd.MapValue(), m.Get(protoreflect.ValueOfString(k).MapKey()))
	}
	return out
}

func redactList(fd protoreflect.FieldDescriptor, l protoreflect.List) []any {
	out := make([]any, 0, min(l.Len(), maxDumpEntries)+1)
	for i := range l.Len() {
		if i == maxDumpEntries {
			out = append(out, fmt.Sprintf("... %d more", l.Len()-i))
			break
		}
		out = append(out, redactValue(fd, l.Get(i)))
	}
	return out
}

func redactValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) any {
	switch fd.Kind() {
	case protoreflect.MessageKind:
		return redactMessage(v.Message())
	case protoreflect.EnumKind:
		if d := fd.Enum().Values().ByNumber(v.Enum()); d != nil {
			return string(d.Name())
		}
		return int32(v.Enum())
	case protoreflect.StringKind:
		return cut(v.String(), maxDumpString)
	case protoreflect.BytesKind:
		return fmt.Sprintf("<%d bytes>", len(v.Bytes()))
	}
	return v.Interface()
}

// cut returns s, or its first n bytes marked with the full length. It
// scrubs s first: a secret cut in two would not be recognised later.
func cut(s string, n int) string {
	s = scrub.String(s)
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + fmt.Sprintf("...(%d bytes)", len(s))
}

// registerSecrets hands the scrubber every secret value of a request:
// each value of a field csi.proto marks csi_secret (the secrets maps),
// and the value of every credential key (volume.IsCredentialKey) of any
// other map, in the request and in every message in it.
func registerSecrets(set *scrub.Set, m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.StringKind:
			secret := isCSISecret(fd)
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				if secret || volume.IsCredentialKey(k.String()) {
					set.Add(secretKind(k.String()), mv.String())
				}
				return true
			})
		case fd.IsMap() && fd.MapValue().Kind() == protoreflect.MessageKind:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				registerSecrets(set, mv.Message())
				return true
			})
		case fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			for i := range v.List().Len() {
				registerSecrets(set, v.List().Get(i).Message())
			}
		case !fd.IsList() && fd.Kind() == protoreflect.MessageKind:
			registerSecrets(set, v.Message())
		}
		return true
	})
}

// secretKind is what the value of a secrets key is, by the contract.
func secretKind(k string) scrub.Kind {
	switch k {
	case "chapUsername":
		return scrub.CHAPUser
	case "chapPassword":
		return scrub.CHAPPassword
	case "chapUsernameIn":
		return scrub.MutualCHAPUser
	case "chapPasswordIn":
		return scrub.MutualCHAPPassword
	case "dhchapSecret", "dhchapCtrlSecret":
		return scrub.DHCHAPKey
	}
	return scrub.RequestSecret
}

func isCSISecret(fd protoreflect.FieldDescriptor) bool {
	secret, _ := proto.GetExtension(fd.Options(), csi.E_CsiSecret).(bool)
	return secret
}
