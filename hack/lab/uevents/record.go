package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pathmend/pathmend/pkg/uevent"
)

// line is one line of the recorder's or the marker's output. Times are
// the guest's realtime clock in nanoseconds: the recorder and the marker
// run on the same clock.
type line struct {
	T int64 `json:"t"`
	// An event: every key the kernel sent.
	Env map[string]string `json:"env,omitempty"`
	// A loss: why events were lost (the recording is then incomplete).
	Lost []string `json:"lost,omitempty"`
	// A mark.
	Fault string `json:"fault,omitempty"`
	Phase string `json:"phase,omitempty"`
	Do    string `json:"do,omitempty"`
	Until string `json:"until,omitempty"`
}

// cmdRecord writes every kernel uevent as one line until SIGTERM or
// SIGINT, and prints "recording" to stderr once the socket is open (the
// guest script waits for it before the first fault).
func cmdRecord(args []string) error {
	fs := flags("record")
	out := fs.String("o", "", "output file (JSON lines)")
	fs.Parse(args)
	if *out == "" {
		return errors.New("record: -o is required")
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	conn, err := uevent.Dial(8 << 20)
	if err != nil {
		return err
	}
	src := uevent.NewSource(conn, uevent.Config{Queue: 1 << 16, Filter: func(uevent.Event) bool { return true }})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	fmt.Fprintln(os.Stderr, "recording")
	enc := json.NewEncoder(f)
	for {
		b, err := src.Next(ctx)
		if err != nil {
			break
		}
		if len(b.Lost) > 0 {
			l := line{T: time.Now().UnixNano()}
			for _, x := range b.Lost {
				l.Lost = append(l.Lost, string(x))
			}
			if err := enc.Encode(l); err != nil {
				return err
			}
		}
		for _, e := range b.Events {
			if err := enc.Encode(line{T: e.Received.UnixNano(), Env: e.Env}); err != nil {
				return err
			}
		}
	}
	// What was received before the signal is written before exiting.
	stop()
	<-done
	for b := src.Take(); len(b.Events) > 0; b = src.Take() {
		for _, e := range b.Events {
			if err := enc.Encode(line{T: e.Received.UnixNano(), Env: e.Env}); err != nil {
				return err
			}
		}
	}
	return f.Sync()
}

// cmdMark appends one mark.
func cmdMark(args []string) error {
	fs := flags("mark")
	out := fs.String("o", "", "marks file (JSON lines), appended to")
	fault := fs.String("fault", "", "fault name")
	phase := fs.String("phase", "", "begin or end")
	do := fs.String("do", "", "what the lab does (begin)")
	until := fs.String("until", "", "what the lab waited for (end)")
	fs.Parse(args)
	if *out == "" || *fault == "" || (*phase != "begin" && *phase != "end") {
		return errors.New("mark: -o, -fault and -phase begin|end are required")
	}
	f, err := os.OpenFile(*out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if err := json.NewEncoder(f).Encode(line{T: time.Now().UnixNano(), Fault: *fault, Phase: *phase, Do: *do, Until: *until}); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
