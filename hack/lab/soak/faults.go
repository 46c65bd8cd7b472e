package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/pathmend/pathmend/hack/lab/soak/plan"
	"github.com/pathmend/pathmend/hack/lab/soak/report"
	"github.com/pathmend/pathmend/internal/flakyproxy"
	"github.com/pathmend/pathmend/pkg/iscsi"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/sysfs"
)

// runFault injects one planned fault, holds it and undoes it.
func (s *soak) runFault(ctx context.Context, f plan.Fault) report.FaultRun {
	r := report.FaultRun{Fault: f, Result: "done"}
	p := pathByID(f.Path)
	for _, v := range s.vols {
		if (f.Path != "" && v.group == p.group) || v.id == f.Volume {
			r.Volumes = append(r.Volumes, v.id)
		}
	}
	s.logf("fault %s", f)
	fail := func(err error) report.FaultRun {
		r.Result, r.Note = "failed", err.Error()
		s.logf("fault #%d %s failed: %v", f.ID, f.Kind, err)
		return r
	}
	skip := func(why string) report.FaultRun {
		r.Result, r.Note = "skipped", why
		s.logf("fault #%d %s skipped: %s", f.ID, f.Kind, why)
		return r
	}
	// hold injects with in, waits for the hold, and undoes with out.
	hold := func(in, out string) report.FaultRun {
		if _, err := s.sh(ctx, in); err != nil {
			return fail(err)
		}
		r.Injected = time.Now()
		sleep(ctx, f.Hold)
		if _, err := s.sh(context.WithoutCancel(ctx), out); err != nil {
			return fail(fmt.Errorf("undo: %w", err))
		}
		r.Undone = time.Now()
		return r
	}
	switch f.Kind {
	case plan.PortUnlink:
		return hold(fmt.Sprintf("nvmet_port_unlink %d %q", p.nvmetPort, p.portNQN), fmt.Sprintf("nvmet_port_link %d %q", p.nvmetPort, p.portNQN))
	case plan.NVMeDropShort, plan.NVMeDropLong, plan.PortalDropShort, plan.PortalDropLong:
		return hold(fmt.Sprintf("fault_drop_port %d %s", p.port, p.addr), fmt.Sprintf("fault_restore_port %d %s", p.port, p.addr))
	case plan.NotContributing:
		return hold("soak_not_contributing on", "soak_not_contributing off")
	case plan.TPGDisable:
		return hold(fmt.Sprintf("lio_tpg_disable %q %d", iqnI, p.tpgt), fmt.Sprintf("lio_tpg_enable %q %d", iqnI, p.tpgt))
	case plan.ControllerDelete:
		return s.deleteController(f, p, r, skip, fail)
	case plan.NamespaceDisable:
		st := s.state[f.Volume]
		st.lock.Lock()
		defer st.lock.Unlock()
		r = hold(fmt.Sprintf("nvmet_ns_disable %q %s", st.v.target, st.v.context["nsid"]), fmt.Sprintf("nvmet_ns_enable %q %s", st.v.target, st.v.context["nsid"]))
		if r.Result == "done" {
			// On Linux 6.1 a namespace that went away comes back as a new
			// head: the volume's device is gone for good. Restart its pod.
			waitFor(ctx, 2*time.Minute, func() bool { return s.last().Devices[st.v.id] != "" })
			s.restageLocked(ctx, st, "recover: its namespace was disabled on the target", nil)
		}
		return r
	case plan.StuckSession:
		return s.stuckSession(ctx, f, r, skip)
	case plan.Kill:
		s.killPathmend(ctx, f.Down, "at a random moment")
		r.Injected = time.Now()
		return r
	case plan.KillInHeal:
		note := s.killInHeal(ctx, f)
		r.Injected, r.Note = time.Now(), note
		return r
	case plan.Restage, plan.RestageKill:
		st := s.state[f.Volume]
		st.lock.Lock()
		defer st.lock.Unlock()
		var k *midKill
		if f.Kind == plan.RestageKill {
			k = &midKill{during: f.During, after: f.KillAfter, down: f.Down}
		}
		r.Injected = time.Now()
		if err := s.restageLocked(ctx, st, string(f.Kind), k); err != nil {
			return fail(err)
		}
		if k != nil {
			r.Note = k.note
		}
		r.Undone = time.Now()
		return r
	}
	return fail(fmt.Errorf("no executor for %s", f.Kind))
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func waitFor(ctx context.Context, d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline) && ctx.Err() == nil; sleep(ctx, 200*time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// deleteController deletes, by hand, the live controller of the path —
// only while another path of its group is up (deleting the last path of
// a namespace deletes its head on 6.1: the volume would be lost, not
// healed).
func (s *soak) deleteController(f plan.Fault, p path, r report.FaultRun, skip func(string) report.FaultRun, fail func(error) report.FaultRun) report.FaultRun {
	other := false
	for _, q := range paths {
		if q.group == p.group && q.ID != p.ID && s.pathUp(r.Volumes[0], q.ID) {
			other = true
		}
	}
	if !other {
		return skip("no other path of " + p.group + " is up")
	}
	h, err := nvme.Read(sysfs.New("/sys"))
	if err != nil {
		return fail(err)
	}
	for _, c := range h.Controllers {
		if c.SubsysNQN != s.targetOf(p) || c.Address.Traddr != p.addr || c.Address.Trsvcid != fmt.Sprint(p.port) || c.State != nvme.StateLive {
			continue
		}
		key := fmt.Sprintf("%s@%d", c.Name, c.CreatedAt.UnixNano())
		if err := os.WriteFile("/sys/class/nvme/"+string(c.Name)+"/delete_controller", []byte("1"), 0); err != nil {
			return fail(err)
		}
		r.Injected, r.Objects, r.Note = time.Now(), []string{key}, "deleted "+string(c.Name)
		return r
	}
	return skip("no live controller to " + p.ID)
}

// targetOf is the NQN the host sees on an NVMe path (array B2 answers as B).
func (s *soak) targetOf(p path) string {
	if p.portNQN == nqnB2 {
		return nqnB
	}
	return p.portNQN
}

// stuckSession drives the proxied iSCSI session into the stuck state of
// open-iscsi #387; pathmend must kick it. Injected is when it is stuck.
func (s *soak) stuckSession(ctx context.Context, f plan.Fault, r report.FaultRun, skip func(string) report.FaultRun) report.FaultRun {
	if !s.pathUp("vol-i", f.Path) {
		return skip("the proxied session is not LOGGED_IN")
	}
	sys := sysfs.New("/sys")
	find := func() (iscsi.Session, bool) {
		snap, err := iscsi.Read(sys, time.Now())
		if err != nil {
			return iscsi.Session{}, false
		}
		for _, x := range snap.SessionsOf(iqnI) {
			if x.PortalString() == proxyListen {
				return x, true
			}
		}
		return iscsi.Session{}, false
	}
	x, ok := find()
	if !ok {
		return skip("no session through the proxy")
	}
	rel := "class/iscsi_connection/" + iscsi.ConnectionID{Session: x.ID}.String() + "/state"
	bound := func() bool { v, err := sys.ReadAttr(rel); return err == nil && v == string(iscsi.ConnBound) }
	o := flakyproxy.DefaultStuckOptions
	o.Budget = f.Hold
	o.Logf = func(format string, args ...any) { s.logf("fault #%d: "+format, append([]any{f.ID}, args...)...) }
	o.Lost = func(cause string) { s.retried(fmt.Sprintf("fault #%d: %s", f.ID, cause)) }
	session := func() (bool, bool, string) {
		x, ok := find()
		return ok, ok && x.State.LoggedIn(), fmt.Sprintf("%s %s", x.ID, x.State)
	}
	if err := s.proxy.Stuck(ctx, session, bound, o); err != nil {
		return skip(err.Error())
	}
	r.Injected = time.Now()
	r.Note = "stuck: " + x.ID.String()
	return r
}

// killPathmend SIGKILLs pathmend, keeps it down for down and starts it.
func (s *soak) killPathmend(ctx context.Context, down time.Duration, why string) {
	if s.pm.kill() {
		s.record(report.Action{At: time.Now(), What: "kill", Note: "SIGKILL " + why})
	}
	sleep(ctx, down)
	if err := s.pm.start(); err != nil {
		s.record(report.Action{At: time.Now(), What: "start", Err: err.Error()})
		return
	}
	s.record(report.Action{At: time.Now(), What: "start", Note: "pathmend serve, after " + down.Round(100*time.Millisecond).String() + " down"})
}

// healLine reports whether a line of pathmend's log shows it in the
// middle of a heal: a teardown done (the verdict follows the teardown and
// precedes the reconnect), a session kick or an iscsid restart under way.
func healLine(line string) (string, bool) {
	var m map[string]any
	if json.Unmarshal([]byte(line), &m) != nil {
		return "", false
	}
	msg, _ := m["msg"].(string)
	switch {
	case msg == "Heal verdict" && m["verdict"] == "repaired":
		return fmt.Sprintf("after the teardown of %v (%v)", m["controllers"], m["defect"]), true
	case msg == "Kicking iSCSI session":
		return fmt.Sprintf("during the %v of %v", m["kick"], m["session"]), true
	case msg == "Restarting iscsid for stuck sessions":
		return "during an iscsid restart", true
	case msg == "Logged out iSCSI session":
		return fmt.Sprintf("after the logout of %v", m["session"]), true
	}
	return "", false
}

// killInHeal watches pathmend's log and kills it as soon as it is seen
// in the middle of a heal; with none within the fault's hold, it kills
// anyway. The note says which, and what the kernel had at the kill.
func (s *soak) killInHeal(ctx context.Context, f plan.Fault) string {
	file, err := os.Open(s.pm.log)
	if err != nil {
		s.killPathmend(ctx, f.Down, "(no log to watch)")
		return "no log to watch: killed at once"
	}
	defer file.Close()
	_, _ = file.Seek(0, io.SeekEnd)
	rd := bufio.NewReader(file)
	deadline := time.Now().Add(f.Hold)
	var partial strings.Builder
	for time.Now().Before(deadline) && ctx.Err() == nil {
		line, err := rd.ReadString('\n')
		partial.WriteString(line)
		if err != nil {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		what, ok := healLine(partial.String())
		partial.Reset()
		if ok {
			s.killPathmend(ctx, f.Down, "in a heal: "+what)
			return "killed " + what + "; " + s.pathsNow()
		}
	}
	s.killPathmend(ctx, f.Down, "(armed, no heal within "+f.Hold.String()+")")
	return "no heal seen within " + f.Hold.String() + ": killed at its end"
}

// pathsNow summarises which paths were up at the latest sample.
func (s *soak) pathsNow() string {
	smp := s.last()
	var down []string
	for _, v := range s.vols {
		for _, p := range v.spec.Paths {
			if st := smp.Paths[v.id+"/"+p.ID]; !st.Up {
				down = append(down, v.id+"/"+p.ID+" ("+st.Detail+")")
			}
		}
	}
	if len(down) == 0 {
		return "every path up at the kill"
	}
	return "down at the kill: " + strings.Join(down, ", ")
}

// midKill is a SIGKILL of pathmend in the middle of a NodeUnstage or a
// NodeStage, after a delay from the RPC's start.
type midKill struct {
	during string
	after  time.Duration
	down   time.Duration
	note   string
}

// rpcName is "Stage" for "stage".
func rpcName(phase string) string { return strings.ToUpper(phase[:1]) + phase[1:] }

// restageLocked restarts the volume's pod: pause the worker and close
// the device, unpublish, unstage, stage, publish, reopen, then read every
// block back against the model. st.lock is held.
func (s *soak) restageLocked(ctx context.Context, st *volState, why string, k *midKill) error {
	v := st.v
	s.logf("%s: %s", v.id, why)
	old, err := st.worker.Swap(ctx, nil)
	if err != nil {
		return err
	}
	if old != nil {
		old.Close()
	}
	st.mu.Lock()
	st.recovered = time.Now()
	st.mu.Unlock()
	during := func(phase string) func(<-chan struct{}) {
		if k == nil || k.during != phase {
			return nil
		}
		return func(first <-chan struct{}) {
			select {
			case <-first:
				k.note = fmt.Sprintf("the Node%s RPC returned before the kill (%s)", rpcName(phase), k.after)
			case <-time.After(k.after):
				k.note = fmt.Sprintf("killed %s into the Node%s RPC; %s", k.after, rpcName(phase), s.pathsNow())
			}
			s.killPathmend(ctx, k.down, "during the Node"+rpcName(phase)+" of "+v.id)
		}
	}
	if err := s.co.unpublish(ctx, v); err != nil {
		return err
	}
	if err := s.co.unstage(ctx, v, during("unstage")); err != nil {
		return err
	}
	if err := s.co.stage(ctx, v, during("stage")); err != nil {
		return err
	}
	if err := s.co.publish(ctx, v); err != nil {
		return err
	}
	dev, err := s.open(v)
	if err != nil {
		return err
	}
	st.dev = dev
	if _, err := st.worker.Swap(ctx, dev); err != nil {
		return err
	}
	s.verify(ctx, st, why)
	st.mu.Lock()
	st.recovered = time.Now()
	st.mu.Unlock()
	return nil
}

// verify reads every block of the volume against the model.
func (s *soak) verify(ctx context.Context, st *volState, why string) {
	n, bad, undef, err := st.worker.VerifyAll(ctx)
	ver := report.Verification{At: time.Now(), Why: why, Blocks: n, Mismatched: bad, Undefined: undef}
	if err != nil {
		ver.Err = err.Error()
	}
	st.mu.Lock()
	st.verifications = append(st.verifications, ver)
	st.mu.Unlock()
	s.logf("%s verified (%s): %d blocks, %d mismatched, %d undefined %s", st.v.id, why, n, bad, undef, ver.Err)
}
