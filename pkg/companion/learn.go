package companion

import (
	"fmt"
	"slices"
	"time"

	"github.com/pathmend/pathmend/pkg/nvme"
)

// Sighting is one controller of a subsystem in one read of sysfs.
type Sighting struct {
	Controller nvme.Controller
	// Params are the controller's connect parameters; ParamsOK is false
	// when they could not be read (the controller was going away).
	Params   nvme.ConnectParams
	ParamsOK bool
}

// EventKind says what learning decided about an endpoint or a subsystem.
type EventKind string

// The events of Learn.
const (
	// Learned: a controller on a new endpoint; its options are kept.
	Learned EventKind = "learned"
	// GaveUp: the controller vanished while the kernel was reconnecting
	// it; the endpoint is connected again when it answers.
	GaveUp EventKind = "given up by the kernel"
	// Disconnected: the controller vanished while live; someone
	// disconnected it on purpose, and the endpoint is forgotten.
	Disconnected EventKind = "disconnected"
	// Forgotten: the subsystem is forgotten (no endpoint left, or every
	// controller gone for longer than the bound).
	Forgotten EventKind = "forgotten"
	// Full: a new endpoint was not learned: the subsystem has
	// MaxEndpoints already.
	Full EventKind = "not learned"
)

// Event is one decision of Learn, for the log.
type Event struct {
	Kind     EventKind
	NQN      string
	Endpoint string
	Reason   string
}

// Learn applies one read of the node to what was learned before and
// returns the new state; prev is not modified. seen holds the sightings
// of every subsystem companion mode may learn this read (NVMe/TCP, not a
// discovery subsystem, not the node plugin's), keyed by NQN; a learned
// subsystem missing from seen has no controller at all.
//
// The rule, per endpoint:
//
//   - a controller in any state but deleting (dead included: it is
//     still there) makes the endpoint present. A new endpoint is learned
//     unless its controller is already being deleted; the options and the
//     controller name follow what the kernel publishes, and the last state
//     other than deleting and dead is remembered;
//   - an endpoint with no present controller is gone (since now, if it
//     was not already). If the last state seen was connecting or
//     resetting, the kernel gave it up (ctrl_loss_tmo ran out) and it is
//     kept, to be connected again; if a companion repair tore it down it
//     is kept too; otherwise it was live (or new) and someone
//     disconnected it on purpose: it is forgotten.
//
// A subsystem with no endpoint left, or whose endpoints have all been
// gone for forgetAfter or longer, is forgotten. changed lists the
// subsystems to write, forgotten the ones to delete, both in NQN order.
func Learn(prev map[string]Subsystem, seen map[string][]Sighting, forgetAfter time.Duration, now time.Time) (next map[string]Subsystem, changed, forgotten []string, events []Event) {
	return learn(prev, seen, nil, forgetAfter, now)
}

// learn is Learn with hold: endpoints ("nqn endpoint") companion mode
// connected again after the sightings were read. One of them missing
// from seen is left as it is: the read may have come before its new
// controller, which the connect recorded live; the next read decides.
func learn(prev map[string]Subsystem, seen map[string][]Sighting, hold map[string]bool, forgetAfter time.Duration, now time.Time) (next map[string]Subsystem, changed, forgotten []string, events []Event) {
	next = make(map[string]Subsystem, len(prev)+len(seen))
	nqns := sortedNQNs(prev)
	for n := range seen {
		if _, ok := prev[n]; !ok {
			nqns = append(nqns, n)
		}
	}
	slices.Sort(nqns)
	for _, nqn := range nqns {
		old, had := prev[nqn]
		sub := old.clone()
		sub.NQN, sub.Version = nqn, LearnedVersion
		evs := learnSubsystem(&sub, seen[nqn], hold, now)
		if why := forget(&sub, forgetAfter, now); why != "" {
			if had {
				evs = append(evs, Event{Kind: Forgotten, NQN: nqn, Reason: why})
				forgotten = append(forgotten, nqn)
			}
			events = append(events, evs...)
			continue
		}
		events = append(events, evs...)
		sub.sortEndpoints()
		next[nqn] = sub
		if !had || !slices.Equal(old.Endpoints, sub.Endpoints) {
			changed = append(changed, nqn)
		}
	}
	return next, changed, forgotten, events
}

// learnSubsystem updates sub's endpoints from one read's sightings.
func learnSubsystem(sub *Subsystem, sightings []Sighting, hold map[string]bool, now time.Time) []Event {
	var evs []Event
	present := map[nvme.Endpoint]bool{}
	// A controller whose address is unknown (not seen live by this
	// process) is nothing to learn from. It is the endpoint's it was
	// learned under when that endpoint's controller has its name and is
	// not gone (the kernel reuses a name only once its controller is
	// deleted); otherwise it may be any endpoint's, and while it is
	// there no endpoint counts as gone.
	unknown := false
	for _, s := range sightings {
		c := &s.Controller
		if c.AddressUnknown {
			if c.State.Deleting() {
				continue
			}
			i := slices.IndexFunc(sub.Endpoints, func(e Endpoint) bool { return e.Controller == c.Name && e.GoneSince.IsZero() })
			if i < 0 {
				unknown = true
				continue
			}
			e := &sub.Endpoints[i]
			present[e.Endpoint] = true
			if c.State.Known() && c.State != nvme.StateDead {
				e.LastState = c.State
			}
			continue
		}
		ep := c.Endpoint()
		gone := c.State.Deleting()
		e := sub.endpoint(ep)
		if e == nil {
			if gone || !s.ParamsOK {
				continue // never learn a controller on its way out
			}
			if len(sub.Endpoints) >= MaxEndpoints {
				evs = append(evs, Event{Kind: Full, NQN: sub.NQN, Endpoint: ep.String(), Reason: fmt.Sprintf("the subsystem has %d endpoints learned already", MaxEndpoints)})
				continue
			}
			sub.Endpoints = append(sub.Endpoints, Endpoint{Endpoint: ep, FirstSeen: now})
			e = &sub.Endpoints[len(sub.Endpoints)-1]
			evs = append(evs, Event{Kind: Learned, NQN: sub.NQN, Endpoint: ep.String(), Reason: "controller " + string(c.Name) + " " + string(c.State)})
		}
		if gone {
			continue
		}
		present[ep] = true
		e.Controller, e.GoneSince, e.TornDown = c.Name, time.Time{}, false
		if c.State.Known() && c.State != nvme.StateDead {
			e.LastState = c.State
		}
		if s.ParamsOK {
			e.HostNQN, e.KATO, e.Params = c.HostNQN, c.KATO, s.Params
			e.CtrlLossTmo, e.ReconnectDelay, e.FastIOFailTmo = c.CtrlLossTmo, c.ReconnectDelay, c.FastIOFailTmo
		}
	}
	kept := sub.Endpoints[:0]
	for _, e := range sub.Endpoints {
		if present[e.Endpoint] || unknown || hold[sub.NQN+" "+e.String()] {
			kept = append(kept, e)
			continue
		}
		newlyGone := e.GoneSince.IsZero()
		if newlyGone {
			e.GoneSince = now
		}
		switch {
		case e.TornDown:
		case e.GivenUp():
			if newlyGone {
				evs = append(evs, Event{Kind: GaveUp, NQN: sub.NQN, Endpoint: e.String(), Reason: "controller " + string(e.Controller) + " vanished while " + string(e.LastState)})
			}
		default:
			evs = append(evs, Event{Kind: Disconnected, NQN: sub.NQN, Endpoint: e.String(), Reason: "controller " + string(e.Controller) + " vanished while " + string(e.LastState) + "; forgotten"})
			continue
		}
		kept = append(kept, e)
	}
	sub.Endpoints = kept
	return evs
}

// forget says why sub is forgotten, or "".
func forget(sub *Subsystem, forgetAfter time.Duration, now time.Time) string {
	if len(sub.Endpoints) == 0 {
		return "no endpoint left"
	}
	var last time.Time
	for _, e := range sub.Endpoints {
		if e.GoneSince.IsZero() {
			return ""
		}
		if e.GoneSince.After(last) {
			last = e.GoneSince
		}
	}
	if gone := now.Sub(last); gone >= forgetAfter {
		return fmt.Sprintf("every controller gone for %s (bound %s)", gone.Round(time.Second), forgetAfter)
	}
	return ""
}
