// Package looptest is test support only: an Attacher that backs volumes with
// sparse files on loop devices, and a minimal CSI controller that creates,
// grows and deletes those files. It lets csi-sanity and the driver tests run
// the real NodeServer with real mkfs, mounts and bind mounts on a machine
// without NVMe or iSCSI. No production code imports it.
package looptest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/pathmend/pathmend/pkg/driver"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Attacher attaches registered backing files as loop devices.
type Attacher struct {
	mu      sync.Mutex
	backing map[string]string           // volume ID → backing file
	health  map[string]volume.Condition // injected conditions
	current map[string]string           // volume ID → its loop device after a Replace
	// Attaches counts successful Attach calls, for tests.
	Attaches int
}

var _ driver.Attacher = (*Attacher)(nil)

// NewAttacher returns an Attacher with no volumes.
func NewAttacher() *Attacher {
	return &Attacher{backing: map[string]string{}, health: map[string]volume.Condition{}, current: map[string]string{}}
}

// Register makes volumeID attachable from file.
func (a *Attacher) Register(volumeID, file string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.backing[volumeID] = file
}

// Unregister forgets volumeID.
func (a *Attacher) Unregister(volumeID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.backing, volumeID)
	delete(a.health, volumeID)
	delete(a.current, volumeID)
}

// Replace does to a volume what Linux does to a block device whose every
// path was lost for a while: the old loop device is detached — lazily,
// so it lives on, dead to its users, for as long as something holds it
// (a mount) — and the backing file is attached to a new loop device,
// which becomes the volume's device. It returns both.
func (a *Attacher) Replace(ctx context.Context, volumeID string) (old, replacement string, err error) {
	file, err := a.file(volumeID)
	if err != nil {
		return "", "", err
	}
	if old, err = a.device(ctx, volumeID, file); err != nil || old == "" {
		return "", "", fmt.Errorf("volume %s has no loop device to replace: %v", volumeID, err)
	}
	out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", file).Output()
	if err != nil {
		return "", "", fmt.Errorf("losetup %s: %w", file, exitErr(err))
	}
	replacement = strings.TrimSpace(string(out))
	if err := detachDevice(ctx, old); err != nil {
		return "", "", err
	}
	a.mu.Lock()
	a.current[volumeID] = replacement
	a.mu.Unlock()
	return old, replacement, nil
}

// device is the volume's loop device: the one a Replace made, else the
// one backed by file.
func (a *Attacher) device(ctx context.Context, volumeID, file string) (string, error) {
	a.mu.Lock()
	dev, ok := a.current[volumeID]
	a.mu.Unlock()
	if ok {
		return dev, nil
	}
	return LoopOf(ctx, file)
}

// SetCondition makes Health report c for volumeID.
func (a *Attacher) SetCondition(volumeID string, c volume.Condition) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.health[volumeID] = c
}

func (a *Attacher) file(volumeID string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, ok := a.backing[volumeID]
	if !ok {
		return "", fmt.Errorf("no backing file registered for volume %s", volumeID)
	}
	return f, nil
}

// loopCreated is the loop device one Attach set up.
type loopCreated struct{ dev string }

func (c loopCreated) String() string { return "loop device " + c.dev }

// Attach returns the loop device of the volume's backing file, setting one
// up if none exists (then the attachment names it as created).
func (a *Attacher) Attach(ctx context.Context, req volume.AttachRequest) (volume.Attachment, error) {
	att := volume.Attachment{VolumeID: req.VolumeID, Context: req.Context}
	file, err := a.file(req.VolumeID)
	if err != nil {
		return att, err
	}
	dev, err := a.device(ctx, req.VolumeID, file)
	if err != nil {
		return att, err
	}
	if dev == "" {
		out, err := exec.CommandContext(ctx, "losetup", "--find", "--show", file).Output()
		if err != nil {
			return att, fmt.Errorf("losetup %s: %w", file, exitErr(err))
		}
		dev = strings.TrimSpace(string(out))
		att.Created = loopCreated{dev: dev}
	}
	size, err := deviceSize(dev)
	if err != nil {
		return att, err
	}
	a.mu.Lock()
	a.Attaches++
	a.mu.Unlock()
	att.Device = volume.Device{Path: dev, SizeBytes: size}
	return att, nil
}

// Undo removes the loop device Attach set up, if it did.
func (a *Attacher) Undo(ctx context.Context, att volume.Attachment, _ volume.CoTenants) error {
	c, ok := att.Created.(loopCreated)
	if !ok {
		return nil
	}
	return detachDevice(context.WithoutCancel(ctx), c.dev)
}

// Detach removes the loop device of the volume, if any. Loop devices are
// never shared, so there are no co-tenants to spare.
func (a *Attacher) Detach(ctx context.Context, rec volume.Record, _ volume.CoTenants) error {
	file, err := a.file(rec.VolumeID)
	if err != nil {
		// The controller deleted the volume: detach by recorded device.
		return detachDevice(ctx, rec.Device)
	}
	dev, err := a.device(ctx, rec.VolumeID, file)
	if err != nil || dev == "" {
		return err
	}
	a.mu.Lock()
	delete(a.current, rec.VolumeID)
	a.mu.Unlock()
	return detachDevice(ctx, dev)
}

func detachDevice(ctx context.Context, dev string) error {
	if dev == "" {
		return nil
	}
	if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := exec.CommandContext(ctx, "losetup", "-d", dev).Run(); err != nil {
		return fmt.Errorf("losetup -d %s: %w", dev, exitErr(err))
	}
	return nil
}

// Expand makes the loop device re-read its backing file's size.
func (a *Attacher) Expand(ctx context.Context, rec volume.Record) (int64, error) {
	if err := exec.CommandContext(ctx, "losetup", "-c", rec.Device).Run(); err != nil {
		return 0, fmt.Errorf("losetup -c %s: %w", rec.Device, exitErr(err))
	}
	return deviceSize(rec.Device)
}

// Health reports an injected condition, else whether the device exists;
// either way with the volume's current loop device and its number.
func (a *Attacher) Health(ctx context.Context, rec volume.Record) volume.Condition {
	a.mu.Lock()
	c, ok := a.health[rec.VolumeID]
	a.mu.Unlock()
	if !ok {
		c = volume.Condition{Status: volume.Healthy}
		if _, err := os.Stat(rec.Device); err != nil {
			c = volume.Condition{Status: volume.Inaccessible, Reason: "DeviceGone", Message: fmt.Sprintf("loop device %s is gone", rec.Device)}
		}
	}
	if file, err := a.file(rec.VolumeID); err == nil {
		if dev, err := a.device(ctx, rec.VolumeID, file); err == nil && dev != "" {
			if n, err := numberOf(dev); err == nil {
				c.Devices = []volume.BlockDevice{{Name: filepath.Base(dev), Number: n}}
			}
		}
	}
	return c
}

// numberOf reads a loop device's number from sysfs.
func numberOf(dev string) (volume.DeviceNumber, error) {
	b, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(dev), "dev"))
	if err != nil {
		return volume.DeviceNumber{}, err
	}
	return volume.ParseDeviceNumber(string(b))
}

// LoopOf returns the loop device backed by file, or "" when none is.
func LoopOf(ctx context.Context, file string) (string, error) {
	out, err := exec.CommandContext(ctx, "losetup", "--noheadings", "--output", "NAME", "--associated", file).Output()
	if err != nil {
		return "", fmt.Errorf("losetup --associated %s: %w", file, exitErr(err))
	}
	fields := strings.Fields(string(out))
	if len(fields) == 0 {
		return "", nil
	}
	return fields[0], nil
}

func deviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, io.SeekEnd)
}

func exitErr(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
	}
	return err
}
