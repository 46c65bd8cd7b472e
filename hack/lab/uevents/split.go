package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/pathmend/pathmend/pkg/uevent/ueventtest"
)

// cmdSplit cuts the recorder's lines into one recording per fault: the
// events received from the fault's begin mark to its end mark.
func cmdSplit(args []string) error {
	fs := flags("split")
	events := fs.String("events", "", "the recorder's output")
	marks := fs.String("marks", "", "the marks")
	kernel := fs.String("kernel", "", "the guest's kernel, as the recordings name it")
	out := fs.String("o", ueventtest.Dir, "directory of the recordings")
	fs.Parse(args)
	if *events == "" || *marks == "" || *kernel == "" {
		return errors.New("split: -events, -marks and -kernel are required")
	}
	ev, err := readLines(*events)
	if err != nil {
		return err
	}
	mk, err := readLines(*marks)
	if err != nil {
		return err
	}
	recs, err := split(ev, mk, *kernel)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, r := range recs {
		if err := ueventtest.Save(*out, r); err != nil {
			return err
		}
		fmt.Printf("%s: %d events\n", r.Fault, len(r.Events))
	}
	return nil
}

// split pairs every begin mark with the end mark of the same fault and
// takes the events between them. A loss inside a window fails: that
// recording would be incomplete.
func split(events, marks []line, kernel string) ([]ueventtest.Recording, error) {
	var out []ueventtest.Recording
	for i := 0; i < len(marks); i++ {
		b := marks[i]
		if b.Phase != "begin" {
			return nil, fmt.Errorf("mark %d: %s %s without a begin", i, b.Fault, b.Phase)
		}
		if i+1 >= len(marks) || marks[i+1].Phase != "end" || marks[i+1].Fault != b.Fault {
			return nil, fmt.Errorf("mark %d: %s begins but does not end next", i, b.Fault)
		}
		e := marks[i+1]
		i++
		r := ueventtest.Recording{Fault: b.Fault, Do: b.Do, Until: e.Until, Kernel: kernel,
			WindowMs: ms(e.T - b.T), Events: []ueventtest.Recorded{}}
		for _, l := range events {
			if l.T < b.T || l.T >= e.T {
				continue
			}
			if len(l.Lost) > 0 {
				return nil, fmt.Errorf("%s: the recorder lost events (%v): record again", b.Fault, l.Lost)
			}
			r.Events = append(r.Events, ueventtest.Recorded{DelayMs: ms(l.T - b.T), Env: l.Env})
		}
		out = append(out, r)
	}
	return out, nil
}

// ms renders nanoseconds as milliseconds to the microsecond.
func ms(ns int64) float64 { return float64(ns/1000) / 1000 }

func readLines(path string) ([]line, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, l)
	}
	return out, sc.Err()
}
