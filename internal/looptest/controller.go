package looptest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultSize is the size of a volume created without a capacity range.
const DefaultSize = 64 << 20

// Controller is a minimal CSI controller for tests: CreateVolume makes a
// sparse file and registers it with the Attacher, ControllerExpandVolume
// grows it, DeleteVolume removes it. Its volume context is a valid nvme-tcp
// context, so NodeStage goes through the real volume-context parser; the
// test registers the loop Attacher under that transport.
type Controller struct {
	csi.UnimplementedControllerServer

	dir      string
	attacher *Attacher
	mu       sync.Mutex
}

var _ csi.ControllerServer = (*Controller)(nil)

// NewController keeps backing files in dir.
func NewController(dir string, a *Attacher) *Controller {
	return &Controller{dir: dir, attacher: a}
}

func volumeIDOf(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "loop-" + hex.EncodeToString(sum[:8])
}

// VolumeContext is the volume context CreateVolume returns for volumeID.
func VolumeContext(volumeID string) map[string]string {
	return map[string]string{
		"transport": "nvme-tcp",
		"nqn":       "nqn.2014-08.io.pathmend.test:" + volumeID,
		"endpoints": "127.0.0.1:4420",
		"nsid":      "1",
	}
}

func (c *Controller) path(volumeID string) string { return filepath.Join(c.dir, volumeID+".img") }

// CreateVolume creates (or finds) the sparse backing file of a volume.
func (c *Controller) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_capabilities are required")
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	if size == 0 {
		size = DefaultSize
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := volumeIDOf(req.GetName())
	p := c.path(id)
	if fi, err := os.Stat(p); err == nil {
		if fi.Size() != size {
			return nil, status.Errorf(codes.AlreadyExists, "volume %s exists with size %d", req.GetName(), fi.Size())
		}
	} else {
		f, err := os.Create(p)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		err = f.Truncate(size)
		f.Close()
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	c.attacher.Register(id, p)
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: id, CapacityBytes: size, VolumeContext: VolumeContext(id)}}, nil
}

// DeleteVolume removes the backing file; an unknown volume is OK.
func (c *Controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is required")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.path(req.GetVolumeId())
	if dev, err := LoopOf(ctx, p); err == nil && dev != "" {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still attached as %s", req.GetVolumeId(), dev)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	c.attacher.Unregister(req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

// ControllerExpandVolume grows the backing file; the node rescans it.
func (c *Controller) ControllerExpandVolume(_ context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	size := req.GetCapacityRange().GetRequiredBytes()
	if req.GetVolumeId() == "" || size <= 0 {
		return nil, status.Error(codes.InvalidArgument, "volume_id and capacity_range.required_bytes are required")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	p := c.path(req.GetVolumeId())
	fi, err := os.Stat(p)
	if err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", req.GetVolumeId(), err)
	}
	if size > fi.Size() {
		if err := os.Truncate(p, size); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: max(size, fi.Size()), NodeExpansionRequired: true}, nil
}

// ControllerGetCapabilities advertises create/delete and expand.
func (c *Controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	var caps []*csi.ControllerServiceCapability
	for _, t := range []csi.ControllerServiceCapability_RPC_Type{
		csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
		csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	} {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{Type: t}}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// String describes the controller for test logs.
func (c *Controller) String() string { return fmt.Sprintf("looptest.Controller(%s)", c.dir) }
