package volume

import (
	"slices"
	"strconv"
	"strings"
)

// Volume context and node-stage secret keys. They are the wire contract with
// StorageClass parameters, PV volumeAttributes and secrets; renaming one
// breaks every existing volume.
const (
	keyTransport = "transport"

	keyNQN                = "nqn"
	keyEndpoints          = "endpoints"
	keyOptimizedEndpoints = "optimizedEndpoints"
	keyNSID               = "nsid"
	keyNGUID              = "nguid"
	keyUUID               = "uuid"
	keyHostTraddr         = "hostTraddr"
	keyHostIface          = "hostIface"
	keyCtrlLossTmo        = "ctrlLossTmo"
	keyReconnectDelay     = "reconnectDelay"
	keyFastIOFailTmo      = "fastIOFailTmo"
	keyKeepAliveTmo       = "keepAliveTmo"
	keyNrIOQueues         = "nrIOQueues"
	keyDHCHAPSecret       = "dhchapSecret"
	keyDHCHAPCtrlSecret   = "dhchapCtrlSecret"

	keyIQN                = "iqn"
	keyPortals            = "portals"
	keyLUN                = "lun"
	keyReplacementTimeout = "replacementTimeout"
	keyCHAPUsername       = "chapUsername"
	keyCHAPPassword       = "chapPassword"
	keyCHAPUsernameIn     = "chapUsernameIn"
	keyCHAPPasswordIn     = "chapPasswordIn"
)

// IgnoredKeyPrefix marks keys that Kubernetes components add on their own:
// kubelet's podInfoOnMount attributes and the external-provisioner's extra
// create metadata. Parse skips them in both the volume context and the
// secrets, because they are not written by the administrator and a new
// Kubernetes release may add more at any time.
const IgnoredKeyPrefix = "csi.storage.k8s.io/"

// intRange is the accepted range of an integer key. MinusOne additionally
// admits -1, which the kernel reads as "forever" or "off".
type intRange struct {
	Min, Max int64
	MinusOne bool
}

func (r intRange) contains(n int64) bool {
	return (n >= r.Min && n <= r.Max) || (r.MinusOne && n == -1)
}

// String renders the range as documented, e.g. "-1 or 1..31536000".
func (r intRange) String() string {
	s := strconv.FormatInt(r.Min, 10) + ".." + strconv.FormatInt(r.Max, 10)
	if r.MinusOne {
		return "-1 or " + s
	}
	return s
}

// Ranges of the integer keys. A year of seconds bounds the timeouts: a larger
// value is certainly a unit mistake (milliseconds), not a policy.
var (
	rangePort               = intRange{Min: 1, Max: 65535}
	rangeNSID               = intRange{Min: 1, Max: 0xFFFFFFFE} // 0 and 0xFFFFFFFF (broadcast) name no namespace
	rangeCtrlLossTmo        = intRange{Min: 1, Max: 31536000, MinusOne: true}
	rangeReconnectDelay     = intRange{Min: 1, Max: 3600}
	rangeFastIOFailTmo      = intRange{Min: 0, Max: 31536000, MinusOne: true}
	rangeKeepAliveTmo       = intRange{Min: 1, Max: 3600}
	rangeNrIOQueues         = intRange{Min: 1, Max: 1024}
	rangeLUN                = intRange{Min: 0, Max: 16383}
	rangeReplacementTimeout = intRange{Min: 0, Max: 86400}
)

// KeyDoc documents one key of the volume-context contract. The table
// returned by Keys is the single source of truth: Parse derives the set of
// known keys from it, and a test checks that docs/volume-context.md lists
// exactly these keys.
type KeyDoc struct {
	// Key as written in volumeAttributes or in the node-stage secret.
	Key string
	// Transport the key belongs to; "" for a key every transport takes.
	Transport Transport
	// Required keys must be present. Keys of which at least one is needed
	// (nsid, nguid, uuid) are not Required each; Description says so.
	Required bool
	// Secret keys are read from the node-stage secret and rejected when
	// they appear in the volume context.
	Secret bool
	// Format is the accepted syntax or integer range.
	Format string
	// Default is what an absent optional key means; "" for required keys.
	Default string
	// Description is one sentence for a storage administrator.
	Description string
}

// anyTransport marks a key every transport takes.
const anyTransport Transport = ""

const (
	kernelDefault  = "kernel default"
	hostPortFormat = "comma-separated host:port, at most 64; IPv6 as [addr]:port"
)

var keyDocs = []KeyDoc{
	{Key: keyTransport, Required: true,
		Format:      "nvme-tcp or iscsi",
		Description: "Fabric the volume is attached over."},

	{Key: keyNQN, Transport: TransportNVMeTCP, Required: true,
		Format:      "nqn.yyyy-mm.reverse.domain[:id] or nqn.2014-08.org.nvmexpress:uuid:<uuid>; at most 223 bytes",
		Description: "NQN of the NVMe subsystem that holds the namespace."},
	{Key: keyEndpoints, Transport: TransportNVMeTCP, Required: true,
		Format:      hostPortFormat + "; port required",
		Description: "Every target port the node connects to; one path per endpoint."},
	{Key: keyOptimizedEndpoints, Transport: TransportNVMeTCP,
		Format:      hostPortFormat + "; each also in endpoints",
		Default:     "every endpoint",
		Description: "Endpoints expected to report ANA optimized; the rest are expected non-optimized."},
	{Key: keyNSID, Transport: TransportNVMeTCP,
		Format:      rangeNSID.String(),
		Description: "Namespace ID in the subsystem; at least one of nsid, nguid, uuid is required."},
	{Key: keyNGUID, Transport: TransportNVMeTCP,
		Format:      "32 hex digits, dashes allowed, not all zero",
		Description: "Namespace globally unique identifier; at least one of nsid, nguid, uuid is required."},
	{Key: keyUUID, Transport: TransportNVMeTCP,
		Format:      "8-4-4-4-12 hex, not all zero",
		Description: "Namespace UUID; at least one of nsid, nguid, uuid is required."},
	{Key: keyHostTraddr, Transport: TransportNVMeTCP,
		Format:      "IPv4 or IPv6 address",
		Default:     "routing decides",
		Description: "Local address every connection is made from (host_traddr)."},
	{Key: keyHostIface, Transport: TransportNVMeTCP,
		Format:      "network interface name, 1-15 characters, no '/', ':', ',', '=' or spaces",
		Default:     "routing decides",
		Description: "Local interface every connection is bound to (host_iface)."},
	{Key: keyCtrlLossTmo, Transport: TransportNVMeTCP,
		Format:      rangeCtrlLossTmo.String() + " seconds",
		Default:     "-1 (pathmend's default; the kernel's is 600)",
		Description: "How long a lost controller is retried before it is removed; -1 retries forever. Below 600 a staged volume can lose its device in an outage: warned about at stage."},
	{Key: keyReconnectDelay, Transport: TransportNVMeTCP,
		Format:      rangeReconnectDelay.String() + " seconds",
		Default:     "5 (pathmend's default; the kernel's is 10)",
		Description: "Delay between reconnect attempts."},
	{Key: keyFastIOFailTmo, Transport: TransportNVMeTCP,
		Format:      rangeFastIOFailTmo.String() + " seconds",
		Default:     "600 when ctrlLossTmo is -1, else the kernel's (-1, off)",
		Description: "How long I/O waits on a lost path before failing over; -1 turns it off."},
	{Key: keyKeepAliveTmo, Transport: TransportNVMeTCP,
		Format:      rangeKeepAliveTmo.String() + " seconds",
		Default:     kernelDefault + " (5)",
		Description: "NVMe keep-alive timeout."},
	{Key: keyNrIOQueues, Transport: TransportNVMeTCP,
		Format:      rangeNrIOQueues.String(),
		Default:     kernelDefault + " (one per CPU)",
		Description: "Number of I/O queues per controller."},
	{Key: keyDHCHAPSecret, Transport: TransportNVMeTCP, Secret: true,
		Format:      "DHHC-1:<hh>:<base64 key+crc>[:]",
		Default:     "no authentication",
		Description: "Host DH-HMAC-CHAP key, as printed by nvme gen-dhchap-key."},
	{Key: keyDHCHAPCtrlSecret, Transport: TransportNVMeTCP, Secret: true,
		Format:      "DHHC-1:<hh>:<base64 key+crc>[:]; needs dhchapSecret",
		Default:     "unidirectional",
		Description: "Controller DH-HMAC-CHAP key for bidirectional authentication."},

	{Key: keyIQN, Transport: TransportISCSI, Required: true,
		Format:      "iqn.yyyy-mm.reverse.domain[:id], eui.<16 hex> or naa.<16 or 32 hex>; at most 223 bytes",
		Description: "iSCSI name of the target."},
	{Key: keyPortals, Transport: TransportISCSI, Required: true,
		Format:      "comma-separated host[:port], at most 64, port 3260 when omitted; IPv6 as [addr]:port or a bare address",
		Description: "Every portal the node logs in to; one session per portal."},
	{Key: keyLUN, Transport: TransportISCSI, Required: true,
		Format:      rangeLUN.String(),
		Description: "Logical unit number of the volume on the target."},
	{Key: keyReplacementTimeout, Transport: TransportISCSI,
		Format:      rangeReplacementTimeout.String() + " seconds",
		Default:     "initiator default (120)",
		Description: "How long I/O is queued while a session is re-established."},
	{Key: keyCHAPUsername, Transport: TransportISCSI, Secret: true,
		Format:      "1-255 bytes, no control characters; needs chapPassword",
		Default:     "no CHAP",
		Description: "CHAP user name the initiator authenticates with."},
	{Key: keyCHAPPassword, Transport: TransportISCSI, Secret: true,
		Format:      "1-255 bytes, no control characters; needs chapUsername",
		Default:     "no CHAP",
		Description: "CHAP secret the initiator authenticates with."},
	{Key: keyCHAPUsernameIn, Transport: TransportISCSI, Secret: true,
		Format:      "1-255 bytes, no control characters; needs chapPasswordIn and chapUsername",
		Default:     "no mutual CHAP",
		Description: "CHAP user name the target authenticates with (mutual CHAP)."},
	{Key: keyCHAPPasswordIn, Transport: TransportISCSI, Secret: true,
		Format:      "1-255 bytes, no control characters; needs chapUsernameIn and chapPassword",
		Default:     "no mutual CHAP",
		Description: "CHAP secret the target authenticates with (mutual CHAP)."},
}

// Keys returns the documentation table of every key Parse accepts, in
// documentation order. The result is a copy; changing it changes nothing.
func Keys() []KeyDoc { return slices.Clone(keyDocs) }

// keyIndex maps a key name to its table entry.
var keyIndex = func() map[string]KeyDoc {
	m := make(map[string]KeyDoc, len(keyDocs))
	for _, d := range keyDocs {
		m[d.Key] = d
	}
	return m
}()

// knownKeys lists, sorted, the keys a transport accepts in the volume
// context (secret false) or in the node-stage secrets (secret true).
func knownKeys(t Transport, secret bool) []string {
	var keys []string
	for _, d := range keyDocs {
		if d.Secret == secret && (d.Transport == t || d.Transport == anyTransport) {
			keys = append(keys, d.Key)
		}
	}
	slices.Sort(keys)
	return keys
}

// credentialShape marks a key as a credential by its shape, whatever
// else it says: a key whose last segment contains any of these, in any
// case — (?i)(pass|secret|key|token|cred|auth|chap) — is treated as one.
// A misspelt, foreign or new key ("chapPasword", "pass", "auth.key",
// "iscsi.secret", "serviceAccount.tokens") is as secret as the documented
// one it was meant to be; a list of words would miss the next one.
var credentialShape = []string{"pass", "secret", "key", "token", "cred", "auth", "chap"}

// IsCredentialKey reports whether a key of any map a CSI request carries
// (volume context, publish context, secrets) names a credential, so that
// its value must never be logged: every key the contract classes as a
// secret (Keys with Secret set), in any case, behind any prefix, and every
// key whose last segment (after the last '/' or '.') has the credential
// shape. It errs on the side of redaction; it decides nothing else.
func IsCredentialKey(k string) bool {
	if i := strings.LastIndexAny(k, "/."); i >= 0 {
		k = k[i+1:]
	}
	lk := strings.ToLower(k)
	for _, d := range keyDocs {
		if d.Secret && strings.ToLower(d.Key) == lk {
			return true
		}
	}
	for _, w := range credentialShape {
		if strings.Contains(lk, w) {
			return true
		}
	}
	return false
}

// suggest returns the known key closest to k when it is plausibly a typo
// (same letters in another case, or at most two edits away), else "".
func suggest(k string, known []string) string {
	best, bestDist := "", 3
	lk := strings.ToLower(k)
	for _, c := range known {
		if d := editDistance(lk, strings.ToLower(c), bestDist); d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, or limit when
// it is at least limit. Keys are short, so the quadratic table is cheap;
// the limit only keeps a long fuzzed key from costing more than it must.
func editDistance(a, b string, limit int) int {
	if len(a)-len(b) >= limit || len(b)-len(a) >= limit {
		return limit
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		rowMin := cur[0]
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			rowMin = min(rowMin, cur[j])
		}
		if rowMin >= limit {
			return limit
		}
		prev, cur = cur, prev
	}
	return min(prev[len(b)], limit)
}
