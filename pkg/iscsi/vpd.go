package iscsi

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// maxVPDPage bounds a VPD page read: the page length field is 16 bits.
const maxVPDPage = 4 + 0xffff

// Designator types of VPD page 0x83 (SPC-4, table 459) the kernel derives
// a device's wwid from.
const (
	desigT10      = 0x1
	desigEUI64    = 0x2
	desigNAA      = 0x3
	desigSCSIName = 0x8
)

// ParseVPD83 derives a device identifier from a raw Device Identification
// VPD page (0x83) the way Linux 6.1's scsi_vpd_lun_id derives the wwid
// attribute: among the designators of the logical unit, the one of
// highest priority wins (SCSI name string, NAA registered extended,
// EUI-64 16 and 12 bytes, NAA registered, NAA extended, EUI-64 8 bytes,
// T10 vendor ID and NAA locally assigned), a later one of equal priority
// replacing an earlier one. The result has the wwid attribute's form:
// "naa.<hex>", "eui.<hex>", "t10.<vendor id>" or the SCSI name string.
// pathmend only compares identifiers read the same way, so a page the
// kernel would render differently still yields a stable value.
func ParseVPD83(page []byte) (string, error) {
	if len(page) < 4 {
		return "", errors.New("VPD page shorter than its 4-byte header")
	}
	if page[1] != 0x83 {
		return "", fmt.Errorf("page code %#x, want 0x83", page[1])
	}
	n := int(page[2])<<8 | int(page[3])
	if 4+n > len(page) {
		return "", fmt.Errorf("page length %d exceeds the %d bytes read", n, len(page)-4)
	}
	body := page[4 : 4+n]

	best, bestPrio, bestSize := "", 0, 0
	for len(body) > 0 {
		if len(body) < 4 {
			return "", errors.New("truncated designator header")
		}
		size := int(body[3])
		if 4+size > len(body) {
			return "", fmt.Errorf("designator of %d bytes overruns the page", size)
		}
		hdr, d := body[:4], body[4:4+size]
		body = body[4+size:]
		prio := designatorPrio(hdr, d)
		if prio == 0 || bestPrio > prio {
			continue
		}
		var id string
		switch hdr[1] & 0xf {
		case desigT10:
			if bestSize > size {
				continue
			}
			id = "t10." + escapeT10(d)
		case desigEUI64:
			id = "eui." + hex.EncodeToString(d)
		case desigNAA:
			if size != 8 && size != 16 {
				continue
			}
			id = "naa." + hex.EncodeToString(d)
		case desigSCSIName:
			if bestSize > size {
				continue
			}
			id = strings.TrimRight(string(d), "\x00")
		}
		if id == "" {
			continue
		}
		best, bestPrio, bestSize = id, prio, size
	}
	if best == "" {
		return "", errors.New("no logical-unit designator")
	}
	return best, nil
}

// designatorPrio is the kernel's designator_prio: 0 for a designator that
// is not about the logical unit or that it does not use.
func designatorPrio(hdr, d []byte) int {
	if hdr[1]&0x30 != 0 || len(d) == 0 {
		return 0
	}
	switch hdr[1] & 0xf {
	case desigSCSIName:
		return 9
	case desigNAA:
		switch d[0] >> 4 {
		case 6:
			return 8 // registered extended
		case 5:
			return 5 // registered
		case 4:
			return 4 // extended
		case 3:
			return 1 // locally assigned
		}
	case desigEUI64:
		switch len(d) {
		case 16:
			return 7
		case 12:
			return 6
		case 8:
			return 3
		}
	case desigT10:
		return 1
	}
	return 0
}

// escapeT10 renders a T10 vendor ID printable, octal-escaping other bytes
// as the kernel's %pE does.
func escapeT10(d []byte) string {
	var b strings.Builder
	for _, c := range d {
		if c >= 0x20 && c < 0x7f && c != '\\' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "\\%03o", c)
	}
	return b.String()
}
