package volume

import (
	"slices"
	"strconv"
	"strings"
)

// Encode renders the context back to canonical volume context keys: only
// keys that are set, addresses in normalized form, iSCSI portals always
// with their port. For a Context returned by Parse, Parse(c.Encode(), nil)
// returns a Context equal to c. Encode never yields secrets, since a
// Context holds none.
func (c Context) Encode() map[string]string {
	m := map[string]string{keyTransport: string(c.Transport)}
	switch {
	case c.Transport == TransportNVMeTCP && c.NVMe != nil:
		n := c.NVMe
		m[keyNQN] = n.NQN
		m[keyEndpoints] = joinEndpoints(n.Endpoints)
		setIf(m, keyOptimizedEndpoints, joinEndpoints(n.OptimizedEndpoints))
		if n.NSID != 0 {
			m[keyNSID] = strconv.FormatUint(uint64(n.NSID), 10)
		}
		setIf(m, keyNGUID, n.NGUID)
		setIf(m, keyUUID, n.UUID)
		setIf(m, keyHostTraddr, n.HostTraddr)
		setIf(m, keyHostIface, n.HostIface)
		setInt(m, keyCtrlLossTmo, n.CtrlLossTmo)
		setInt(m, keyReconnectDelay, n.ReconnectDelay)
		setInt(m, keyFastIOFailTmo, n.FastIOFailTmo)
		setInt(m, keyKeepAliveTmo, n.KeepAliveTmo)
		setInt(m, keyNrIOQueues, n.NrIOQueues)
	case c.Transport == TransportISCSI && c.ISCSI != nil:
		s := c.ISCSI
		m[keyIQN] = s.IQN
		m[keyPortals] = joinEndpoints(s.Portals)
		m[keyLUN] = strconv.Itoa(s.LUN)
		setInt(m, keyReplacementTimeout, s.ReplacementTimeout)
	}
	return m
}

func joinEndpoints(eps []Endpoint) string {
	parts := make([]string, len(eps))
	for i, ep := range eps {
		parts[i] = ep.String()
	}
	return strings.Join(parts, ",")
}

func setIf(m map[string]string, key, v string) {
	if v != "" {
		m[key] = v
	}
}

func setInt(m map[string]string, key string, v *int) {
	if v != nil {
		m[key] = strconv.Itoa(*v)
	}
}

// Equal reports whether c and o describe the same volume with the same
// connection settings, i.e. whether staging o again where c is staged needs
// no change. Both are expected to come from Parse (directly or through a
// record), which makes field comparison sufficient; nil and empty lists
// compare equal, and tunables compare by value.
func (c Context) Equal(o Context) bool {
	return c.Transport == o.Transport && c.NVMe.equal(o.NVMe) && c.ISCSI.equal(o.ISCSI)
}

func (n *NVMeTCP) equal(o *NVMeTCP) bool {
	if n == nil || o == nil {
		return n == o
	}
	return n.NQN == o.NQN &&
		slices.Equal(n.Endpoints, o.Endpoints) &&
		slices.Equal(n.OptimizedEndpoints, o.OptimizedEndpoints) &&
		n.NSID == o.NSID && n.NGUID == o.NGUID && n.UUID == o.UUID &&
		n.HostTraddr == o.HostTraddr && n.HostIface == o.HostIface &&
		intPtrEqual(n.CtrlLossTmo, o.CtrlLossTmo) &&
		intPtrEqual(n.ReconnectDelay, o.ReconnectDelay) &&
		intPtrEqual(n.FastIOFailTmo, o.FastIOFailTmo) &&
		intPtrEqual(n.KeepAliveTmo, o.KeepAliveTmo) &&
		intPtrEqual(n.NrIOQueues, o.NrIOQueues)
}

func (s *ISCSI) equal(o *ISCSI) bool {
	if s == nil || o == nil {
		return s == o
	}
	return s.IQN == o.IQN &&
		slices.Equal(s.Portals, o.Portals) &&
		s.LUN == o.LUN &&
		intPtrEqual(s.ReplacementTimeout, o.ReplacementTimeout)
}

func intPtrEqual(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}
