package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// Kind says what a secret value is, for messages that must not show it.
type Kind string

// The kinds of secret pathmend sees.
const (
	CHAPUser           Kind = "CHAP user name"
	CHAPPassword       Kind = "CHAP password"
	MutualCHAPUser     Kind = "mutual CHAP user name"
	MutualCHAPPassword Kind = "mutual CHAP password"
	DHCHAPKey          Kind = "DH-HMAC-CHAP key"
	// NodeRecordSetting is a CHAP setting read back from an iSCSI node
	// record.
	NodeRecordSetting Kind = "CHAP setting of an iSCSI node record"
	// RequestSecret is any other value of a request's secrets, or of a
	// credential key of its volume or publish context.
	RequestSecret Kind = "node-stage secret"
)

// proof reports whether a value of kind k proves an identity: a password
// or a key. A file that would hold one is refused (Find). A CHAP user
// name names someone and travels in the clear in every iSCSI login (an
// IQN can be one), and a value under a key no contract knows may be
// anything (a portal put in a Secret by mistake): texts are scrubbed of
// them as of every secret, files are not refused for holding one.
func (k Kind) proof() bool {
	switch k {
	case CHAPPassword, MutualCHAPPassword, DHCHAPKey, NodeRecordSetting:
		return true
	}
	return false
}

// Replacement is what every occurrence of a secret becomes.
const Replacement = "***"

// MaxValues bounds the values a Set keeps.
const MaxValues = 4096

// minSubstring is the shortest value replaced inside other text; shorter
// values are replaced only as whole words.
const minSubstring = 4

// minEncoded is the shortest encoded form searched for: shorter ones
// would match ordinary text.
const minEncoded = 6

// form is one spelling of a value.
type form struct {
	text  []byte
	kind  Kind
	value string // the value it spells
	word  bool   // replaced only as a whole word
}

// Set is the secret values a process has seen. The zero value is not
// usable; create one with New. A Set is safe for concurrent use.
type Set struct {
	known atomic.Bool
	full  atomic.Bool // the "forgot a value" line was logged

	mu     sync.RWMutex
	values map[string]Kind
	order  []string // insertion order, for forgetting the oldest
	// triples has a bit for a hash of the first three bytes of every form
	// of three bytes or more: a position of a text whose triple has none
	// starts no such form. short marks that forms of one or two bytes
	// exist (whole-word values of one or two bytes, rare), found by the
	// trie at every position.
	triples *[tripleBits / 64]uint64
	short   bool
	// root is a trie of every form, byte by byte.
	root trieNode
}

// tripleBits is the size of the triples filter: 128 KiB.
const tripleBits = 1 << 20

// tripleHash maps three bytes to a bit of the triples filter.
func tripleHash(a, b, c byte) uint32 {
	return (uint32(a)<<16 | uint32(b)<<8 | uint32(c)) * 0x9E3779B1 >> (32 - 20)
}

// trieNode is a node of the forms' trie: its children by byte (keys
// sorted) and the form that ends here, if any.
type trieNode struct {
	keys []byte
	kids []*trieNode
	end  *form
}

func (n *trieNode) child(c byte) *trieNode {
	keys := n.keys
	// Nodes past the first levels have one or two children.
	if len(keys) <= 8 {
		for i, k := range keys {
			if k == c {
				return n.kids[i]
			}
		}
		return nil
	}
	lo, hi := 0, len(keys)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if keys[m] < c {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(keys) && keys[lo] == c {
		return n.kids[lo]
	}
	return nil
}

func (n *trieNode) insert(f *form) {
	cur := n
	for _, c := range f.text {
		next := cur.child(c)
		if next == nil {
			next = &trieNode{}
			i := 0
			for i < len(cur.keys) && cur.keys[i] < c {
				i++
			}
			cur.keys = append(cur.keys[:i], append([]byte{c}, cur.keys[i:]...)...)
			cur.kids = append(cur.kids[:i], append([]*trieNode{next}, cur.kids[i:]...)...)
		}
		cur = next
	}
	if cur.end == nil || cur.end.value == f.value || f.kind.proof() {
		cur.end = f
	}
}

// remove takes the forms of value out of the trie below n; it reports
// whether n is left empty.
func (n *trieNode) remove(value string) bool {
	if n.end != nil && n.end.value == value {
		n.end = nil
	}
	keys, kids := n.keys[:0], n.kids[:0]
	for i, k := range n.keys {
		if n.kids[i].remove(value) {
			continue
		}
		keys, kids = append(keys, k), append(kids, n.kids[i])
	}
	n.keys, n.kids = keys, kids
	return n.end == nil && len(n.keys) == 0
}

// longest returns the length of the longest form p starts with (whole
// words only for a form so marked), and the form; 0 when none.
func (n *trieNode) longest(p []byte, at int) (int, *form) {
	best, bf := 0, (*form)(nil)
	cur := n
	for j := at; j < len(p); j++ {
		cur = cur.child(p[j])
		if cur == nil {
			break
		}
		if f := cur.end; f != nil && (!f.word || wordAt(p, at, j-at+1)) {
			best, bf = j-at+1, f
		}
	}
	return best, bf
}

// New returns an empty Set.
func New() *Set {
	return &Set{values: map[string]Kind{}, triples: new([tripleBits / 64]uint64)}
}

// Default is the process's Set.
var Default = New()

// Add makes s replace value, in every form, in every text from now on.
// Empty values are ignored.
func (s *Set) Add(kind Kind, value string) {
	if value == "" {
		return
	}
	s.mu.RLock()
	_, ok := s.values[value]
	s.mu.RUnlock()
	if ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.values[value]; ok {
		return
	}
	if len(s.order) >= MaxValues {
		s.forgetLocked(s.order[0])
		s.order = s.order[1:]
		if !s.full.Swap(true) {
			klog.InfoS("The secret scrubber holds its maximum of values: forgetting the oldest", "max", MaxValues)
		}
	}
	s.values[value] = kind
	s.order = append(s.order, value)
	for _, f := range forms(kind, value) {
		s.indexLocked(f)
	}
	s.known.Store(true)
}

// Values returns how many values s knows.
func (s *Set) Values() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.values)
}

func (s *Set) indexLocked(f *form) {
	if len(f.text) < 3 {
		s.short = true
	} else {
		h := tripleHash(f.text[0], f.text[1], f.text[2])
		s.triples[h>>6] |= 1 << (h & 63)
	}
	s.root.insert(f)
}

// forgetLocked removes value's forms. Their filter bits stay (a bit set
// for nothing costs one trie lookup).
func (s *Set) forgetLocked(value string) {
	delete(s.values, value)
	s.root.remove(value)
}

// forms lists the spellings of value a text may carry.
func forms(kind Kind, value string) []*form {
	seen := map[string]bool{}
	var out []*form
	add := func(t string, encoded bool) {
		if t == "" || seen[t] {
			return
		}
		if encoded && len(t) < minEncoded {
			return
		}
		seen[t] = true
		out = append(out, &form{text: []byte(t), kind: kind, value: value, word: !encoded && len(value) < minSubstring})
	}
	for _, t := range escapes(value) {
		add(t, false)
	}
	if len(value) < minSubstring {
		return out
	}
	b := []byte(value)
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding, base64.RawURLEncoding} {
		add(enc.EncodeToString(b), true)
	}
	// Inside a longer base64 text the value starts at one of three bit
	// offsets; the characters made of its bits alone are the same
	// whatever surrounds it.
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		for k := range 3 {
			e := enc.EncodeToString(append(make([]byte, k), b...))
			from, to := (8*k+5)/6, 8*(k+len(b))/6
			if to > from {
				add(e[from:to], true)
			}
		}
	}
	h := hex.EncodeToString(b)
	add(h, true)
	add(strings.ToUpper(h), true)
	for _, t := range []string{url.QueryEscape(value), url.PathEscape(value)} {
		add(t, false)
		add(lowerEscapes(t), false)
	}
	return out
}

// escapes returns value as is and as string escapes put it: JSON (with
// and without HTML escaping), Go's strconv.Quote, and each of those
// applied twice.
func escapes(value string) []string {
	one := []func(string) string{jsonInner(true), jsonInner(false), quoteInner}
	out := []string{value}
	for _, f := range one {
		a := f(value)
		out = append(out, a)
		for _, g := range one {
			out = append(out, g(a))
		}
	}
	return out
}

func jsonInner(html bool) func(string) string {
	return func(s string) string {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(html)
		_ = enc.Encode(s)
		t := strings.TrimSuffix(b.String(), "\n")
		return t[1 : len(t)-1]
	}
}

func quoteInner(s string) string {
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// lowerEscapes lower-cases the hex digits of every %XX escape.
func lowerEscapes(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			b[i+1], b[i+2] = lowerHex(b[i+1]), lowerHex(b[i+2])
			i += 2
		}
	}
	return string(b)
}

func lowerHex(c byte) byte {
	if c >= 'A' && c <= 'F' {
		return c + 'a' - 'A'
	}
	return c
}

// String returns text with every known secret, and every secret of a
// learnt shape, replaced. A text with none is returned as is, without an
// allocation.
func (s *Set) String(text string) string {
	if !s.known.Load() && !shaped(text) {
		return text
	}
	b, changed := s.scrub([]byte(text))
	if !changed {
		return text
	}
	return string(b)
}

// Bytes is String for a byte slice; it never changes p and returns p
// itself when nothing was replaced.
func (s *Set) Bytes(p []byte) []byte {
	if !s.known.Load() && !shapedBytes(p) {
		return p
	}
	b, _ := s.scrub(p)
	return b
}

// scrub learns the shaped secrets of p, then replaces every form.
func (s *Set) scrub(p []byte) ([]byte, bool) {
	learnt := s.learn(p)
	if !s.known.Load() {
		return p, false
	}
	out, changed := s.replace(p)
	return out, changed || learnt
}

// replace replaces every known form in p.
func (s *Set) replace(p []byte) ([]byte, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []byte
	last := 0
	triples, short := s.triples, s.short
	for i := 0; i < len(p); i++ {
		if !short {
			if i+2 >= len(p) {
				break
			}
			h := tripleHash(p[i], p[i+1], p[i+2])
			if triples[h>>6]&(1<<(h&63)) == 0 {
				continue
			}
		}
		best, _ := s.root.longest(p, i)
		if best == 0 {
			continue
		}
		if out == nil {
			out = make([]byte, 0, len(p))
		}
		out = append(out, p[last:i]...)
		out = append(out, Replacement...)
		i += best - 1
		last = i + 1
	}
	if out == nil {
		return p, false
	}
	return append(out, p[last:]...), true
}

// wordAt reports whether p[i:i+n] stands as a whole word: the bytes
// around it are not letters or digits.
func wordAt(p []byte, i, n int) bool {
	return (i == 0 || !alnum(p[i-1])) && (i+n >= len(p) || !alnum(p[i+n]))
}

func alnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// Find reports whether p holds a known secret that proves an identity (a
// password or a key, not a user name; see Kind), and of which kind: a
// file that does is not written.
func (s *Set) Find(p []byte) (Kind, bool) {
	s.learn(p)
	if !s.known.Load() {
		return "", false
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	for i := 0; i < len(p); i++ {
		if !s.short {
			if i+2 >= len(p) {
				break
			}
			h := tripleHash(p[i], p[i+1], p[i+2])
			if s.triples[h>>6]&(1<<(h&63)) == 0 {
				continue
			}
		}
		// Any form that starts here, not only the longest.
		cur := &s.root
		for j := i; j < len(p); j++ {
			if cur = cur.child(p[j]); cur == nil {
				break
			}
			if f := cur.end; f != nil && f.kind.proof() && (!f.word || wordAt(p, i, j-i+1)) {
				return f.kind, true
			}
		}
	}
	return "", false
}

// Writer returns a writer that scrubs every Write before passing it to w.
// Each Write must hold whole lines (a logger's one line per call): a
// secret split across two Writes is not recognised. It reports len(p)
// written when w took the scrubbed text.
func (s *Set) Writer(w io.Writer) io.Writer { return &writer{s: s, w: w} }

type writer struct {
	s *Set
	w io.Writer
}

func (w *writer) Write(p []byte) (int, error) {
	if _, err := w.w.Write(w.s.Bytes(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Add adds value to Default.
func Add(kind Kind, value string) { Default.Add(kind, value) }

// String scrubs text with Default.
func String(text string) string { return Default.String(text) }
