package main

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/pathmend/pathmend/pkg/sysfs/sysfstest"
)

// identity is a host identity attribute and how its stable stand-in is
// spelled. Target NQNs and IQNs are kept: they name the scenario's targets,
// not the host.
type identity struct {
	attr string
	fake func(n int) string
}

var identities = []identity{
	{attr: "hostnqn", fake: func(n int) string {
		return fmt.Sprintf("nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-%012d", n)
	}},
	{attr: "hostid", fake: func(n int) string {
		return fmt.Sprintf("00000000-0000-4000-8000-%012d", n)
	}},
	{attr: "initiatorname", fake: func(n int) string {
		return fmt.Sprintf("iqn.2004-10.com.example:pathmend-node-%d", n)
	}},
}

// secretAttrs are attributes whose value is a credential: iSCSI CHAP
// passwords (world-readable in sysfs!) and NVMe DH-HMAC-CHAP keys. A capture
// keeps that they are set, never what they are.
var secretAttrs = map[string]bool{
	"password": true, "password_in": true,
	"dhchap_secret": true, "dhchap_ctrl_secret": true,
}

// redactSecrets replaces the value of every credential attribute that is
// set with "<redacted>"; unset values ("(null)", "none", empty) are kept.
// It returns how many values it replaced.
func redactSecrets(f *sysfstest.Fixture) int {
	n := 0
	for i, e := range f.Entries {
		if e.Kind != sysfstest.KindFile || !secretAttrs[path.Base(e.Path)] {
			continue
		}
		switch strings.TrimRight(e.Value, "\n \x00") {
		case "", "(null)", "none":
			continue
		}
		f.Entries[i].Value = "<redacted>\n"
		n++
	}
	return n
}

// sanitize replaces every host identity (the values of hostnqn, hostid
// and initiatorname attributes) with a stable fake, everywhere it occurs
// in an attribute value, so the same identity maps to the same fake across
// the whole capture. It returns the attribute names it replaced.
func sanitize(f *sysfstest.Fixture) []string {
	type repl struct{ real, fake string }
	var repls []repl
	seen := map[string]bool{}
	var kinds []string
	for _, id := range identities {
		var reals []string
		for _, e := range f.Entries {
			if e.Kind != sysfstest.KindFile || path.Base(e.Path) != id.attr {
				continue
			}
			v := strings.TrimRight(e.Value, "\n \x00")
			if v == "" || v == "(null)" || seen[v] {
				continue
			}
			seen[v] = true
			reals = append(reals, v)
		}
		sort.Strings(reals)
		for i, v := range reals {
			repls = append(repls, repl{real: v, fake: id.fake(i + 1)})
		}
		if len(reals) > 0 {
			kinds = append(kinds, id.attr)
		}
	}
	// Longest first: a hostnqn usually embeds the hostid.
	sort.SliceStable(repls, func(i, j int) bool { return len(repls[i].real) > len(repls[j].real) })
	if len(repls) == 0 {
		return nil
	}
	pairs := make([]string, 0, 2*len(repls))
	for _, r := range repls {
		pairs = append(pairs, r.real, r.fake)
	}
	r := strings.NewReplacer(pairs...)
	for i, e := range f.Entries {
		if e.Kind == sysfstest.KindFile {
			f.Entries[i].Value = r.Replace(e.Value)
		}
	}
	return kinds
}
