//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pathmend/pathmend/pkg/sysfs"
)

func TestISCSI_TwoPortalsWithCHAPGiveTwoSessionsThatFailAndRecover(t *testing.T) {
	l := needLab(t)
	l.teardownAll(t)
	const iqn = "iqn.2024-01.io.pathmend.lab:e2e-two-portals"
	l.sh(t, fmt.Sprintf(`
iqn=%q
lio_target_create "$iqn" 1
for i in 0 1; do
	dev=$(lab_loop_create e2e-lun$i 32)
	lio_backstore_iblock e2e-lun$i "$dev"
	lio_lun_add "$iqn" 1 $i e2e-lun$i
done
lio_portal_add "$iqn" 1 127.0.0.1
lio_portal_add "$iqn" 1 127.0.0.2
lio_chap "$iqn" 1 e2e-user e2e-secret-123
lio_tpg_enable "$iqn" 1
iscsi_host_start
iscsi_discover 127.0.0.1 >/dev/null
for p in 127.0.0.1:3260 127.0.0.2:3260; do
	iscsi_node_set "$iqn" $p node.session.auth.authmethod CHAP
	iscsi_node_set "$iqn" $p node.session.auth.username e2e-user
	iscsi_node_set "$iqn" $p node.session.auth.password e2e-secret-123
	iscsi_node_set "$iqn" $p node.session.timeo.replacement_timeout 120
	iscsi_login "$iqn" $p >/dev/null
done
`, iqn))
	fsys := sysfs.New("/sys")
	var sessions []string
	for _, portal := range []string{"127.0.0.1", "127.0.0.2"} {
		s := l.sh(t, fmt.Sprintf("iscsi_session_of %q %s:3260", iqn, portal))
		sessions = append(sessions, s)
		base := "class/iscsi_session/" + s
		eventually(t, 2*time.Minute, s+" LOGGED_IN", attrIs(fsys, base+"/state", "LOGGED_IN"))
		if v, err := fsys.ReadAttr(base + "/targetname"); err != nil || v != iqn {
			t.Errorf("%s targetname = %q, %v; want %q", s, v, err, iqn)
		}
		conn := "class/iscsi_connection/connection" + strings.TrimPrefix(s, "session") + ":0"
		if v, err := fsys.ReadAttr(conn + "/persistent_address"); err != nil || v != portal {
			t.Errorf("%s persistent_address = %q, %v; want %s", conn, v, err, portal)
		}
		// The session → target → LUN → block walk finds one disk per LUN.
		eventually(t, 2*time.Minute, "two disks on "+s, func() bool {
			return len(strings.Fields(l.sh(t, "iscsi_disks_of "+s))) == 2
		})
	}

	// Disabling the TPG drops both sessions out of LOGGED_IN; enabling it
	// lets iscsid log them back in.
	l.sh(t, fmt.Sprintf("lio_tpg_disable %q 1", iqn))
	for _, s := range sessions {
		eventually(t, 3*time.Minute, s+" FAILED", attrIs(fsys, "class/iscsi_session/"+s+"/state", "FAILED"))
	}
	l.sh(t, fmt.Sprintf("lio_tpg_enable %q 1", iqn))
	for _, s := range sessions {
		eventually(t, 4*time.Minute, s+" LOGGED_IN again", attrIs(fsys, "class/iscsi_session/"+s+"/state", "LOGGED_IN"))
	}
}
