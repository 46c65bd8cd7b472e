package companion

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pathmend/pathmend/pkg/nvme"
)

const nqnX = "nqn.2014-08.io.example:foreign"

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func ctrl(name, traddr string, state nvme.ControllerState) Sighting {
	return Sighting{
		Controller: nvme.Controller{
			Name: nvme.ControllerName(name), State: state, Transport: "tcp", SubsysNQN: nqnX,
			Address: nvme.Address{Traddr: traddr, Trsvcid: "4420"}, HostNQN: "nqn.2014-08.org.nvmexpress:uuid:driver",
			CtrlLossTmo: nvme.Timeout{Seconds: 30}, ReconnectDelay: nvme.Timeout{Seconds: 2}, FastIOFailTmo: nvme.Timeout{Off: true}, KATO: 7,
		},
		Params: nvme.ConnectParams{HostID: "driver-host-id", QueueCount: 3, SQSize: 127}, ParamsOK: true,
	}
}

// unknown is a sighting of controller name in state, not seen live by
// this process: its address is not read (nvme.Controller.AddressUnknown).
func unknown(name string, state nvme.ControllerState) Sighting {
	s := ctrl(name, "", state)
	s.Controller.Address, s.Controller.AddressUnknown = nvme.Address{}, true
	return s
}

func ep(traddr string) nvme.Endpoint {
	return nvme.Endpoint{Transport: "tcp", Traddr: traddr, Trsvcid: "4420"}
}

// learnSteps runs Learn over a sequence of reads one second apart.
func learnSteps(steps ...[]Sighting) (map[string]Subsystem, []Event) {
	state := map[string]Subsystem{}
	var events []Event
	for i, s := range steps {
		seen := map[string][]Sighting{}
		if len(s) > 0 {
			seen[nqnX] = s
		}
		var evs []Event
		state, _, _, evs = Learn(state, seen, time.Hour, t0.Add(time.Duration(i)*time.Second))
		events = append(events, evs...)
	}
	return state, events
}

func kinds(evs []Event) []string {
	var out []string
	for _, e := range evs {
		out = append(out, string(e.Kind)+" "+e.Endpoint)
	}
	return out
}

// TestLearn_GivenUpVersusDisconnected pins the rule: what the controller
// was last seen doing before it vanished (deleting does not count)
// decides whether the endpoint is kept for a reconnect or forgotten.
func TestLearn_GivenUpVersusDisconnected(t *testing.T) {
	a, b := ctrl("nvme0", "10.0.0.1", nvme.StateLive), func(s nvme.ControllerState) Sighting { return ctrl("nvme1", "10.0.0.2", s) }
	for _, tc := range []struct {
		name     string
		steps    [][]Sighting
		wantEps  []nvme.Endpoint
		wantWant []bool // WantsConnect per kept endpoint
		want     []string
	}{
		{
			name:    "live then gone: disconnected on purpose",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1")}, wantWant: []bool{false},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "disconnected tcp 10.0.0.2:4420"},
		},
		{
			name:    "live, deleting, gone: still a disconnect",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, b(nvme.StateDeleting)}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1")}, wantWant: []bool{false},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "disconnected tcp 10.0.0.2:4420"},
		},
		{
			name:    "connecting then gone: the kernel gave up",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, b(nvme.StateConnecting)}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, true},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "given up by the kernel tcp 10.0.0.2:4420"},
		},
		{
			name:    "resetting, connecting, deleting (no IO), gone: given up",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, b(nvme.StateResetting)}, {a, b(nvme.StateConnecting)}, {a, b(nvme.StateDeletingNoIO)}, {a}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, true},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "given up by the kernel tcp 10.0.0.2:4420"},
		},
		{
			name:    "a controller seen only while being deleted is never learned",
			steps:   [][]Sighting{{a, b(nvme.StateDeleting)}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1")}, wantWant: []bool{false},
			want: []string{"learned tcp 10.0.0.1:4420"},
		},
		{
			name:    "dead stays present: StaleEndpoint's repair decides",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, b(nvme.StateDead)}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, false},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420"},
		},
		{
			name:    "given up, then connected again: present and live",
			steps:   [][]Sighting{{a, b(nvme.StateConnecting)}, {a}, {a, b(nvme.StateLive)}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, false},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "given up by the kernel tcp 10.0.0.2:4420"},
		},
		{
			name:    "of unknown address under its learned name, then gone: the kernel gave up",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, unknown("nvme1", nvme.StateConnecting)}, {a}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, true},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420", "given up by the kernel tcp 10.0.0.2:4420"},
		},
		{
			name:    "of unknown address under another name: no endpoint counts as gone, nothing learned",
			steps:   [][]Sighting{{a, b(nvme.StateLive)}, {a, unknown("nvme7", nvme.StateConnecting)}},
			wantEps: []nvme.Endpoint{ep("10.0.0.1"), ep("10.0.0.2")}, wantWant: []bool{false, false},
			want: []string{"learned tcp 10.0.0.1:4420", "learned tcp 10.0.0.2:4420"},
		},
		{
			name:  "the last endpoint disconnected: the subsystem is forgotten",
			steps: [][]Sighting{{a}, {}},
			want:  []string{"learned tcp 10.0.0.1:4420", "disconnected tcp 10.0.0.1:4420", "forgotten "},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, evs := learnSteps(tc.steps...)
			if diff := cmp.Diff(tc.want, kinds(evs)); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
			sub := got[nqnX]
			var eps []nvme.Endpoint
			var wants []bool
			for _, e := range sub.Endpoints {
				eps, wants = append(eps, e.Endpoint), append(wants, e.WantsConnect())
			}
			if diff := cmp.Diff(tc.wantEps, eps); diff != "" {
				t.Errorf("endpoints (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantWant, wants); diff != "" {
				t.Errorf("WantsConnect (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLearn_ForgetsASubsystemGoneLongerThanTheBound: a subsystem whose
// every endpoint was given up is kept (to reconnect) for the bound, then
// forgotten.
func TestLearn_ForgetsASubsystemGoneLongerThanTheBound(t *testing.T) {
	s := ctrl("nvme0", "10.0.0.1", nvme.StateConnecting)
	state, _, _, _ := Learn(nil, map[string][]Sighting{nqnX: {s}}, time.Hour, t0)
	state, changed, forgotten, _ := Learn(state, nil, time.Hour, t0.Add(time.Second))
	if !state[nqnX].Endpoints[0].GivenUp() || len(changed) != 1 || len(forgotten) != 0 {
		t.Fatalf("after the give-up: %+v changed %v forgotten %v", state, changed, forgotten)
	}
	state, changed, forgotten, _ = Learn(state, nil, time.Hour, t0.Add(time.Hour))
	if _, ok := state[nqnX]; !ok || len(changed) != 0 || len(forgotten) != 0 {
		t.Fatalf("59 min 59 s after: %+v changed %v forgotten %v, want kept and unchanged", state, changed, forgotten)
	}
	state, _, forgotten, evs := Learn(state, nil, time.Hour, t0.Add(time.Hour+time.Second))
	if _, ok := state[nqnX]; ok || !cmp.Equal(forgotten, []string{nqnX}) || len(evs) != 1 || evs[0].Kind != Forgotten {
		t.Fatalf("an hour after: %+v forgotten %v events %v, want forgotten", state, forgotten, evs)
	}
}

// TestLearn_KeepsTheOptionsTheKernelPublishes: the learned options are
// the controller's, and make the same connect the driver made.
func TestLearn_KeepsTheOptionsTheKernelPublishes(t *testing.T) {
	state, changed, _, _ := Learn(nil, map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive)}}, time.Hour, t0)
	if !cmp.Equal(changed, []string{nqnX}) {
		t.Fatalf("changed = %v", changed)
	}
	e := state[nqnX].Endpoints[0]
	got := e.Options(nqnX).String()
	want := "transport=tcp,traddr=10.0.0.1,trsvcid=4420,nqn=" + nqnX + ",hostnqn=nqn.2014-08.org.nvmexpress:uuid:driver,hostid=driver-host-id," +
		"ctrl_loss_tmo=30,reconnect_delay=2,fast_io_fail_tmo=-1,keep_alive_tmo=7,nr_io_queues=2,queue_size=128"
	if got != want {
		t.Errorf("options\n got %s\nwant %s", got, want)
	}
	// The same read again changes nothing: no write per tick.
	_, changed, _, evs := Learn(state, map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive)}}, time.Hour, t0.Add(time.Second))
	if len(changed) != 0 || len(evs) != 0 {
		t.Errorf("a second identical read: changed %v events %v", changed, evs)
	}
}

// TestLearn_TornDownIsKeptForTheReconnect: an endpoint a companion repair
// tore down was live when it vanished, and is still connected again.
func TestLearn_TornDownIsKeptForTheReconnect(t *testing.T) {
	state, _, _, _ := Learn(nil, map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive), ctrl("nvme1", "10.0.0.2", nvme.StateLive)}}, time.Hour, t0)
	sub := state[nqnX]
	sub.Endpoints[1].TornDown = true
	state[nqnX] = sub
	state, _, _, evs := Learn(state, map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive)}}, time.Hour, t0.Add(time.Second))
	if len(evs) != 0 || len(state[nqnX].Endpoints) != 2 || !state[nqnX].Endpoints[1].WantsConnect() {
		t.Errorf("after the teardown: %+v events %v, want the endpoint kept to reconnect", state[nqnX], evs)
	}
}

// TestLearn_BoundsTheEndpoints: at most MaxEndpoints per subsystem.
func TestLearn_BoundsTheEndpoints(t *testing.T) {
	var s []Sighting
	for i := range MaxEndpoints + 2 {
		s = append(s, ctrl("nvme"+string(rune('a'+i%26))+string(rune('a'+i/26)), "10.0."+string(rune('0'+i/10))+"."+string(rune('0'+i%10)), nvme.StateLive))
	}
	state, _, _, evs := Learn(nil, map[string][]Sighting{nqnX: s}, time.Hour, t0)
	if n := len(state[nqnX].Endpoints); n != MaxEndpoints {
		t.Errorf("learned %d endpoints, want %d", n, MaxEndpoints)
	}
	if k := evs[len(evs)-1].Kind; k != Full {
		t.Errorf("last event %v, want %v", k, Full)
	}
}

// TestLearn_HoldsAnEndpointConnectedAfterTheRead: an endpoint companion
// mode connected again (recorded live) after a read began may be missing
// from that read; held, it is neither forgotten nor given up. The next
// read, without the hold, decides: missing then, it was disconnected.
func TestLearn_HoldsAnEndpointConnectedAfterTheRead(t *testing.T) {
	state, _ := learnSteps([]Sighting{ctrl("nvme0", "10.0.0.1", nvme.StateLive), ctrl("nvme1", "10.0.0.2", nvme.StateLive)})
	seen := map[string][]Sighting{nqnX: {ctrl("nvme0", "10.0.0.1", nvme.StateLive)}}
	hold := map[string]bool{nqnX + " " + ep("10.0.0.2").String(): true}
	next, changed, forgotten, evs := learn(state, seen, hold, time.Hour, t0.Add(time.Second))
	if len(evs)+len(changed)+len(forgotten) != 0 || len(next[nqnX].Endpoints) != 2 || !next[nqnX].Endpoints[1].GoneSince.IsZero() {
		t.Errorf("held: events %v changed %v forgotten %v endpoints %+v; want it kept as it was", kinds(evs), changed, forgotten, next[nqnX].Endpoints)
	}
	_, _, _, evs = learn(next, seen, nil, time.Hour, t0.Add(2*time.Second))
	if diff := cmp.Diff([]string{"disconnected tcp 10.0.0.2:4420"}, kinds(evs)); diff != "" {
		t.Errorf("the next read (-want +got):\n%s", diff)
	}
}
