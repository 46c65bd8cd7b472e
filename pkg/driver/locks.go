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
}

// acquire takes the volume or returns an Aborted error. The caller must
// call the returned release exactly once.
func (l *volumeLocks) acquire(volumeID string) (release func(), err error) {
	end, err := l.owner.Begin(volumeID, "a CSI call")
	var busy *intent.BusyError
	if errors.As(err, &busy) {
		return nil, &codedError{code: codes.Aborted, msg: busy.Error()}
	}
	return end, err
}
