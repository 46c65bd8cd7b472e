package iscsitest

import (
	"fmt"
	"strconv"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// announcer queues the uevents the host's kernel sends, as the lab's 6.1
// kernel sends them (testdata/uevents; docs/uevents.md): a session's
// login adds the session, its connection, each LUN's SCSI device and
// disk; a logout removes them, disks first; a disk deleted removes it
// and its SCSI device; a rescan adds them; a map assembled adds its dm
// device, a path added to or dropped from it changes it, a flush removes
// it. A session that fails or recovers is not announced.
type announcer struct {
	on     bool
	seq    uint64
	events []uevent.Event
}

func (a *announcer) emit(action uevent.Action, devpath, subsystem string, kv ...string) {
	if !a.on {
		return
	}
	a.seq++
	env := map[string]string{"ACTION": string(action), "DEVPATH": devpath, "SUBSYSTEM": subsystem, "SEQNUM": strconv.FormatUint(a.seq, 10)}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	a.events = append(a.events, uevent.Event{Seq: a.seq, Action: action, DevPath: devpath, Subsystem: subsystem, Env: env})
}

func sessionPath(s Session) string { return "/" + sessionDir(s) }

func lunPath(s Session, l LUN) string {
	return fmt.Sprintf("%s/target%d:0:0/%d:0:0:%d", sessionPath(s), s.Host, s.Host, l.LUN)
}

// sessionUp announces a session logged in with its LUNs.
func (a *announcer) sessionUp(s Session) {
	a.emit(uevent.Add, sessionPath(s)+"/iscsi_session/session"+strconv.Itoa(s.ID), "iscsi_session")
	a.emit(uevent.Add, fmt.Sprintf("%s/connection%d:0/iscsi_connection/connection%d:0", sessionPath(s), s.ID, s.ID), "iscsi_connection")
	for _, l := range s.LUNs {
		a.lunUp(s, l)
	}
}

func (a *announcer) lunUp(s Session, l LUN) {
	a.emit(uevent.Add, lunPath(s, l), "scsi", "DEVTYPE", "scsi_device")
	if l.Disk != "" {
		a.emit(uevent.Add, lunPath(s, l)+"/block/"+l.Disk, "block", "DEVTYPE", "disk", "DEVNAME", l.Disk)
	}
	a.emit(uevent.Bind, lunPath(s, l), "scsi", "DEVTYPE", "scsi_device", "DRIVER", "sd")
}

func (a *announcer) lunDown(s Session, l LUN) {
	if l.Disk != "" {
		a.emit(uevent.Remove, lunPath(s, l)+"/block/"+l.Disk, "block", "DEVTYPE", "disk", "DEVNAME", l.Disk)
	}
	a.emit(uevent.Unbind, lunPath(s, l), "scsi", "DEVTYPE", "scsi_device")
	a.emit(uevent.Remove, lunPath(s, l), "scsi", "DEVTYPE", "scsi_device")
}

// sessionDown announces a session logged out.
func (a *announcer) sessionDown(s Session) {
	for _, l := range s.LUNs {
		a.lunDown(s, l)
	}
	a.emit(uevent.Remove, fmt.Sprintf("%s/connection%d:0/iscsi_connection/connection%d:0", sessionPath(s), s.ID, s.ID), "iscsi_connection")
	a.emit(uevent.Remove, sessionPath(s)+"/iscsi_session/session"+strconv.Itoa(s.ID), "iscsi_session")
}

func (a *announcer) mapEvent(action uevent.Action, m Map) {
	a.emit(action, "/devices/virtual/block/"+m.Device, "block", "DEVTYPE", "disk", "DEVNAME", m.Device, "DM_NAME", m.Name)
}

// Announce makes the host queue, from now on, the uevents its kernel
// sends for what it does; TakeUevents takes them.
func (h *Host) Announce() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ann.on = true
}

// TakeUevents returns the uevents queued since the last call, in order.
func (h *Host) TakeUevents() []uevent.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.ann.events
	h.ann.events = nil
	return out
}

// diskChanged announces a change of disk, wherever it is.
func (a *announcer) diskChanged(sessions map[string]Session, disk string) {
	for _, s := range sessions {
		for _, l := range s.LUNs {
			if l.Disk == disk {
				a.emit(uevent.Change, lunPath(s, l)+"/block/"+disk, "block", "DEVTYPE", "disk", "DEVNAME", disk)
			}
		}
	}
}
