// Package volume owns two things: the volume-context contract and the
// staged-volume records.
//
// # Volume context
//
// Parse is the one reader of the keys a PV's volumeAttributes and its
// node-stage secret may carry (docs/volume-context.md; Keys returns the same
// table). It validates every key against its transport, rejects unknown
// keys so that a typo never passes silently, skips the keys Kubernetes adds
// under IgnoredKeyPrefix, and returns a normalized Context plus Secrets.
// Failures are *FieldError values naming the key; the driver maps them to
// InvalidArgument. ParseWithPublish reads the publish context of
// ControllerPublishVolume together with the volume context under the same
// rules. IsCredentialKey classes the keys whose values no log may show,
// by shape (the last segment of the key).
// Context.Encode renders a Context back to canonical keys
// and Context.Equal compares two of them, which is how the driver decides
// whether a repeated NodeStage asks for the same thing.
//
// # Staged-volume records
//
// Store keeps one Record per volume under <dir>/volumes/vol-<hash>.json,
// so a restarted plugin knows what it attached or may have attached, in
// which lifecycle State (attaching, staged, detaching), where, and which
// paths each volume expects. There is no in-memory cache: every call reads
// or writes the disk. Only the intent owner (pkg/intent) uses it. Scan
// returns the records it could read and a *RecordError per file it could
// not, with the volume and Target (an NQN, an IQN) the file's envelope
// names when it can be decoded that far: a record of a newer version is
// "written by a newer pathmend", never absent. CoTenants is what an
// attacher is told about a target's other volumes.
//
// # Device identity
//
// DeviceNumber (major:minor) is how a block device is known: the record
// keeps the staged device's, FindStagedDevice finds the one a staged
// volume's users hold (the staging mount's, or the device node at a
// block publication), and Replaced compares it with the devices a
// transport finds for the volume now. A name is never compared: the
// kernel reuses names, and a device has several.
//
// # What this package does not do
//
// It attaches nothing, reads no sysfs, runs no commands and speaks no gRPC;
// the one thing it looks at on the host is a device node's number
// (NodeNumber).
// It does not resolve host names in endpoints and portals; it only checks
// their syntax.
//
// # Invariants
//
//   - A Context never holds a secret, so neither does a Record; Secrets are
//     returned to the caller only and have no JSON or text form that shows
//     a value.
//   - No error from this package contains a secret value.
//   - Parse is deterministic: the same maps give the same result or the same
//     error, whatever the map iteration order.
//   - For any Context c returned by Parse, Parse(c.Encode(), nil) returns a
//     Context equal to c.
//   - A record names the mount layers pathmend made (MountLayer): what
//     NodeUnpublish and NodeUnstage may unmount, and nothing else.
//   - No state file is written holding a password or key the process has
//     seen (scrub.Default.Find; ErrHoldsSecret).
//   - Store.Put is atomic: after a crash a record is the old or the new one,
//     never partial. Leftover temporary files are ignored by List.
//   - Store.Put never writes a record Get could not read back (the read
//     cap, a known state).
//   - Every record version keeps the envelope (RecordVersion).
//   - A record is always written in the normalized form Parse returns.
//   - Put never writes a record Get cannot read back: it refuses one larger
//     than the read bound, with more than MaxPublications publications, or
//     with a string that is not valid UTF-8.
//   - Parse's work is linear in its input: endpoint lists are counted
//     (MaxEndpoints) before any item is parsed, and repeats found through a
//     set; no error repeats more than 64 bytes of a value or a key.
package volume
