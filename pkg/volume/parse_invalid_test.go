package volume

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// invalidCase is an input Parse rejects: the error must be a *FieldError
// for key (a secret key when secret is set) whose reason contains reason.
type invalidCase struct {
	name        string
	vc, secrets map[string]string
	key         string
	secret      bool
	reason      string
}

var invalidCases = []invalidCase{
	// transport and key set
	{name: "no transport", vc: withKeys(nvmeBase, "transport", drop), key: "transport", reason: "required; one of nvme-tcp, iscsi"},
	{name: "nil context", key: "transport", reason: "required"},
	{name: "empty transport", vc: withKeys(nvmeBase, "transport", ""), key: "transport", reason: "required"},
	{name: "unknown transport", vc: withKeys(nvmeBase, "transport", "fc"), key: "transport", reason: `unknown transport "fc"; known transports: nvme-tcp, iscsi`},
	{name: "transport is case sensitive", vc: withKeys(nvmeBase, "transport", "NVMe-TCP"), key: "transport", reason: "unknown transport"},
	{name: "typo suggests the key", vc: withKeys(nvmeBase, "endpoint", "192.0.2.10:4420"), key: "endpoint",
		reason: `unknown key for transport nvme-tcp (did you mean "endpoints"?); known keys: ctrlLossTmo, endpoints, fastIOFailTmo, hostIface, hostTraddr, keepAliveTmo, nguid, nqn, nrIOQueues, nsid, optimizedEndpoints, reconnectDelay, transport, uuid`},
	{name: "wrong case suggests the key", vc: withKeys(nvmeBase, "NQN", "x"), key: "NQN", reason: `did you mean "nqn"?`},
	{name: "iscsi key on nvme", vc: withKeys(nvmeBase, "iqn", "iqn.2001-04.com.example:x"), key: "iqn", reason: "unknown key for transport nvme-tcp (it belongs to transport iscsi)"},
	{name: "nvme key on iscsi", vc: withKeys(iscsiBase, "endpoints", "192.0.2.10:4420"), key: "endpoints",
		reason: "unknown key for transport iscsi (it belongs to transport nvme-tcp); known keys: iqn, lun, portals, replacementTimeout, transport"},
	{name: "unrelated unknown key", vc: withKeys(iscsiBase, "fsType", "ext4"), key: "fsType", reason: "unknown key for transport iscsi; known keys:"},
	{name: "prefix must match exactly", vc: withKeys(iscsiBase, "csi.storage.k8s.io.pod.name", "x"), key: "csi.storage.k8s.io.pod.name", reason: "unknown key"},
	{name: "DH-HMAC-CHAP key in the volume context", vc: withKeys(nvmeBase, "dhchapSecret", hostKey), key: "dhchapSecret",
		reason: "secrets must come from node-stage secrets, not the volume context"},
	{name: "CHAP password in the volume context", vc: withKeys(iscsiBase, "chapPassword", "leaked-password-1"), key: "chapPassword",
		reason: "secrets must come from node-stage secrets, not the volume context"},
	{name: "other transport's secret in the volume context", vc: withKeys(nvmeBase, "chapUsernameIn", "leaked-user"), key: "chapUsernameIn",
		reason: "secrets must come from node-stage secrets"},
	{name: "a 1 MiB unknown key", vc: withKeys(nvmeBase, hugeKey, "x"), key: hugeKey, reason: "unknown key for transport nvme-tcp"},
	{name: "empty key", vc: withKeys(nvmeBase, "", "x"), key: EmptyKey, reason: "a key is the empty string"},
	{name: "empty secret key", vc: nvmeBase, secrets: map[string]string{"": "x"}, key: EmptyKey, secret: true, reason: "a key is the empty string"},
	{name: "empty required value", vc: withKeys(nvmeBase, "nqn", ""), key: "nqn", reason: "required, but the value is empty"},
	{name: "empty optional value", vc: withKeys(nvmeBase, "ctrlLossTmo", ""), key: "ctrlLossTmo", reason: "value is empty; omit the key to use the default"},

	// nqn
	{name: "nqn missing", vc: withKeys(nvmeBase, "nqn", drop), key: "nqn", reason: "required for transport nvme-tcp"},
	{name: "nqn without prefix", vc: withKeys(nvmeBase, "nqn", "iqn.2014-08.com.example:x"), key: "nqn", reason: `must start with "nqn."`},
	{name: "nqn bad month", vc: withKeys(nvmeBase, "nqn", "nqn.2014-13.com.example:x"), key: "nqn", reason: "month of the date must be 01..12"},
	{name: "nqn month 00", vc: withKeys(nvmeBase, "nqn", "nqn.2014-00.com.example:x"), key: "nqn", reason: "month"},
	{name: "nqn short year", vc: withKeys(nvmeBase, "nqn", "nqn.14-08.com.example:x"), key: "nqn", reason: "date yyyy-mm"},
	{name: "nqn no domain", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.:x"), key: "nqn", reason: "reverse domain name after the date is empty"},
	{name: "nqn empty label", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com..example:x"), key: "nqn", reason: "empty label"},
	{name: "nqn label with hyphen at the edge", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.-com.example:x"), key: "nqn", reason: "starting or ending with '-'"},
	{name: "nqn label with underscore", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.ex_ample:x"), key: "nqn", reason: "only letters, digits and '-'"},
	{name: "nqn empty after colon", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:"), key: "nqn", reason: "nothing follows the ':'"},
	{name: "nqn with comma", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:a,b"), key: "nqn", reason: "contains a comma"},
	{name: "nqn with space", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:a b"), key: "nqn", reason: "whitespace"},
	{name: "nqn non-ASCII", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:bänd"), key: "nqn", reason: "non-ASCII"},
	{name: "nqn too long", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:"+strings.Repeat("a", 224-24)), key: "nqn", reason: "is 224 bytes long; an NQN is at most 223 bytes"},
	{name: "nqn discovery", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.org.nvmexpress.discovery"), key: "nqn", reason: "is the discovery NQN"},
	{name: "nqn with '=' (the fabrics option encoder refuses it)", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.com.example:a=b"), key: "nqn", reason: "contains '='"},
	{name: "nqn bad UUID form", vc: withKeys(nvmeBase, "nqn", "nqn.2014-08.org.nvmexpress:uuid:1234"), key: "nqn", reason: "UUID form"},

	// endpoints
	{name: "endpoints missing", vc: withKeys(nvmeBase, "endpoints", drop), key: "endpoints", reason: "required for transport nvme-tcp"},
	{name: "endpoint without port", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10"), key: "endpoints", reason: `item 1 "192.0.2.10": port is required`},
	{name: "endpoint port 0", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:0"), key: "endpoints", reason: `port "0" is out of range; want 1..65535`},
	{name: "endpoint port too big", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:65536"), key: "endpoints", reason: "out of range"},
	{name: "endpoint port with plus", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:+4420"), key: "endpoints", reason: "not a decimal integer"},
	{name: "endpoint empty port", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:"), key: "endpoints", reason: "nothing follows the ':'"},
	{name: "endpoint bare IPv6", vc: withKeys(nvmeBase, "endpoints", "fd00::1:4420"), key: "endpoints", reason: "must be in brackets with a port"},
	{name: "endpoint bracketed IPv6 without port", vc: withKeys(nvmeBase, "endpoints", "[fd00::1]"), key: "endpoints", reason: "port is required"},
	{name: "endpoint bracket not closed", vc: withKeys(nvmeBase, "endpoints", "[fd00::1:4420"), key: "endpoints", reason: "without a closing ']'"},
	{name: "endpoint junk after bracket", vc: withKeys(nvmeBase, "endpoints", "[fd00::1]4420"), key: "endpoints", reason: "only ':port' may follow ']'"},
	{name: "endpoint bracketed IPv4", vc: withKeys(nvmeBase, "endpoints", "[192.0.2.10]:4420"), key: "endpoints", reason: "brackets are only for IPv6"},
	{name: "endpoint bad IPv6", vc: withKeys(nvmeBase, "endpoints", "[fd00::zz]:4420"), key: "endpoints", reason: "is not a valid IP address"},
	{name: "endpoint IPv6 zone", vc: withKeys(nvmeBase, "endpoints", "[fe80::1%eth0]:4420"), key: "endpoints", reason: "zones are not supported"},
	{name: "endpoint unspecified address", vc: withKeys(nvmeBase, "endpoints", "0.0.0.0:4420"), key: "endpoints", reason: "not a unicast address"},
	{name: "endpoint multicast address", vc: withKeys(nvmeBase, "endpoints", "[ff02::1]:4420"), key: "endpoints", reason: "not a unicast address"},
	{name: "endpoint IPv4 out of range", vc: withKeys(nvmeBase, "endpoints", "10.0.0.256:4420"), key: "endpoints", reason: "neither a valid IP address nor a host name"},
	{name: "endpoint IPv4 with leading zero", vc: withKeys(nvmeBase, "endpoints", "10.0.0.010:4420"), key: "endpoints", reason: "neither a valid IP address nor a host name"},
	{name: "endpoint host with underscore", vc: withKeys(nvmeBase, "endpoints", "tar_get:4420"), key: "endpoints", reason: "host name has a label with the character '_'"},
	{name: "endpoint host with non-ASCII", vc: withKeys(nvmeBase, "endpoints", "zürich.example:4420"), key: "endpoints", reason: "non-ASCII byte"},
	{name: "endpoint empty host", vc: withKeys(nvmeBase, "endpoints", ":4420"), key: "endpoints", reason: "host is empty"},
	{name: "endpoint empty item", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:4420,,192.0.2.11:4420"), key: "endpoints", reason: "item 2 is empty"},
	{name: "endpoint trailing comma", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:4420,"), key: "endpoints", reason: "item 2 is empty"},
	{name: "endpoint duplicate", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:4420,192.0.2.10:4420"), key: "endpoints", reason: "item 2: 192.0.2.10:4420 is listed twice"},
	{name: "endpoint duplicate after normalization", vc: withKeys(nvmeBase, "endpoints", "[fd00::1]:4420, [FD00:0::1]:04420"), key: "endpoints", reason: "[fd00::1]:4420 is listed twice"},
	{name: "endpoint duplicate host name in other case", vc: withKeys(nvmeBase, "endpoints", "a.example:4420,A.EXAMPLE:4420"), key: "endpoints", reason: "listed twice"},
	{name: "more endpoints than MaxEndpoints", vc: withKeys(nvmeBase, "endpoints", manyEndpoints(MaxEndpoints+1, 4420)), key: "endpoints", reason: "lists 65 items; at most 64 are accepted"},
	{name: "160,000 endpoints are counted, not parsed", vc: withKeys(nvmeBase, "endpoints", manyEndpoints(160000, 4420)), key: "endpoints", reason: "lists 160000 items; at most 64"},
	{name: "long bad value is truncated", vc: withKeys(nvmeBase, "endpoints", strings.Repeat("x", 300)), key: "endpoints", reason: `"` + strings.Repeat("x", 64) + `"...`},

	// optimizedEndpoints
	{name: "optimized endpoint not in endpoints", vc: withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.12:4420"), key: "optimizedEndpoints", reason: "192.0.2.12:4420 is not listed in endpoints"},
	{name: "optimized endpoint duplicate", vc: withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.10:4420,192.0.2.10:4420"), key: "optimizedEndpoints", reason: "listed twice"},
	{name: "optimized endpoint without port", vc: withKeys(nvmeBase, "optimizedEndpoints", "192.0.2.10"), key: "optimizedEndpoints", reason: "port is required"},

	// namespace identity
	{name: "no namespace identity", vc: withKeys(nvmeBase, "nsid", drop), key: "nsid", reason: "one of nsid, nguid, uuid is required"},
	{name: "nsid 0", vc: withKeys(nvmeBase, "nsid", "0"), key: "nsid", reason: `"0" is out of range; want 1..4294967294`},
	{name: "nsid broadcast", vc: withKeys(nvmeBase, "nsid", "4294967295"), key: "nsid", reason: "out of range"},
	{name: "nsid hex", vc: withKeys(nvmeBase, "nsid", "0x1"), key: "nsid", reason: "not a decimal integer"},
	{name: "nsid with space", vc: withKeys(nvmeBase, "nsid", " 1"), key: "nsid", reason: "not a decimal integer"},
	{name: "nsid overflow", vc: withKeys(nvmeBase, "nsid", "99999999999999999999999"), key: "nsid", reason: "out of range"},
	{name: "nguid short", vc: withKeys(nvmeBase, "nguid", "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0"), key: "nguid", reason: "must be 32 hex digits"},
	{name: "nguid not hex", vc: withKeys(nvmeBase, "nguid", "6e0b0c8e1f2a4b3c8d4e5f6a7b8c9d0g"), key: "nguid", reason: "must be 32 hex digits"},
	{name: "nguid double dash", vc: withKeys(nvmeBase, "nguid", "6e0b0c8e--1f2a4b3c8d4e5f6a7b8c9d0e"), key: "nguid", reason: "dashes may only separate"},
	{name: "nguid all zero", vc: withKeys(nvmeBase, "nguid", "00000000-0000-0000-0000-000000000000"), key: "nguid", reason: "is all zero"},
	{name: "uuid without dashes", vc: withKeys(nvmeBase, "uuid", "0f9c3a523d2b4c6e9a1b2c3d4e5f6a7b"), key: "uuid", reason: "must be a UUID"},
	{name: "uuid braces", vc: withKeys(nvmeBase, "uuid", "{0f9c3a52-3d2b-4c6e-9a1b-2c3d4e5f6a7}"), key: "uuid", reason: "must be a UUID"},
	{name: "uuid all zero", vc: withKeys(nvmeBase, "uuid", "00000000-0000-0000-0000-000000000000"), key: "uuid", reason: "is all zero"},

	// host side
	{name: "nvme endpoint host name", vc: withKeys(nvmeBase, "endpoints", "192.0.2.10:4420,storage-a.example.com:4420"), key: "endpoints", reason: `item 2 "storage-a.example.com:4420": is a host name; nvme-tcp endpoints must be IP addresses`},
	{name: "hostTraddr host name", vc: withKeys(nvmeBase, "hostTraddr", "node1.example.com"), key: "hostTraddr", reason: "is not a valid IP address"},
	{name: "hostTraddr in brackets", vc: withKeys(nvmeBase, "hostTraddr", "[fd00::1]"), key: "hostTraddr", reason: "is not a valid IP address"},
	{name: "hostTraddr unspecified", vc: withKeys(nvmeBase, "hostTraddr", "::"), key: "hostTraddr", reason: "not a unicast address"},
	{name: "hostIface too long", vc: withKeys(nvmeBase, "hostIface", "abcdefghijklmnop"), key: "hostIface", reason: "is 16 characters long"},
	{name: "hostIface slash", vc: withKeys(nvmeBase, "hostIface", "eth/0"), key: "hostIface", reason: "contains '/' or ':'"},
	{name: "hostIface alias", vc: withKeys(nvmeBase, "hostIface", "eth0:1"), key: "hostIface", reason: "contains '/' or ':'"},
	{name: "hostIface dot dot", vc: withKeys(nvmeBase, "hostIface", ".."), key: "hostIface", reason: "is not an interface name"},
	{name: "hostIface with '='", vc: withKeys(nvmeBase, "hostIface", "eth=0"), key: "hostIface", reason: "contains '='"},
	{name: "hostIface comma", vc: withKeys(nvmeBase, "hostIface", "eth0,x"), key: "hostIface", reason: "contains a comma"},

	// tunables
	{name: "ctrlLossTmo 0", vc: withKeys(nvmeBase, "ctrlLossTmo", "0"), key: "ctrlLossTmo", reason: "want -1 or 1..31536000"},
	{name: "ctrlLossTmo -2", vc: withKeys(nvmeBase, "ctrlLossTmo", "-2"), key: "ctrlLossTmo", reason: `"-2" is out of range`},
	{name: "ctrlLossTmo too big", vc: withKeys(nvmeBase, "ctrlLossTmo", "31536001"), key: "ctrlLossTmo", reason: "out of range"},
	{name: "ctrlLossTmo with unit", vc: withKeys(nvmeBase, "ctrlLossTmo", "600s"), key: "ctrlLossTmo", reason: `"600s" is not a decimal integer`},
	{name: "ctrlLossTmo plus sign", vc: withKeys(nvmeBase, "ctrlLossTmo", "+600"), key: "ctrlLossTmo", reason: "not a decimal integer"},
	{name: "ctrlLossTmo lone minus", vc: withKeys(nvmeBase, "ctrlLossTmo", "-"), key: "ctrlLossTmo", reason: "not a decimal integer"},
	{name: "reconnectDelay 0", vc: withKeys(nvmeBase, "reconnectDelay", "0"), key: "reconnectDelay", reason: "want 1..3600"},
	{name: "reconnectDelay too big", vc: withKeys(nvmeBase, "reconnectDelay", "3601"), key: "reconnectDelay", reason: "want 1..3600"},
	{name: "fastIOFailTmo -2", vc: withKeys(nvmeBase, "fastIOFailTmo", "-2"), key: "fastIOFailTmo", reason: "want -1 or 0..31536000"},
	{name: "keepAliveTmo 0", vc: withKeys(nvmeBase, "keepAliveTmo", "0"), key: "keepAliveTmo", reason: "want 1..3600"},
	{name: "nrIOQueues too many", vc: withKeys(nvmeBase, "nrIOQueues", "1025"), key: "nrIOQueues", reason: "want 1..1024"},

	// nvme secrets
	{name: "dhchap key without prefix", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": "c2VjcmV0LWhvc3Qta2V5"}, key: "dhchapSecret", secret: true, reason: `must start with "DHHC-1:"`},
	{name: "dhchap key bad transform", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": dhchapKey("04", 32, 1)}, key: "dhchapSecret", secret: true, reason: "transform id 00, 01, 02 or 03"},
	{name: "dhchap key not base64", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": "DHHC-1:00:not*base64*at*all:"}, key: "dhchapSecret", secret: true, reason: "not valid base64"},
	{name: "dhchap key truncated", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": dhchapKey("00", 24, 1)}, key: "dhchapSecret", secret: true, reason: "probably truncated"},
	{name: "dhchap key bad checksum", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": badCRCKey()}, key: "dhchapSecret", secret: true, reason: "checksum does not match"},
	{name: "dhchap key trailing newline", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": hostKey + "\n"}, key: "dhchapSecret", secret: true, reason: "echo -n"},
	{name: "dhchap key with comma", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": "DHHC-1:00:abc,def"}, key: "dhchapSecret", secret: true, reason: "comma"},
	{name: "dhchap controller key alone", vc: nvmeBase, secrets: map[string]string{"dhchapCtrlSecret": ctrlKey}, key: "dhchapSecret", secret: true, reason: "required when dhchapCtrlSecret is set"},
	{name: "bad dhchap controller key", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": hostKey, "dhchapCtrlSecret": "DHHC-1:00:"}, key: "dhchapCtrlSecret", secret: true, reason: "probably truncated"},
	{name: "iscsi CHAP secret on nvme", vc: nvmeBase, secrets: map[string]string{"chapPassword": "secret-pass-1"}, key: "chapPassword", secret: true,
		reason: "unknown secret key for transport nvme-tcp (it belongs to transport iscsi); known secret keys: dhchapCtrlSecret, dhchapSecret"},
	{name: "unknown secret key", vc: nvmeBase, secrets: map[string]string{"password": "secret-pass-2"}, key: "password", secret: true, reason: "unknown secret key for transport nvme-tcp"},
	{name: "volume context key in secrets", vc: nvmeBase, secrets: map[string]string{"nqn": "nqn.2014-08.com.example:x"}, key: "nqn", secret: true, reason: "(it belongs in the volume context)"},
	{name: "empty secret", vc: nvmeBase, secrets: map[string]string{"dhchapSecret": ""}, key: "dhchapSecret", secret: true, reason: "value is empty"},

	// iqn
	{name: "iqn missing", vc: withKeys(iscsiBase, "iqn", drop), key: "iqn", reason: "required for transport iscsi"},
	{name: "iqn bad prefix", vc: withKeys(iscsiBase, "iqn", "IQN.2001-04.com.example:x"), key: "iqn", reason: `must start with "iqn.", "eui." or "naa."`},
	{name: "iqn bad date", vc: withKeys(iscsiBase, "iqn", "iqn.2001-4.com.example:x"), key: "iqn", reason: "date yyyy-mm"},
	{name: "iqn with space", vc: withKeys(iscsiBase, "iqn", "iqn.2001-04.com.example:my disk"), key: "iqn", reason: "whitespace"},
	{name: "iqn too long", vc: withKeys(iscsiBase, "iqn", "iqn.2001-04.com.example:"+strings.Repeat("d", 200)), key: "iqn", reason: "an iSCSI name is at most 223 bytes"},
	{name: "eui wrong length", vc: withKeys(iscsiBase, "iqn", "eui.02004567A425678"), key: "iqn", reason: "exactly 16 hex digits"},
	{name: "naa wrong length", vc: withKeys(iscsiBase, "iqn", "naa.52004567BA64678D0123"), key: "iqn", reason: "16 or 32 hex digits"},

	// portals
	{name: "portals missing", vc: withKeys(iscsiBase, "portals", drop), key: "portals", reason: "required for transport iscsi"},
	{name: "portal port 0", vc: withKeys(iscsiBase, "portals", "[fd00::1]:0"), key: "portals", reason: "out of range"},
	{name: "portal duplicate through default port", vc: withKeys(iscsiBase, "portals", "192.0.2.20,192.0.2.20:3260"), key: "portals", reason: "192.0.2.20:3260 is listed twice"},
	{name: "portal bare IPv6 that is not an address", vc: withKeys(iscsiBase, "portals", "fd00::zz"), key: "portals", reason: "is not an IPv6 address"},
	{name: "portal bare IPv6 with zone", vc: withKeys(iscsiBase, "portals", "fe80::1%eth0"), key: "portals", reason: "zones are not supported"},
	{name: "more portals than MaxEndpoints", vc: withKeys(iscsiBase, "portals", manyEndpoints(MaxEndpoints+1, 3260)), key: "portals", reason: "at most 64 are accepted"},
	{name: "portal empty item", vc: withKeys(iscsiBase, "portals", " , 192.0.2.20"), key: "portals", reason: "item 1 is empty"},

	// lun and timeout
	{name: "lun missing", vc: withKeys(iscsiBase, "lun", drop), key: "lun", reason: "required for transport iscsi"},
	{name: "lun too big", vc: withKeys(iscsiBase, "lun", "16384"), key: "lun", reason: "want 0..16383"},
	{name: "lun negative", vc: withKeys(iscsiBase, "lun", "-1"), key: "lun", reason: "out of range"},
	{name: "replacementTimeout too big", vc: withKeys(iscsiBase, "replacementTimeout", "86401"), key: "replacementTimeout", reason: "want 0..86400"},

	// iscsi secrets
	{name: "CHAP user without password", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a"}, key: "chapPassword", secret: true, reason: "required when chapUsername is set"},
	{name: "CHAP password without user", vc: iscsiBase, secrets: map[string]string{"chapPassword": "pass-word-a"}, key: "chapUsername", secret: true, reason: "required when chapPassword is set"},
	{name: "mutual CHAP user without password", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a", "chapPassword": "pass-word-a", "chapUsernameIn": "user-b"}, key: "chapPasswordIn", secret: true, reason: "required when chapUsernameIn is set"},
	{name: "mutual CHAP password without user", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a", "chapPassword": "pass-word-a", "chapPasswordIn": "pass-word-b"}, key: "chapUsernameIn", secret: true, reason: "required when chapPasswordIn is set"},
	{name: "mutual CHAP without one-way CHAP", vc: iscsiBase, secrets: map[string]string{"chapUsernameIn": "user-b", "chapPasswordIn": "pass-word-b"}, key: "chapUsername", secret: true, reason: "mutual CHAP needs the initiator credentials"},
	{name: "CHAP password with trailing newline", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a", "chapPassword": "pass-word-nl\n"}, key: "chapPassword", secret: true, reason: "echo -n"},
	{name: "CHAP password with tab", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a", "chapPassword": "pass\tword-tab"}, key: "chapPassword", secret: true, reason: "control character"},
	{name: "CHAP password too long", vc: iscsiBase, secrets: map[string]string{"chapUsername": "user-a", "chapPassword": strings.Repeat("p", 256)}, key: "chapPassword", secret: true, reason: "is 256 bytes long; at most 255"},
	{name: "DH-HMAC-CHAP secret on iscsi", vc: iscsiBase, secrets: map[string]string{"dhchapSecret": hostKey}, key: "dhchapSecret", secret: true, reason: "unknown secret key for transport iscsi (it belongs to transport nvme-tcp)"},
}

// hugeKey is a key of 1 MiB: an error names it by a short prefix only.
var hugeKey = "k" + strings.Repeat("x", 1<<20)

// manyEndpoints lists n distinct IPv4 endpoints on port.
func manyEndpoints(n int, port int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf("10.%d.%d.%d:%d", i>>16&0xff, i>>8&0xff, i&0xff, port)
	}
	return strings.Join(items, ",")
}

// maxErrorLen bounds every error text of Parse: keys and values are quoted
// by a short prefix only, whatever their length.
const maxErrorLen = 1024

func TestParse_Invalid(t *testing.T) {
	for _, tc := range invalidCases {
		t.Run(tc.name, func(t *testing.T) {
			c, s, err := Parse(tc.vc, tc.secrets)
			if err == nil {
				t.Fatalf("Parse succeeded with %+v, want an error for key %q", c, tc.key)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Key != tc.key || fe.Secret != tc.secret {
				t.Errorf("FieldError{Key: %q, Secret: %t}, want {Key: %q, Secret: %t}; error: %v", fe.Key, fe.Secret, tc.key, tc.secret, err)
			}
			if !strings.Contains(fe.Reason, tc.reason) {
				t.Errorf("reason %q does not contain %q", fe.Reason, tc.reason)
			}
			if c.NVMe != nil || c.ISCSI != nil || c.Transport != "" || s != (Secrets{}) {
				t.Errorf("Parse returned a partial result with its error: %+v, %v", c, s)
			}
			if n := len(err.Error()); n > maxErrorLen {
				t.Errorf("error text is %d bytes long, want at most %d: %.200s…", n, maxErrorLen, err)
			}
			for _, v := range secretValues(tc.vc, tc.secrets) {
				if strings.Contains(err.Error(), v) {
					t.Errorf("error text %q contains the secret value %q", err, v)
				}
			}
		})
	}
}

// secretValues lists every value that must never appear in an error: all
// secret values, and the values of secret keys misplaced in the context.
// Values shorter than 4 bytes are skipped, as they occur in any text.
func secretValues(vc, secrets map[string]string) []string {
	var out []string
	add := func(v string) {
		if len(strings.TrimSpace(v)) >= 4 {
			out = append(out, strings.TrimSpace(v))
		}
	}
	for _, v := range secrets {
		add(v)
	}
	for k, v := range vc {
		if d, ok := keyIndex[k]; ok && d.Secret {
			add(v)
		}
	}
	return out
}

func TestFieldError_Error(t *testing.T) {
	tests := []struct {
		err  FieldError
		want string
	}{
		{FieldError{Key: "nqn", Reason: "required"}, `volume context key "nqn": required`},
		{FieldError{Key: "chapPassword", Reason: "required", Secret: true}, `node-stage secret key "chapPassword": required`},
		{FieldError{Key: "nqn", Reason: "required", Publish: true}, `publish context key "nqn": required`},
		{FieldError{Key: strings.Repeat("k", 100), Reason: "unknown"}, `volume context key "` + strings.Repeat("k", 64) + `"...: unknown`},
	}
	for _, tc := range tests {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}
