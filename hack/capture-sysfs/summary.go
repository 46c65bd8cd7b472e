package main

import (
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

var (
	reCtrl   = regexp.MustCompile(`^nvme\d+$`)
	reHead   = regexp.MustCompile(`^nvme\d+n\d+$`)
	reTarget = regexp.MustCompile(`^target\d+:\d+:\d+$`)
	reLUN    = regexp.MustCompile(`^\d+:\d+:\d+:\d+$`)
)

// summarize prints the node's NVMe and iSCSI topology as read from the
// tree: subsystems, controllers (state, address, age), namespace heads and
// their legs (ana_state), controllers that contribute no leg, iSCSI
// sessions with their connection, portal and LUN → sdX → dm chains, and
// device-mapper maps. It reads only; a missing optional attribute prints
// as "-". now is the time ages are measured against.
func summarize(w io.Writer, fsys sysfs.FS, now time.Time) error {
	s := &summary{fs: fsys, now: now}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	s.w = tw
	s.nvme()
	s.iscsi()
	s.dm()
	return tw.Flush()
}

type summary struct {
	fs  sysfs.FS
	w   io.Writer
	now time.Time
}

func (s *summary) attr(rel string) string {
	v, ok, err := s.fs.ReadOptionalAttr(rel)
	switch {
	case err != nil:
		return "<" + shortErr(err) + ">"
	case !ok:
		return "-"
	case v == "":
		return `""`
	}
	return v
}

func shortErr(err error) string {
	if n := errName(unwrapAll(err)); n != "EUNKNOWN" {
		return n
	}
	return err.Error()
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

func (s *summary) list(rel string, re *regexp.Regexp) []string {
	names, err := s.fs.ReadDir(rel)
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range names {
		if re == nil || re.MatchString(n) {
			out = append(out, n)
		}
	}
	return out
}

func (s *summary) age(rel string) string {
	fi, err := s.fs.Stat(rel)
	if err != nil {
		return "-"
	}
	return s.now.Sub(fi.ModTime()).Round(time.Second).String()
}

func sizeOf(sectors string) string {
	n, err := strconv.ParseInt(sectors, 10, 64)
	if err != nil {
		return sectors
	}
	return fmt.Sprintf("%d MiB", n*512>>20)
}

func (s *summary) nvme() {
	fmt.Fprintf(s.w, "NVMe (native multipath: %s)\n", s.attr("module/nvme_core/parameters/multipath"))
	subsystems := s.list("class/nvme-subsystem", nil)
	if len(subsystems) == 0 {
		fmt.Fprintln(s.w, "  no NVMe subsystems")
	}
	legOf := map[string]bool{} // controllers seen contributing a leg
	for _, sub := range subsystems {
		base := "class/nvme-subsystem/" + sub
		fmt.Fprintf(s.w, "  subsystem %s\t%s\tiopolicy=%s\n", sub, s.attr(base+"/subsysnqn"), s.attr(base+"/iopolicy"))
		ctrls := s.list(base, reCtrl)
		for _, c := range ctrls {
			cb := "class/nvme/" + c
			fmt.Fprintf(s.w, "    controller %s\t%s\tcntlid=%s\t%s %s\tage %s\n", c, s.attr(cb+"/state"),
				s.attr(cb+"/cntlid"), s.attr(cb+"/transport"), s.attr(cb+"/address"), s.age(cb))
		}
		heads := s.list(base, reHead)
		if len(heads) == 0 {
			fmt.Fprintln(s.w, "    no namespaces")
		}
		for _, h := range heads {
			hb := base + "/" + h
			fmt.Fprintf(s.w, "    namespace %s\tnsid=%s\t%s\tholders=%s\n", h, s.attr(hb+"/nsid"),
				sizeOf(s.attr(hb+"/size")), strings.Join(s.list(hb+"/holders", nil), ","))
			// A head nvmeSnH has one hidden leg nvmeScCnH below each
			// controller C that reaches the namespace (6.1 has no
			// multipath/ directory under the head).
			sn, hn, _ := strings.Cut(strings.TrimPrefix(h, "nvme"), "n")
			legs := 0
			for _, c := range ctrls {
				l := "nvme" + sn + "c" + strings.TrimPrefix(c, "nvme") + "n" + hn
				lb := "class/nvme/" + c + "/" + l
				if _, err := s.fs.Stat(lb); err != nil {
					continue
				}
				legs++
				legOf[c] = true
				fmt.Fprintf(s.w, "      leg %s\tvia %s\tana_state=%s\tana_grpid=%s\n", l, c,
					s.attr(lb+"/ana_state"), s.attr(lb+"/ana_grpid"))
			}
			if legs == 0 {
				fmt.Fprintln(s.w, "      no legs")
			}
		}
		var idle []string
		for _, c := range ctrls {
			if !legOf[c] && len(heads) > 0 {
				idle = append(idle, c)
			}
		}
		if len(idle) > 0 {
			fmt.Fprintf(s.w, "    controllers contributing no leg: %s\n", strings.Join(idle, ", "))
		}
	}
}

func (s *summary) iscsi() {
	fmt.Fprintln(s.w, "iSCSI")
	sessions := s.list("class/iscsi_session", regexp.MustCompile(`^session\d+$`))
	if len(sessions) == 0 {
		fmt.Fprintln(s.w, "  no iSCSI sessions")
	}
	for _, sess := range sessions {
		sb := "class/iscsi_session/" + sess
		fmt.Fprintf(s.w, "  %s\t%s\t%s\ttpgt=%s\trecovery_tmo=%s\n", sess, s.attr(sb+"/state"),
			s.attr(sb+"/targetname"), s.attr(sb+"/tpgt"), s.attr(sb+"/recovery_tmo"))
		n := strings.TrimPrefix(sess, "session")
		for _, conn := range s.list("class/iscsi_connection", regexp.MustCompile(`^connection`+n+`:\d+$`)) {
			cb := "class/iscsi_connection/" + conn
			fmt.Fprintf(s.w, "    %s\t%s\tportal %s:%s\taddress %s:%s\n", conn, s.attr(cb+"/state"),
				s.attr(cb+"/persistent_address"), s.attr(cb+"/persistent_port"),
				s.attr(cb+"/address"), s.attr(cb+"/port"))
		}
		dev := sb + "/device"
		for _, t := range s.list(dev, reTarget) {
			for _, lun := range s.list(dev+"/"+t, reLUN) {
				lb := dev + "/" + t + "/" + lun
				disks := s.list(lb+"/block", nil)
				chain := "-"
				if len(disks) > 0 {
					d := disks[0]
					chain = d
					if h := s.list(lb+"/block/"+d+"/holders", nil); len(h) > 0 {
						chain += " -> " + strings.Join(h, ",")
					}
				}
				fmt.Fprintf(s.w, "    LUN %s\t%s\tstate=%s\n", lun, chain, s.attr(lb+"/state"))
			}
		}
	}
}

func (s *summary) dm() {
	maps := s.list("block", regexp.MustCompile(`^dm-\d+$`))
	if len(maps) == 0 {
		return
	}
	fmt.Fprintln(s.w, "device-mapper")
	for _, m := range maps {
		b := "block/" + m
		fmt.Fprintf(s.w, "  %s\tname=%s\tuuid=%s\tslaves=%s\n", m, s.attr(b+"/dm/name"), s.attr(b+"/dm/uuid"),
			strings.Join(s.list(b+"/slaves", nil), ","))
	}
}
