// Command uevents records which uevents the lab's kernel sends while the
// fault catalogue runs, and keeps docs/uevents.md true to the recordings.
//
//	uevents record -o EVENTS           (guest) every kernel uevent, one JSON line each, until SIGTERM
//	uevents mark -o MARKS -fault NAME -phase begin|end [-do TEXT] [-until TEXT]
//	                                   (guest) a fault's start or end, one JSON line
//	uevents split -events EVENTS -marks MARKS -kernel TEXT -o DIR
//	                                   (host) one recording per fault: DIR/<fault>.json
//	uevents render [-dir testdata/uevents] [-doc docs/uevents.md]
//	                                   (host) the table of docs/uevents.md from the recordings
//
// `make lab-uevents` runs the catalogue in a fresh guest
// (hack/lab/guest/uevents.sh), splits what it recorded into
// testdata/uevents and renders the table. The recorder listens on the
// kernel's group of the NETLINK_KOBJECT_UEVENT socket through pathmend's
// own package (pkg/uevent) and keeps every event, relevant or not;
// TestDocTableIsRendered fails when the table and the recordings
// disagree.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	args := os.Args[2:]
	switch os.Args[1] {
	case "record":
		err = cmdRecord(args)
	case "mark":
		err = cmdMark(args)
	case "split":
		err = cmdSplit(args)
	case "render":
		err = cmdRender(args)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "uevents:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: uevents record|mark|split|render [flags] (see the package doc)")
	os.Exit(2)
}

func flags(name string) *flag.FlagSet { return flag.NewFlagSet("uevents "+name, flag.ExitOnError) }
