package nvme

import (
	"net"
	"strconv"
	"strings"

	"github.com/pathmend/pathmend/pkg/volume"
)

// Expectation is what one staged NVMe/TCP volume needs from the kernel:
// its subsystem, the endpoints it was staged with and the identity of its
// namespace. Inspect uses expectations for the defects that need a volume
// (NamespaceMissing, and StaleEndpoint for endpoints no volume lists).
type Expectation struct {
	// VolumeID is the CSI volume ID.
	VolumeID string
	// NQN is the subsystem NQN.
	NQN string
	// Endpoints are every path the volume expects.
	Endpoints []volume.Endpoint
	// OptimizedEndpoints is the subset expected to be ANA-optimized
	// (empty: all). Inspect does not read it: an ANA state the target
	// chose is not a defect of the host; the monitor reconciles it.
	OptimizedEndpoints []volume.Endpoint
	// NSID, NGUID and UUID identify the namespace; zero values are "not
	// given". NGUID is 32 hex digits, UUID the canonical 8-4-4-4-12 form.
	NSID  uint32
	NGUID string
	UUID  string
}

// ExpectationFromRecord builds the expectation of a staged-volume record.
// ok is false for records of other transports.
func ExpectationFromRecord(r volume.Record) (e Expectation, ok bool) {
	n := r.Context.NVMe
	if r.Context.Transport != volume.TransportNVMeTCP || n == nil {
		return Expectation{}, false
	}
	return Expectation{
		VolumeID:           r.VolumeID,
		NQN:                n.NQN,
		Endpoints:          n.Endpoints,
		OptimizedEndpoints: n.OptimizedEndpoints,
		NSID:               n.NSID,
		NGUID:              n.NGUID,
		UUID:               n.UUID,
	}, true
}

// idMatch is the result of comparing an expectation with a namespace.
type idMatch int

const (
	// idUnknown: no identity field the expectation gives is published
	// by the namespace, so nothing could be compared.
	idUnknown idMatch = iota
	// idMatches: every compared field is equal (at least one compared).
	idMatches
	// idDiffers: at least one compared field differs.
	idDiffers
)

// matchIdentity compares the namespace identity fields e gives with those
// ns publishes. NSID is always published. NGUIDs and UUIDs are compared
// as hex digits, ignoring dashes and case: the kernel prints the NGUID in
// UUID layout.
func (e *Expectation) matchIdentity(ns *Namespace) idMatch {
	compared := false
	if e.NSID != 0 {
		if e.NSID != ns.NSID {
			return idDiffers
		}
		compared = true
	}
	for _, f := range [...]struct{ want, have string }{{e.NGUID, ns.NGUID}, {e.UUID, ns.UUID}} {
		if f.want == "" || f.have == "" {
			continue
		}
		if hexDigits(f.want) != hexDigits(f.have) {
			return idDiffers
		}
		compared = true
	}
	if !compared {
		return idUnknown
	}
	return idMatches
}

// Matches reports whether ns is the namespace e needs: every identity
// field e gives that ns publishes is equal, and at least one was compared.
func (e *Expectation) Matches(ns *Namespace) bool {
	return e.matchIdentity(ns) == idMatches
}

// hexDigits lowercases s and drops dashes.
func hexDigits(s string) string {
	return strings.ToLower(strings.ReplaceAll(s, "-", ""))
}

// describe renders the identity for details: "nsid 2 nguid …".
func (e *Expectation) describe() string {
	var parts []string
	if e.NSID != 0 {
		parts = append(parts, "nsid "+strconv.FormatUint(uint64(e.NSID), 10))
	}
	if e.NGUID != "" {
		parts = append(parts, "nguid "+e.NGUID)
	}
	if e.UUID != "" {
		parts = append(parts, "uuid "+e.UUID)
	}
	return strings.Join(parts, " ")
}

// lists reports whether the expectation lists the controller's fabric
// address (traddr and trsvcid; the host side is not compared, since the
// kernel fills it in when a volume leaves it to the kernel). known is
// false when the answer cannot be decided without name resolution: an
// endpoint host that is not an IP literal, or a controller traddr that is
// not one, or an expectation without endpoints.
func (e *Expectation) lists(a Address) (listed, known bool) {
	ip := net.ParseIP(a.Traddr)
	port, err := strconv.ParseUint(a.Trsvcid, 10, 16)
	if ip == nil || err != nil || len(e.Endpoints) == 0 {
		return false, false
	}
	known = true
	for _, ep := range e.Endpoints {
		eip := net.ParseIP(ep.Host)
		if eip == nil {
			known = false
			continue
		}
		if eip.Equal(ip) && uint64(ep.Port) == port {
			return true, true
		}
	}
	return false, known
}
