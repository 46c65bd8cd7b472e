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
		use           DeviceUse
		want          Kick
		why           string
	}{
		{"map keeps a live path", "iscsi-healthy", 2, []volume.Record{rec("pv-0", healthyIQN, 0, "/dev/dm-0", "127.0.0.1", "127.0.0.2")}, nil, KickRelogin,
			"LUN 0 (dm-0) has another live path sda; LUN 1 (dm-1) has another live path sdb"},
		{"volume on the other session's disk", "iscsi-session-failed", 2, []volume.Record{rec("pv", failingIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")}, nil, KickRelogin,
			"LUN 0 (sdb) is used by no staged volume"},
		{"volume on the stuck disk", "iscsi-session-free", 2, []volume.Record{rec("pv", lostIQN, 0, "/dev/sdb", "127.0.0.1", "127.0.0.2")}, fakeUse{}, KickRestart,
			"LUN 0: sdb has no other live path and is used by volume pv"},
		{"target not staged", "iscsi-session-free", 2, nil, nil, KickRestart,
			"LUN 0: sdb has no other live path, and its target is not staged by pathmend (cannot tell who uses it)"},
		{"only an NVMe record", "iscsi-session-free", 2, []volume.Record{nvmeRec}, nil, KickRestart,
			"LUN 0: sdb has no other live path, and its target is not staged by pathmend (cannot tell who uses it)"},
		{"target not staged, unused on the node", "iscsi-session-free", 2, nil, fakeUse{}, KickRelogin,
			"LUN 0 (sdb) is not in use: sdb is not held, mounted or bound anywhere on the node"},
		{"target not staged, mounted on the node", "iscsi-session-free", 2, nil, fakeUse{"sdb": "sdb is mounted at /mnt/x"}, KickRestart,
			"LUN 0: sdb has no other live path and is in use on the node: sdb is mounted at /mnt/x"},
		{"target not staged, the node cannot tell", "iscsi-session-free", 2, nil, fakeUse{"sdb": "cannot tell whether sdb is in use: mount table: EACCES"}, KickRestart,
			"LUN 0: sdb has no other live path and is in use on the node: cannot tell whether sdb is in use: mount table: EACCES"},
		{"staged volume on the other disk, the stuck one mounted by someone", "iscsi-session-failed", 2, []volume.Record{rec("pv", failingIQN, 0, "/dev/sda", "127.0.0.1", "127.0.0.2")},
			fakeUse{"sdb": "sdb is mounted at /mnt/y"}, KickRestart, "LUN 0: sdb has no other live path and is in use on the node: sdb is mounted at /mnt/y"},
		{"map keeps a live path, node not asked", "iscsi-healthy", 2, nil, fakeUse{"dm-0": "dm-0 is mounted at /mnt/z", "dm-1": "x"}, KickRelogin,
			"LUN 0 (dm-0) has another live path sda; LUN 1 (dm-1) has another live path sdb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := readCapture(t, tc.capture)
			s, ok := snap.Session(tc.session)
			if !ok {
				t.Fatalf("no %s in %s", tc.session, tc.capture)
			}
			k, why := ChooseKick(snap, s, tc.recs, tc.use)
			if k != tc.want || why != tc.why {
				t.Errorf("ChooseKick = %s, %q; want %s, %q", k, why, tc.want, tc.why)
			}
		})
	}
}

// fakeUse is a DeviceUse: a device listed is in use for the reason
// given; any other is not.
type fakeUse map[string]string

func (f fakeUse) InUse(dev string) (bool, string) {
	if why, ok := f[dev]; ok {
		return true, why
	}
	return false, dev + " is not held, mounted or bound anywhere on the node"
}
