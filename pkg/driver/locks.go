package driver

import (
	"errors"

	"google.golang.org/grpc/codes"

	"github.com/pathmend/pathmend/pkg/intent"
)

// volumeLocks admits one operation per volume at a time, through the
// intent owner's per-volume slots (shared with reconciliation). A second
// RPC on a volume that has one in flight is answered Aborted at once, as
// the CSI spec recommends, so kubelet retries it later instead of queueing
// behind a slow attach.
type volumeLocks struct {
	owner *intent.Owner
	// calls are the kernel calls still waiting for a volume's I/O: a
	// volume with one is busy too, though no RPC holds its slot.
	calls *kernelCalls
}

// acquire takes the volume or returns an Aborted error: when another
// operation holds it, or when a kernel call an earlier RPC started on it
// is still waiting for its I/O. The caller must call the returned release
// exactly once.
func (l *volumeLocks) acquire(volumeID string) (release func(), err error) {
	end, err := l.owner.Begin(volumeID, "a CSI call")
	var busy *intent.BusyError
	if errors.As(err, &busy) {
		return nil, &codedError{code: codes.Aborted, msg: busy.Error()}
	}
	if err != nil {
		return nil, err
	}
	if l.calls != nil {
		if err := l.calls.pendingError(volumeID); err != nil {
			end()
			return nil, err
		}
	}
	return end, nil
}
