package driver

import (
	"sync"

	"google.golang.org/grpc/codes"
)

// volumeLocks admits one operation per volume at a time. A second RPC on a
// volume that has one in flight is answered Aborted at once, as the CSI spec
// recommends, so kubelet retries it later instead of queueing behind a slow
// attach.
type volumeLocks struct {
	mu       sync.Mutex
	inFlight map[string]struct{}
}

func newVolumeLocks() *volumeLocks {
	return &volumeLocks{inFlight: make(map[string]struct{})}
}

// acquire takes the lock of volumeID or returns an Aborted error. The caller
// must call the returned release exactly once.
func (l *volumeLocks) acquire(volumeID string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.inFlight[volumeID]; busy {
		return nil, &codedError{code: codes.Aborted, msg: "an operation on volume " + volumeID + " is already in progress"}
	}
	l.inFlight[volumeID] = struct{}{}
	return func() {
		l.mu.Lock()
		delete(l.inFlight, volumeID)
		l.mu.Unlock()
	}, nil
}
