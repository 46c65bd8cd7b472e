package iscsi

import (
	"testing"

	"github.com/pathmend/pathmend/pkg/volume"
)

// ChooseKick on the lab's captures: the ladder's choice follows from
// which device the staged volume uses and whether a multipath map keeps
// another live path; records of other transports do not count.
func TestChooseKick_OnTheCaptures(t *testing.T) {
	nvmeRec := volume.Record{VolumeID: "pv-nvme", Context: volume.Context{Transport: volume.TransportNVMeTCP, NVMe: &volume.NVMeTCP{NQN: "nqn.x"}}, Device: "/dev/sdb"}
	for _, tc := range []struct {
		name, capture string
		session       SessionID
		recs          []volume.Record
		want          Kick
		why           string
	}{
		{"map keeps a live path", "iscsi-healthy", 2, []volume.Record{rec("pv-0", healthyIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2")}, KickRelogin,
			"LUN 0 (dm-0) has another live path sda; LUN 1 (dm-1) has another live path sdb"},
		{"volume on the other session's disk", "iscsi-session-failed", 2, []volume.Record{rec("pv", failingIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")}, KickRelogin,
			"LUN 0 (sdb) is used by no staged volume"},
		{"volume on the stuck disk", "iscsi-session-free", 2, []volume.Record{rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")}, KickRestart,
			"LUN 0: sdb has no other live path and is used by volume pv"},
		{"target not staged", "iscsi-session-free", 2, nil, KickRestart,
			"LUN 0: sdb has no other live path, and its target is not staged by pathmend (cannot tell who uses it)"},
		{"only an NVMe record", "iscsi-session-free", 2, []volume.Record{nvmeRec}, KickRestart,
			"LUN 0: sdb has no other live path, and its target is not staged by pathmend (cannot tell who uses it)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := readCapture(t, tc.capture)
			s, ok := snap.Session(tc.session)
			if !ok {
				t.Fatalf("no %s in %s", tc.session, tc.capture)
			}
			k, why := ChooseKick(snap, s, tc.recs)
			if k != tc.want || why != tc.why {
				t.Errorf("ChooseKick = %s, %q; want %s, %q", k, why, tc.want, tc.why)
			}
		})
	}
}
