package nvme

import (
	"fmt"
	"slices"
	"strconv"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Connect defaults pathmend uses for a key the volume context does not
// set, chosen so that a staged volume keeps its block device through an
// outage of every path (docs/volume-context.md):
//
// On Linux a native-multipath head is removed as soon as its namespace
// has no path left, and a controller the kernel gives up on (its
// ctrl_loss_tmo ran out, 600 s by default) takes its paths with it. A
// staged volume whose every controller was given up on loses its device:
// the paths that return make a new head, and the staging mount stays on
// the removed one. So pathmend never lets the kernel give a volume's
// controller up (ctrl_loss_tmo -1): it disconnects a volume's controllers
// itself at NodeUnstage, and tears down controllers to endpoints no staged
// volume lists. Reconnecting forever would queue I/O forever while no
// path is left; fast_io_fail_tmo ends that: after it, I/O fails (the
// device stays, and works again when a path returns). reconnect_delay is
// how soon the kernel notices a returned port.
const (
	// DefaultCtrlLossTmo: the kernel never gives a controller up.
	DefaultCtrlLossTmo = -1
	// DefaultFastIOFailTmo: I/O on a volume with no path left fails
	// after 10 minutes — what it did with the kernel's defaults, when the
	// controller was given up after 600 s — instead of waiting forever.
	// Used only with an unbounded ctrl_loss_tmo; a finite one ends the
	// wait itself.
	DefaultFastIOFailTmo = 600
	// DefaultReconnectDelay: a returned port is live again within 5 s
	// (the kernel default is 10).
	DefaultReconnectDelay = 5
	// CtrlLossTmoFloor: a volume context setting a finite ctrlLossTmo
	// below this is warned about at NodeStage; an outage of every path
	// longer than its ctrlLossTmo costs a staged volume its device.
	CtrlLossTmoFloor = 600
	// DelayedRemovalSecs is written to delayed_removal_secs of a staged
	// volume's head where the kernel offers it (Linux 6.16 and later; not
	// 6.1): a head that lost its last path then survives this long,
	// queueing I/O, and its namespace's returning paths join it instead of
	// making a new device.
	DelayedRemovalSecs = 600
)

// Timeouts are the effective connect timeouts of a volume: its volume
// context's, else pathmend's defaults. -1 is the kernel's "off" (never
// give up; never fail fast).
type Timeouts struct {
	CtrlLossTmo, ReconnectDelay, FastIOFailTmo int
}

// TimeoutsOf returns the effective timeouts of an NVMe/TCP volume.
func TimeoutsOf(n *volume.NVMeTCP) Timeouts {
	t := Timeouts{CtrlLossTmo: DefaultCtrlLossTmo, ReconnectDelay: DefaultReconnectDelay, FastIOFailTmo: -1}
	if n.CtrlLossTmo != nil {
		t.CtrlLossTmo = *n.CtrlLossTmo
	}
	if n.ReconnectDelay != nil {
		t.ReconnectDelay = *n.ReconnectDelay
	}
	switch {
	case n.FastIOFailTmo != nil:
		t.FastIOFailTmo = *n.FastIOFailTmo
	case t.CtrlLossTmo < 0:
		t.FastIOFailTmo = DefaultFastIOFailTmo
	}
	return t
}

// ShortCtrlLossTmo returns a warning when n sets a finite ctrlLossTmo
// below CtrlLossTmoFloor, "" otherwise.
func ShortCtrlLossTmo(n *volume.NVMeTCP) string {
	if n.CtrlLossTmo == nil || *n.CtrlLossTmo < 0 || *n.CtrlLossTmo >= CtrlLossTmoFloor {
		return ""
	}
	return fmt.Sprintf("ctrlLossTmo %d s is below %d s: when every path of the volume is down longer than that, the kernel gives its controllers up and removes its block device, and the staged filesystem stays on the removed device until the pods are restarted; leave ctrlLossTmo out (pathmend then never lets the kernel give a controller up) or set -1", *n.CtrlLossTmo, CtrlLossTmoFloor)
}

// Tune is one write that brings a controller or a head to the timeouts
// its staged volumes need: Path is relative to the sysfs root.
type Tune struct {
	Path     string
	From, To string
}

// TuneTarget is one staged volume as TimeoutTunes needs it.
type TuneTarget struct {
	Expectation Expectation
	Timeouts    Timeouts
}

// ControllerTimeouts returns, for every present controller of a staged
// volume in h, the timeouts its volumes need. A controller shared by
// volumes whose timeouts differ is left out and named in conflicts (the
// first stage's connect set its timeouts; no volume's wish overrides
// another's). It reads only h, which needs no timeout attribute
// (ScopePaths will do).
func ControllerTimeouts(h *Host, targets []TuneTarget) (want map[ControllerName]Timeouts, conflicts []string) {
	return ControllerTimeoutsIn(NewIndex(h), targets)
}

// ControllerTimeoutsIn is ControllerTimeouts on an index of the host.
func ControllerTimeoutsIn(x *Index, targets []TuneTarget) (want map[ControllerName]Timeouts, conflicts []string) {
	want = map[ControllerName]Timeouts{}
	clash := map[ControllerName]bool{}
	for _, t := range targets {
		for _, ep := range t.Expectation.Endpoints {
			for _, c := range x.ControllersOf(t.Expectation.NQN) {
				if !presentTo(c, ep) {
					continue
				}
				if !c.Fabrics() {
					continue
				}
				if w, seen := want[c.Name]; seen {
					if w != t.Timeouts {
						clash[c.Name] = true
					}
					continue
				}
				want[c.Name] = t.Timeouts
			}
		}
	}
	for name := range clash {
		delete(want, name)
		conflicts = append(conflicts, string(name))
	}
	slices.Sort(conflicts)
	return want, conflicts
}

// TimeoutTunesOf reads the timeouts of controller name (one read of each
// attribute) and returns the writes that bring them to w, reconnect_delay
// first: the kernel derives ctrl_loss_tmo from it.
func TimeoutTunesOf(fsys sysfs.FS, name ControllerName, w Timeouts) ([]Tune, error) {
	dir := classNVMe + "/" + string(name) + "/"
	read := func(attr string) (Timeout, error) {
		v, err := fsys.ReadAttr(dir + attr)
		if err != nil {
			return Timeout{}, err
		}
		return ParseTimeout(v)
	}
	var tunes []Tune
	add := func(attr string, shown, to int) error {
		have, err := read(attr)
		if err != nil {
			return err
		}
		if have != timeoutOf(shown) {
			tunes = append(tunes, Tune{Path: dir + attr, From: have.String(), To: strconv.Itoa(to)})
		}
		return nil
	}
	if err := add("reconnect_delay", w.ReconnectDelay, w.ReconnectDelay); err != nil {
		return nil, err
	}
	// The kernel keeps ctrl_loss_tmo as a count of reconnects and shows it
	// rounded up to whole reconnect delays.
	loss := w.CtrlLossTmo
	if loss > 0 && w.ReconnectDelay > 0 {
		loss = (loss + w.ReconnectDelay - 1) / w.ReconnectDelay * w.ReconnectDelay
	}
	if err := add("ctrl_loss_tmo", loss, w.CtrlLossTmo); err != nil {
		return nil, err
	}
	if err := add("fast_io_fail_tmo", w.FastIOFailTmo, w.FastIOFailTmo); err != nil {
		return nil, err
	}
	return tunes, nil
}

// DelayedRemovalTune returns the write that sets delayed_removal_secs of
// head to DelayedRemovalSecs when the kernel has the attribute and it is
// 0; ok is false otherwise (Linux 6.1 has no such attribute).
func DelayedRemovalTune(fsys sysfs.FS, head DeviceName) (t Tune, ok bool) {
	p := "block/" + string(head) + "/delayed_removal_secs"
	v, present, err := fsys.ReadOptionalAttr(p)
	if err != nil || !present || v != "0" {
		return Tune{}, false
	}
	return Tune{Path: p, From: v, To: strconv.Itoa(DelayedRemovalSecs)}, true
}

// TimeoutTunes plans every write that aligns, in h, the present
// controllers of the staged volumes of targets with their timeouts
// (ControllerTimeouts, TimeoutTunesOf, in controller order) and sets
// delayed_removal_secs of their heads where the kernel has it. It reads
// the attributes it compares; it writes nothing.
func TimeoutTunes(fsys sysfs.FS, h *Host, targets []TuneTarget) (tunes []Tune, conflicts []string) {
	want, conflicts := ControllerTimeouts(h, targets)
	names := make([]ControllerName, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b ControllerName) int { return a.Instance() - b.Instance() })
	for _, n := range names {
		if ts, err := TimeoutTunesOf(fsys, n, want[n]); err == nil {
			tunes = append(tunes, ts...)
		}
	}
	for _, t := range targets {
		if loc, err := Locate(h, t.Expectation); err == nil && loc.Namespace.Head != "" {
			if tu, ok := DelayedRemovalTune(fsys, loc.Namespace.Head); ok {
				tunes = append(tunes, tu)
			}
		}
	}
	return tunes, conflicts
}

// timeoutOf is how the kernel shows a timeout of t seconds: "off" for a
// negative one.
func timeoutOf(t int) Timeout {
	if t < 0 {
		return Timeout{Off: true}
	}
	return Timeout{Seconds: t}
}

// ApplyTunes writes tunes through fsys and returns the ones written; a
// write the kernel refuses is logged and skipped.
func ApplyTunes(fsys sysfs.FS, tunes []Tune) []Tune {
	var done []Tune
	for _, t := range tunes {
		if err := fsys.WriteAttr(t.Path, t.To); err != nil {
			klog.ErrorS(err, "Could not align a timeout", "path", t.Path, "from", t.From, "to", t.To)
			continue
		}
		done = append(done, t)
	}
	return done
}
