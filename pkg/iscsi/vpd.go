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
// VPD page (0x83), choosing among the designators that identify the
// logical unit the way the kernel's scsi_vpd_lun_id chooses for the wwid
// attribute: the longest designator wins, NAA is preferred over an
// EUI-64 of the same length, T10 vendor IDs only when nothing else is
// there. The result has the wwid attribute's form: "naa.<hex>",
// "eui.<hex>", "t10.<vendor id>" or the SCSI name string itself.
// pathmend only compares identifiers read the same way, so an exotic page
// that the kernel would render differently still yields a stable value.
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

	best, bestType, bestSize := "", 0, 0
	for len(body) > 0 {
		if len(body) < 4 {
			return "", errors.New("truncated designator header")
		}
		size := int(body[3])
		if 4+size > len(body) {
			return "", fmt.Errorf("designator of %d bytes overruns the page", size)
		}
		d := body[4 : 4+size]
		assoc, typ := (body[1]>>4)&0x3, int(body[1]&0xf)
		body = body[4+size:]
		if assoc != 0 || size == 0 || size < bestSize {
			continue // not about the logical unit, or shorter than what we have
		}
		var id string
		switch typ {
		case desigT10:
			if bestType > desigT10 {
				continue
			}
			id = "t10." + escapeT10(d)
		case desigEUI64:
			if bestType == desigNAA && size == bestSize {
				continue
			}
			if size != 8 && size != 12 && size != 16 {
				continue
			}
			id = "eui." + hex.EncodeToString(d)
		case desigNAA:
			if size != 8 && size != 16 {
				continue
			}
			id = "naa." + hex.EncodeToString(d)
		case desigSCSIName:
			id = strings.TrimRight(string(d), "\x00")
			if id == "" {
				continue
			}
		default:
			continue
		}
		best, bestType, bestSize = id, typ, size
	}
	if best == "" {
		return "", errors.New("no logical-unit designator")
	}
	return best, nil
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
