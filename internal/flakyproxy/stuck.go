package flakyproxy

import (
	"context"
	"fmt"
	"time"
)

// Session is what Stuck needs to see of the proxied iSCSI session: whether
// there is one through the proxy, and whether it is LOGGED_IN. The state
// is read from sysfs by the caller.
type Session func() (present, loggedIn bool, state string)

// breaker is the part of a Proxy Stuck drives (a fake in tests).
type breaker interface {
	Break(cond func() bool)
	Pass()
	Resets() (all, afterCond int)
	Forwards() (bound, unbound int)
	UnboundRun() int
}

var _ breaker = (*Proxy)(nil)

// StuckOptions bound the attempts at the stuck state.
type StuckOptions struct {
	// Budget bounds all attempts.
	Budget time.Duration
	// BreakFor bounds one attempt's breaking: the resets after the bind
	// each race the window, and 1 to 80 of them were needed.
	BreakFor time.Duration
	// LeaveWait bounds the wait for the session to leave LOGGED_IN once
	// the proxy breaks.
	LeaveWait time.Duration
	// SelfRecovery bounds how long a session is watched once its portal
	// passes again: iscsid 2.1.8 relogs in within 2–6 s, so a session
	// still down after this (two of its 15 s login timeouts) is stuck
	// even when the proxy saw too few reopens to tell.
	SelfRecovery time.Duration
	// Poll is the interval of the checks.
	Poll time.Duration
	// Logf, when set, is told how each attempt went.
	Logf func(format string, args ...any)
	// Lost, when set, is called with the cause of every attempt that lost
	// the race, before the next one starts: a caller that counts its
	// retries (a test suite's flake accounting) learns each one.
	Lost func(cause string)
}

// DefaultStuckOptions are the e2e tests' and the soak's.
var DefaultStuckOptions = StuckOptions{
	Budget: 5 * time.Minute, BreakFor: 2 * time.Minute, LeaveWait: 90 * time.Second,
	SelfRecovery: 30 * time.Second, Poll: 200 * time.Millisecond,
}

// Stuck drives the session through the proxy into the stuck state of
// open-iscsi #387 and returns once it is there (nil), or with an error
// when the budget ran out or ctx ended first. bound is the break
// condition: the kernel shows the session's connection bound.
//
// One attempt breaks until the session leaves LOGGED_IN and the proxy
// has seen the stuck state's signature (a reopen reset after its bind,
// then three reopens that never got bound: their bind failed with
// ENOTCONN), or for BreakFor, then lets the portal pass and decides as
// soon as the race is known: lost when a reopen is seen bound or the
// session is LOGGED_IN again (iscsid is recovering it by itself), won when
// two reopens were closed without ever being bound while the session stays
// down, or when it is still down after SelfRecovery. A lost attempt ends
// as soon as it is known to be lost, and the next one starts at once
// (breaking again takes the session down whatever it is doing).
func (p *Proxy) Stuck(ctx context.Context, s Session, bound func() bool, o StuckOptions) error {
	return stuck(ctx, p, s, bound, o)
}

func stuck(ctx context.Context, p breaker, s Session, bound func() bool, o StuckOptions) error {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	start := time.Now()
	deadline := start.Add(o.Budget)
	for i := 1; time.Now().Before(deadline); i++ {
		lost, err := attempt(ctx, p, s, bound, o, deadline, logf)
		if err != nil {
			p.Pass()
			return err
		}
		if lost == "" {
			logf("stuck state reached on attempt %d, %s after the first break", i, time.Since(start).Round(time.Second))
			return nil
		}
		logf("attempt %d lost: %s", i, lost)
		if o.Lost != nil {
			o.Lost(fmt.Sprintf("attempt %d at the stuck session lost the race: %s", i, lost))
		}
	}
	return fmt.Errorf("no stuck session (open-iscsi #387) within %s: iscsid recovered each time", o.Budget)
}

// sleep waits d, or returns ctx's error.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// attempt makes one attempt; lost is "" when it won, else why it lost.
func attempt(ctx context.Context, p breaker, s Session, bound func() bool, o StuckOptions, deadline time.Time, logf func(string, ...any)) (lost string, err error) {
	start := time.Now()
	p.Break(bound)
	for leave := start.Add(o.LeaveWait); ; {
		present, loggedIn, _ := s()
		if present && !loggedIn {
			break
		}
		if time.Now().After(leave) {
			return "", fmt.Errorf("the proxied session did not leave LOGGED_IN within %s of the break", o.LeaveWait)
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return "", err
		}
	}
	_, bound0 := p.Resets()
	breakUntil := time.Now().Add(o.BreakFor)
	if deadline.Before(breakUntil) {
		breakUntil = deadline
	}
	for time.Now().Before(breakUntil) {
		if _, b := p.Resets(); b > bound0 && p.UnboundRun() >= 3 {
			break
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return "", err
		}
	}
	fb0, fu0 := p.Forwards()
	p.Pass()
	passed := time.Now()
	for time.Since(passed) < o.SelfRecovery {
		present, loggedIn, state := s()
		fb, fu := p.Forwards()
		switch {
		case present && loggedIn:
			return fmt.Sprintf("LOGGED_IN again %s after the portal passed (%s after the break)", time.Since(passed).Round(100*time.Millisecond), time.Since(start).Round(time.Second)), nil
		case fb > fb0:
			return fmt.Sprintf("a reopen was bound %s after the portal passed: iscsid is logging in (%s after the break)", time.Since(passed).Round(100*time.Millisecond), time.Since(start).Round(time.Second)), nil
		case fu-fu0 >= 2 && present:
			all, afterBind := p.Resets()
			logf("stuck after %s: %s, %d reopens after the portal passed closed without a bind (proxy reset %d connections, %d of them bound)",
				time.Since(start).Round(time.Second), state, fu-fu0, all, afterBind)
			return "", nil
		}
		if err := sleep(ctx, o.Poll); err != nil {
			return "", err
		}
	}
	_, _, state := s()
	all, afterBind := p.Resets()
	logf("stuck after %s: %s for %s with its portal passing (proxy reset %d connections, %d of them bound)", time.Since(start).Round(time.Second), state, o.SelfRecovery, all, afterBind)
	return "", nil
}
