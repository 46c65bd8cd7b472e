package volume

import (
	"fmt"
	"strings"
)

// defaultISCSIPort is the IANA-assigned iSCSI port, used for portals given
// without one.
const defaultISCSIPort = 3260

// maxCHAPLen bounds CHAP user names and secrets. RFC 3720 leaves their
// length open; 255 bytes is the most open-iscsi stores (AUTH_STR_MAX_LEN is
// 256 including the terminator).
const maxCHAPLen = 255

// parseISCSI reads the iscsi keys of a volume context whose key set
// checkContextKeys has already accepted, in documentation order.
func parseISCSI(vc map[string]string) (*ISCSI, error) {
	s := &ISCSI{}

	v, ok := vc[keyIQN]
	if !ok {
		return nil, fieldErr(keyIQN, "required for transport iscsi")
	}
	if r := checkIQN(v); r != "" {
		return nil, fieldErr(keyIQN, "%s %s", quoteValue(v), r)
	}
	s.IQN = v

	v, ok = vc[keyPortals]
	if !ok {
		return nil, fieldErr(keyPortals, "required for transport iscsi, e.g. 192.0.2.10:3260,192.0.2.11")
	}
	var r string
	if s.Portals, r = parseEndpointList(v, defaultISCSIPort); r != "" {
		return nil, fieldErr(keyPortals, "%s", r)
	}

	v, ok = vc[keyLUN]
	if !ok {
		return nil, fieldErr(keyLUN, "required for transport iscsi")
	}
	lun, r := parseInt(v, rangeLUN)
	if r != "" {
		return nil, fieldErr(keyLUN, "%s", r)
	}
	s.LUN = int(lun)

	var err error
	if s.ReplacementTimeout, err = optionalInt(vc, keyReplacementTimeout, rangeReplacementTimeout); err != nil {
		return nil, err
	}
	return s, nil
}

// parseISCSISecrets reads the CHAP credentials. Each user name needs its
// secret and vice versa, and mutual CHAP (the In pair, with which the target
// authenticates itself) builds on one-way CHAP. An error names the missing
// key.
func parseISCSISecrets(secrets map[string]string) (Secrets, error) {
	var s Secrets
	for _, f := range []struct {
		key string
		dst *string
	}{
		{keyCHAPUsername, &s.CHAPUsername},
		{keyCHAPPassword, &s.CHAPPassword},
		{keyCHAPUsernameIn, &s.CHAPUsernameIn},
		{keyCHAPPasswordIn, &s.CHAPPasswordIn},
	} {
		v, ok := secrets[f.key]
		if !ok {
			continue
		}
		if r := checkCHAPValue(v); r != "" {
			return Secrets{}, secretErr(f.key, "%s", r)
		}
		*f.dst = v
	}

	if err := requirePair(s.CHAPUsername, keyCHAPUsername, s.CHAPPassword, keyCHAPPassword); err != nil {
		return Secrets{}, err
	}
	if err := requirePair(s.CHAPUsernameIn, keyCHAPUsernameIn, s.CHAPPasswordIn, keyCHAPPasswordIn); err != nil {
		return Secrets{}, err
	}
	if s.CHAPUsernameIn != "" && s.CHAPUsername == "" {
		return Secrets{}, secretErr(keyCHAPUsername,
			"required when chapUsernameIn is set; mutual CHAP needs the initiator credentials (chapUsername, chapPassword) too")
	}
	return s, nil
}

// requirePair reports the missing half of a user name / secret pair.
func requirePair(user, userKey, pass, passKey string) error {
	switch {
	case user != "" && pass == "":
		return secretErr(passKey, "required when %s is set", userKey)
	case user == "" && pass != "":
		return secretErr(userKey, "required when %s is set", passKey)
	}
	return nil
}

// checkCHAPValue accepts 1..255 bytes without ASCII control characters: the
// values are stored line by line in iscsiadm's node records, where a line
// break would end the value and other control characters are certainly a
// mistake; a trailing newline in particular is the classic sign of a secret
// created with echo instead of echo -n. The reason never includes the value.
func checkCHAPValue(v string) string {
	if len(v) > maxCHAPLen {
		return fmt.Sprintf("is %d bytes long; at most %d are accepted", len(v), maxCHAPLen)
	}
	if strings.ContainsAny(v, "\r\n") {
		return "contains a line break (a trailing newline often comes from creating the secret with echo instead of echo -n)"
	}
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] == 0x7f {
			return "contains an ASCII control character"
		}
	}
	return ""
}
