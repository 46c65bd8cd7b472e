package nvmeheal

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Reasons of the node conditions the NVMe transport reports.
const (
	// ReasonTargetUnreachable: no endpoint of a target that staged
	// volumes list answers.
	ReasonTargetUnreachable = "TargetUnreachable"
	// ReasonEndpointsUnreachable: some endpoints of a target do not
	// answer; others do.
	ReasonEndpointsUnreachable = "EndpointsUnreachable"
)

// reachability remembers, per "nqn endpoint", the endpoints whose probe
// failed when the monitor last tried to reconnect them, and since when.
// An endpoint is forgotten when it is connected again or no staged volume
// lists it any more.
type reachability struct {
	mu    sync.Mutex
	state map[string]unreach
}

type unreach struct {
	since time.Time
	why   string
}

func newReachability() *reachability { return &reachability{state: map[string]unreach{}} }

func (r *reachability) unreachable(key string, now time.Time, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	u, ok := r.state[key]
	if !ok {
		u.since = now
	}
	u.why = why
	r.state[key] = u
}

func (r *reachability) reachable(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.state, key)
}

// prune keeps only the endpoints still missing a controller (missing):
// one with a controller again is not unreachable.
func (r *reachability) prune(missing map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k := range r.state {
		if !missing[k] {
			delete(r.state, k)
		}
	}
}

// Conditions are the node's NVMe/TCP storage conditions as of the last
// tick: for each target (subsystem NQN) of staged volumes with endpoints
// that did not answer pathmend's probe, TargetUnreachable (Inaccessible)
// when none of its listed endpoints answers, else EndpointsUnreachable
// (Degraded). The message names each endpoint, why and since when, and
// what to check.
func (t *Transport) Conditions() []volume.Condition {
	t.mu.Lock()
	listed := t.endpoints
	t.mu.Unlock()
	t.reach.mu.Lock()
	defer t.reach.mu.Unlock()
	byNQN := map[string][]string{}
	for key, u := range t.reach.state {
		nqn, ep, _ := strings.Cut(key, " ")
		byNQN[nqn] = append(byNQN[nqn], fmt.Sprintf("%s %s (since %s)", ep, u.why, u.since.UTC().Format(time.RFC3339)))
	}
	var out []volume.Condition
	for _, nqn := range slices.Sorted(maps.Keys(byNQN)) {
		eps := byNQN[nqn]
		slices.Sort(eps)
		c := volume.Condition{Status: volume.Degraded, Reason: ReasonEndpointsUnreachable}
		if len(eps) >= listed[nqn] {
			c.Status, c.Reason = volume.Inaccessible, ReasonTargetUnreachable
		}
		c.Message = fmt.Sprintf("NVMe/TCP target %s: %d of %d endpoints do not answer from this node: %s; check the target's ports and the network between this node and them (pathmend reconnects an endpoint on the tick after it answers)",
			nqn, len(eps), listed[nqn], strings.Join(eps, "; "))
		out = append(out, c)
	}
	return out
}

// trackEndpoints records, after a tick, how many endpoints staged volumes
// list per target and forgets the unreachable ones that have a controller
// again in host (the tick's last read) or that no volume lists any more.
func (t *Transport) trackEndpoints(idx *nvme.Index, exps []nvme.Expectation) {
	type listed struct {
		nqn string
		ep  volume.Endpoint
	}
	seen := make(map[listed]bool, len(exps)*3)
	counts := make(map[string]int, len(exps))
	var missing map[string]bool
	for _, e := range exps {
		for _, ep := range e.Endpoints {
			if k := (listed{e.NQN, ep}); !seen[k] {
				seen[k] = true
				counts[e.NQN]++
			}
			if !idx.Covered(e.NQN, ep) {
				if missing == nil {
					missing = map[string]bool{}
				}
				missing[e.NQN+" "+ep.String()] = true
			}
		}
	}
	t.reach.prune(missing)
	t.mu.Lock()
	t.endpoints = counts
	t.mu.Unlock()
}
