package driver

import (
	"path/filepath"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/pathmend/pathmend/pkg/volume"
)

// defaultFSType is the filesystem NodeStage creates when the capability
// names none.
const defaultFSType = "ext4"

// supportedFSTypes are the filesystems pathmend formats, mounts and grows.
var supportedFSTypes = map[string]bool{"ext4": true, "ext3": true, "xfs": true}

// capability is a validated VolumeCapability.
type capability struct {
	access     volume.AccessType
	fsType     string   // mount access only
	mountFlags []string // mount access only
	mode       csi.VolumeCapability_AccessMode_Mode
	// readOnly is set when the access mode allows no writer at all.
	readOnly bool
}

// parseCapability validates a volume capability. field names the request
// field in errors ("volume_capability").
func parseCapability(c *csi.VolumeCapability, defaultFS string) (capability, error) {
	if c == nil {
		return capability{}, invalidArgument("volume_capability is required")
	}
	var out capability
	out.mode = c.GetAccessMode().GetMode()
	switch out.mode {
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER:
	case csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY:
		out.readOnly = true
	default:
		return capability{}, invalidArgument("volume_capability.access_mode: mode %s is not supported", out.mode)
	}
	switch at := c.GetAccessType().(type) {
	case *csi.VolumeCapability_Block:
		out.access = volume.AccessBlock
	case *csi.VolumeCapability_Mount:
		out.access = volume.AccessMount
		// ext4 and xfs are single-node filesystems: two nodes writing one
		// of them corrupt it. Shared writers are only safe on raw block.
		if out.mode == csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER ||
			out.mode == csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER {
			return capability{}, invalidArgument("volume_capability.access_mode: %s needs block access; a filesystem cannot be written from several nodes", out.mode)
		}
		out.fsType = strings.ToLower(at.Mount.GetFsType())
		if out.fsType == "" {
			out.fsType = defaultFS
		}
		if !supportedFSTypes[out.fsType] {
			return capability{}, invalidArgument("volume_capability.mount.fs_type: %q is not supported; use ext4, ext3 or xfs", at.Mount.GetFsType())
		}
		for i, f := range at.Mount.GetMountFlags() {
			// The flag itself is not repeated: mount flags may hold
			// credentials, which csi.proto says must not leak.
			if f == "" || strings.ContainsAny(f, " \t\n") {
				return capability{}, invalidArgument("volume_capability.mount.mount_flags[%d] is empty or contains whitespace; it is not a mount option", i)
			}
		}
		out.mountFlags = append([]string(nil), at.Mount.GetMountFlags()...)
	default:
		return capability{}, invalidArgument("volume_capability.access_type: block or mount is required")
	}
	return out, nil
}

// checkPath validates a path field of a request: required and absolute.
func checkPath(field, p string) (string, error) {
	if p == "" {
		return "", invalidArgument("%s is required", field)
	}
	if !filepath.IsAbs(p) {
		return "", invalidArgument("%s %q is not an absolute path", field, p)
	}
	if strings.ContainsRune(p, 0) {
		return "", invalidArgument("%s contains a NUL byte", field)
	}
	return filepath.Clean(p), nil
}

// volumeAndPath validates the volume_id of a request and one required path
// field, returning the cleaned path.
func volumeAndPath(volumeID, field, path string) (string, error) {
	if volumeID == "" {
		return "", invalidArgument("volume_id is required")
	}
	return checkPath(field, path)
}

// volumePathOf validates the volume_id and volume_path of a stats or expand
// request. A relative path can never be where a volume is, so it is
// NotFound, as the spec asks for a volume that is not at the given path.
func volumePathOf(volumeID, path string) (string, error) {
	if volumeID == "" {
		return "", invalidArgument("volume_id is required")
	}
	if path == "" {
		return "", invalidArgument("volume_path is required")
	}
	clean, err := checkPath("volume_path", path)
	if err != nil {
		return "", notFound("volume %s is not at %q", volumeID, path)
	}
	return clean, nil
}
