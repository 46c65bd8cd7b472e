package driver

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// maxHealthMessageBytes is the longest message Kubernetes keeps in a
// volume or storage health condition: kubelet copies the message of each
// NodeGetVolumeHealth and NodeGetStorageHealth entry verbatim into the
// pod's status.volumeHealth and into CSINode's status.storageHealth.
// CSINode validation refuses a longer storage health message, and with
// it kubelet's whole update, hiding every condition of the node; the pod
// API declares the same 1024-byte bound for a volume health message.
const maxHealthMessageBytes = 1024

// cutMark ends a message that was cut short.
const cutMark = " …"

// boundMessage returns s cut to at most limit bytes at a rune boundary,
// marked with cutMark when cut.
func boundMessage(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	cut := max(limit-len(cutMark), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + cutMark
}

// joinBounded joins msgs with "; " into at most maxHealthMessageBytes:
// whole messages while they fit, then "and N more" for the rest (the
// messages are volumes' or node conditions of one status and reason). A
// first message too long on its own is cut.
func joinBounded(msgs []string) string {
	const sep = "; "
	if full := strings.Join(msgs, sep); len(full) <= maxHealthMessageBytes {
		return full
	}
	more := func(n int) string { return fmt.Sprintf("%sand %d more", sep, n) }
	var b strings.Builder
	n := 0
	for i, m := range msgs {
		need := len(m)
		if i > 0 {
			need += len(sep)
		}
		// Room must stay for the count of what follows, unless nothing does.
		reserve := 0
		if i < len(msgs)-1 {
			reserve = len(more(len(msgs) - i - 1))
		}
		if b.Len()+need+reserve > maxHealthMessageBytes {
			break
		}
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(m)
		n++
	}
	if n == 0 {
		b.WriteString(boundMessage(msgs[0], maxHealthMessageBytes-len(more(len(msgs)-1))))
		n = 1
	}
	if n < len(msgs) {
		b.WriteString(more(len(msgs) - n))
	}
	return b.String()
}
