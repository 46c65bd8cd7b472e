package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/pathmend/pathmend/pkg/scrub"
)

// command is one subcommand of pathmend. The table in commands is the
// whole command line: the top-level usage lists it, and `pathmend NAME
// --help` or `pathmend help NAME` prints an entry's help. A new
// subcommand is one more entry.
type command struct {
	name    string
	summary string // one line in the top-level usage
	// synopsis lines, each printed after "pathmend ".
	synopsis []string
	// description is printed below the synopsis as it is (paragraphs
	// separated by blank lines, wrapped by hand).
	description string
	// groups order the flags in the help; a flag in none is listed last
	// under "Other flags". Hidden flags (hide) are never listed.
	groups    []flagGroup
	exitCodes []exitCode
	run       func(c *command, args []string, stdout, stderr io.Writer) int
}

type flagGroup struct {
	title string
	names []string
}

type exitCode struct {
	code    int
	meaning string
}

// commands is the subcommand table, in the order the usage lists it.
func commands() []*command {
	return []*command{serveCommand(), companionCommand(), diagnoseCommand(), versionCommand()}
}

const topUsage = `pathmend is a Kubernetes CSI node plugin for NVMe-oF/TCP and iSCSI block
volumes that keeps every path to every volume healthy.

Usage:
  pathmend COMMAND [flags]

Commands:
%s  help       Print this help, or a command's: pathmend help COMMAND

Run "pathmend COMMAND --help" for a command's synopsis, flags and exit status.
`

// usage prints the top-level help: what pathmend is and its commands.
func usage(w io.Writer) {
	var list strings.Builder
	for _, c := range commands() {
		fmt.Fprintf(&list, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, topUsage, list.String())
}

// run dispatches a subcommand and returns the process exit status.
// Nothing runs unless a command is named: with no argument it prints the
// help and exits 2, and flags with no command before them are refused
// the same way, so `pathmend` typed on a workstation never starts serving
// (which would create the host NQN, the state directory and the socket).
// Every shipped manifest names its command (serve, companion).
func run(args []string, stdout, stderr io.Writer) int {
	// Nothing leaves the process with a secret it has seen in it: its
	// output (diagnose's reports) and its log lines, whatever wrote them.
	stdout, stderr = scrub.Default.Writer(stdout), scrub.Default.Writer(stderr)
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return 0
	case "help":
		if len(args) == 1 {
			usage(stdout)
			return 0
		}
		c := lookup(args[1])
		if c == nil {
			fmt.Fprintf(stderr, "pathmend help: unknown command %q\n\n", args[1])
			usage(stderr)
			return 2
		}
		return c.run(c, []string{"--help"}, stdout, stderr)
	}
	if strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(stderr, "pathmend: no command before %s (serve's flags follow the command: pathmend serve %s)\n\n", args[0], strings.Join(args, " "))
		usage(stderr)
		return 2
	}
	c := lookup(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "pathmend: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	return c.run(c, args[1:], stdout, stderr)
}

func lookup(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// newFlagSet is the command's flag set: it prints nothing by itself, so
// parse decides where help and errors go.
func (c *command) newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// parse parses args. done reports that the command must return code
// now: --help (the help on stdout, 0), a bad flag or a stray argument
// (the error and a pointer to --help on stderr, 2).
func (c *command) parse(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) (code int, done bool) {
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		c.writeHelp(stdout, fs)
		return 0, true
	case err != nil:
		fmt.Fprintf(stderr, "pathmend %s: %v\nRun \"pathmend %s --help\" for usage.\n", c.name, err, c.name)
		return 2, true
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "pathmend %s: unexpected arguments %q\nRun \"pathmend %s --help\" for usage.\n", c.name, fs.Args(), c.name)
		return 2, true
	}
	return 0, false
}

// hidden marks a flag that is accepted but not listed in the help.
type hidden struct{ flag.Value }

// IsBoolFlag keeps a hidden boolean flag usable without a value.
func (h hidden) IsBoolFlag() bool {
	b, ok := h.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// hide hides the named flags of fs from the help.
func hide(fs *flag.FlagSet, names ...string) {
	for _, n := range names {
		if f := fs.Lookup(n); f != nil {
			f.Value = hidden{f.Value}
		}
	}
}

// writeHelp prints the command's synopsis, description, flags by group
// and exit status.
func (c *command) writeHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Usage:")
	for _, s := range c.synopsis {
		fmt.Fprintf(w, "  pathmend %s\n", s)
	}
	fmt.Fprintf(w, "\n%s\n", strings.TrimSpace(c.description))
	listed := map[string]bool{}
	for _, g := range c.groups {
		var fl []*flag.Flag
		for _, n := range g.names {
			if f := fs.Lookup(n); f != nil && !isHidden(f) {
				fl = append(fl, f)
				listed[n] = true
			}
		}
		writeFlags(w, g.title, fl)
	}
	var rest []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !listed[f.Name] && !isHidden(f) {
			rest = append(rest, f)
		}
	})
	writeFlags(w, "Other flags", rest)
	if len(c.exitCodes) > 0 {
		fmt.Fprintln(w, "\nExit status:")
		for _, e := range c.exitCodes {
			for i, l := range wrap(e.meaning, 72) {
				if i == 0 {
					fmt.Fprintf(w, "  %d  %s\n", e.code, l)
				} else {
					fmt.Fprintf(w, "     %s\n", l)
				}
			}
		}
	}
}

func isHidden(f *flag.Flag) bool {
	_, ok := f.Value.(hidden)
	return ok
}

// writeFlags prints one group: "--name TYPE", then the usage and the
// default, wrapped and indented.
func writeFlags(w io.Writer, title string, fl []*flag.Flag) {
	if len(fl) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s:\n", title)
	for _, f := range fl {
		typ, text := flag.UnquoteUsage(f)
		dash := "--"
		if len(f.Name) == 1 {
			dash = "-"
		}
		if typ != "" {
			typ = " " + typ
		}
		fmt.Fprintf(w, "  %s%s%s\n", dash, f.Name, typ)
		lines := wrap(text, 70)
		// "(default: X)" stays whole on one line, so tools can read it.
		if !isZeroDefault(f.DefValue) {
			def := "(default: " + f.DefValue + ")"
			if n := len(lines); n > 0 && len(lines[n-1])+1+len(def) <= 70 {
				lines[n-1] += " " + def
			} else {
				lines = append(lines, def)
			}
		}
		for _, l := range lines {
			fmt.Fprintf(w, "        %s\n", l)
		}
	}
}

func isZeroDefault(v string) bool {
	switch v {
	case "", "0", "0s", "false":
		return true
	}
	return false
}

// wrap splits text into lines of at most width runes at spaces (a longer
// word stays whole).
func wrap(text string, width int) []string {
	var lines []string
	var cur strings.Builder
	for _, word := range strings.Fields(text) {
		if cur.Len() > 0 && cur.Len()+1+len(word) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(word)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}
