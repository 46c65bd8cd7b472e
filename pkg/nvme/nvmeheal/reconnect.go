package nvmeheal

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/companion"
	"github.com/pathmend/pathmend/pkg/heal"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/volume"
)

// Prober tells whether a TCP endpoint accepts connections. The transport
// probes before every connect: a kernel connect to a dead target blocks
// for tens of seconds, a probe fails in its short timeout.
type Prober interface {
	Reachable(ctx context.Context, hostport string) error
}

// TCPProber dials the endpoint and closes the connection at once.
type TCPProber struct {
	// Timeout bounds one probe.
	Timeout time.Duration
}

// Reachable returns nil when a TCP connection to hostport succeeds within
// the timeout.
func (p TCPProber) Reachable(ctx context.Context, hostport string) error {
	d := net.Dialer{Timeout: p.Timeout}
	c, err := d.DialContext(ctx, "tcp", hostport)
	if err != nil {
		return err
	}
	return c.Close()
}

// errNoAnswer marks a probe that failed other than by a refusal: the
// endpoint did not answer within the probe's time (dropped packets, a host
// that is down), or the network has no route to it.
var errNoAnswer = errors.New("unreachable")

// errNoSecret: the endpoint was connected with DH-HMAC-CHAP and no live
// controller of the subsystem holds the keys any more.
var errNoSecret = errors.New("the endpoint authenticated with DH-HMAC-CHAP and no controller of the subsystem holds the keys any more (pathmend never stores them)")

// refused reports whether err is the endpoint answering and refusing the
// connection (ECONNREFUSED), from the probe or from the kernel's connect:
// a retry costs one round trip, so it is never backed off.
func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// attempt tries one missing endpoint within its backoff: connect is the
// probe and the connect. It returns "" when it connected, else why not.
//
// What is backed off is what costs: a probe that got no answer waited its
// whole timeout, and a kernel connect that failed after the probe
// answered may block for the connect timeout. A refusal is retried on the
// next tick. An endpoint backed off for not answering is rechecked every
// tick with a probe bounded by RecheckTimeout, which does not take a
// connect slot: when it answers again it is connected in the same tick,
// so a returned endpoint waits at most a tick, not the backoff it grew
// while it was away. owned says the endpoint is a staged volume's: its
// reachability counts in the node's conditions.
func (t *Transport) attempt(ctx context.Context, key, hostport string, owned bool, connect func(context.Context) error, log []any) (skip string) {
	now := t.deps.Clock.Now()
	if ok, until, lastErr, recheck := t.back.Ready(key, now); !ok {
		if !recheck || !t.recheck(ctx, hostport) {
			if recheck && owned {
				t.reach.unreachable(key, now, lastErr)
			}
			return fmt.Sprintf("backed off until %s (%s)", until.Format(time.TimeOnly), lastErr)
		}
		klog.V(2).InfoS("Backed-off endpoint answers again; reconnecting now", log...)
	}
	err := connect(ctx)
	switch {
	case err == nil:
		t.back.Success(key)
		t.reach.reachable(key)
		return ""
	case refused(err):
		t.back.Success(key)
		if owned {
			t.reach.unreachable(key, now, err.Error())
		}
		klog.V(2).InfoS("Path not reconnected: refused; retried next tick", append(log, "err", err.Error())...)
		return fmt.Sprintf("%v; retried next tick", err)
	case errors.Is(err, errNoAnswer):
		if owned {
			t.reach.unreachable(key, now, err.Error())
		}
	default:
		t.reach.reachable(key) // it answered; the connect is what failed
	}
	until := t.back.Failure(key, now, err, errors.Is(err, errNoAnswer))
	klog.InfoS("Path not reconnected", append(log, "err", err.Error(), "retryAt", until.Format(time.RFC3339))...)
	return err.Error()
}

// recheck reports whether a backed-off endpoint answers a probe bounded
// by RecheckTimeout.
func (t *Transport) recheck(ctx context.Context, hostport string) bool {
	cctx, cancel := context.WithTimeout(ctx, t.cfg.RecheckTimeout)
	defer cancel()
	return t.deps.Prober.Reachable(cctx, hostport) == nil
}

// probe checks the endpoint within cctx: a refusal wraps ECONNREFUSED,
// no answer errNoAnswer.
func (t *Transport) probe(cctx context.Context, hostport string) error {
	if err := t.deps.Prober.Reachable(cctx, hostport); err != nil {
		if refused(err) {
			return fmt.Errorf("refused: %w", err)
		}
		return fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	return nil
}

// reconnect connects endpoint ep of staged volume n, within its backoff,
// and returns "" when it connected, else "ep: why not". Secrets for
// DH-HMAC-CHAP come from a live sibling controller's sysfs attributes:
// records never hold secrets, and the kernel keeps the ones NodeStage
// gave it.
func (t *Transport) reconnect(ctx context.Context, host *nvme.Host, n *volume.NVMeTCP, ep volume.Endpoint) string {
	log := []any{"nqn", n.NQN, "endpoint", ep.String()}
	skip := t.attempt(ctx, n.NQN+" "+ep.String(), ep.String(), true, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, t.cfg.ConnectTimeout)
		defer cancel()
		start := t.deps.Clock.Now()
		if err := t.probe(cctx, ep.String()); err != nil {
			return err
		}
		secrets := nvme.SiblingSecrets(t.deps.SysFS, host, n.NQN)
		if _, err := t.deps.Connector.Connect(cctx, nvme.ConnectOptions(n, ep, t.deps.Host, secrets)); err != nil {
			return err
		}
		// took: the probe and the kernel's connect, what an event's
		// latency to this line includes besides pathmend's own work.
		klog.InfoS("Reconnected path", append(log, "took", t.deps.Clock.Since(start))...)
		return nil
	}, log)
	if skip == "" {
		return ""
	}
	return fmt.Sprintf("%s: %s", ep, skip)
}

// reconnectLearned connects endpoint e of learned subsystem nqn with its
// learned options, if the mode and the action flags allow it and its
// backoff has run out; skip says why not, or why it failed.
func (t *Transport) reconnectLearned(ctx context.Context, host *nvme.Host, nqn string, e companion.Endpoint) (skip string, ok bool) {
	flag, enabled := "--nvme-reconnect", t.cfg.Actions.NVMeReconnect
	if e.TornDown || !e.GivenUp() {
		flag, enabled = "--nvme-repairs", t.cfg.Actions.NVMeRepairs
	}
	switch {
	case t.deps.Policy.Mode() != heal.ModeRepair:
		return fmt.Sprintf("%s mode: would reconnect with the learned options", t.deps.Policy.Mode()), false
	case !enabled:
		return "would reconnect with the learned options; not enabled (" + flag + ")", false
	}
	hostport := net.JoinHostPort(e.Traddr, e.Trsvcid)
	var name nvme.ControllerName
	skip = t.attempt(ctx, nqn+" "+e.String(), hostport, false, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, t.cfg.ConnectTimeout)
		defer cancel()
		if err := t.probe(cctx, hostport); err != nil {
			return err
		}
		o := e.Options(nqn)
		if e.Params.DHCHAP {
			s := nvme.SiblingSecrets(t.deps.SysFS, host, nqn)
			if s.DHCHAPSecret == "" {
				return errNoSecret
			}
			o.DHCHAPSecret, o.DHCHAPCtrlSecret = s.DHCHAPSecret, s.DHCHAPCtrlSecret
		}
		r, err := t.deps.Connector.Connect(cctx, o)
		if err != nil {
			return err
		}
		name = nvme.ControllerName(r.Name())
		klog.InfoS("Reconnected path", "nqn", nqn, "endpoint", e.String(), "learned", true, "controller", r.Name(), "options", o.String())
		return nil
	}, []any{"nqn", nqn, "endpoint", e.String(), "learned", true})
	if skip != "" {
		return skip, false
	}
	t.cfg.Foreign.Reconnected(nqn, e.Endpoint, name)
	return "", true
}
