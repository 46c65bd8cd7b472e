package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The lab's targets: a two-port nvmet subsystem with two namespaces
// (127.0.0.1:4420 ANA-optimized, 127.0.0.1:4421 non-optimized) and a LIO
// target with one LUN behind 127.0.0.1:3260 and 127.0.0.2:3260, the
// second reached through hack/lab/flakyproxy on 127.0.0.3:3260 so its
// session can be driven into the stuck state of open-iscsi #387.
const (
	nqn = "nqn.2024-01.io.pathmend.lab:kube"
	// emptyNQN is a subsystem that exports no namespace: a volume on it
	// cannot be staged.
	emptyNQN = "nqn.2024-01.io.pathmend.lab:kube-empty"
	iqn      = "iqn.2024-01.io.pathmend.lab:kube"
	nvmeA    = "127.0.0.1:4420"
	nvmeB    = "127.0.0.1:4421"
	portalA  = "127.0.0.1:3260"
	proxied  = "127.0.0.3:3260"
	chapUser = "pathmend-lab"
	// A lab-only CHAP password: the target is built with it below.
	chapPassword = "lab-chap-password"
)

func labVolumes() []Volume {
	nvme := func(nsid string) map[string]string {
		return map[string]string{
			"transport": "nvme-tcp", "nqn": nqn,
			"endpoints": nvmeA + "," + nvmeB, "optimizedEndpoints": nvmeA,
			"nsid": nsid, "ctrlLossTmo": "-1", "fastIOFailTmo": "30",
		}
	}
	return []Volume{
		{Name: "nvme-fs", Handle: "lab-nvme-ns1", Mode: corev1.PersistentVolumeFilesystem, FSType: "ext4",
			Example: "nvme-tcp-pv.yaml", Attributes: nvme("1")},
		{Name: "nvme-block", Handle: "lab-nvme-ns2", Mode: corev1.PersistentVolumeBlock,
			Example: "nvme-tcp-pv.yaml", Attributes: nvme("2")},
		{Name: "nvme-empty", Handle: "lab-nvme-empty-ns1", Mode: corev1.PersistentVolumeFilesystem, FSType: "ext4",
			Example: "nvme-tcp-pv.yaml", Attributes: map[string]string{
				"transport": "nvme-tcp", "nqn": emptyNQN, "endpoints": nvmeA + "," + nvmeB,
				"optimizedEndpoints": nvmeA, "nsid": "1",
			}},
		{Name: "iscsi-fs", Handle: "lab-iscsi-lun0", Mode: corev1.PersistentVolumeFilesystem, FSType: "xfs",
			Example: "iscsi-pv.yaml", Attributes: map[string]string{
				"transport": "iscsi", "iqn": iqn, "portals": portalA + "," + proxied,
				"lun": "0", "replacementTimeout": "20",
			},
			Secret: &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "lab-iscsi-chap", Namespace: secretNamespace},
				StringData: map[string]string{"chapUsername": chapUser, "chapPassword": chapPassword},
			}},
	}
}

// handleOf is the volume ID of the lab's PV named pv.
func handleOf(pv string) string {
	for _, v := range labVolumes() {
		if v.Name == pv {
			return v.Handle
		}
	}
	return ""
}

// The pods and the volume each one uses.
var (
	podNVMeFS    = "writer-nvme-fs"
	podNVMeBlock = "writer-nvme-block"
	podISCSI     = "writer-iscsi"
	podNVMeFS2   = "writer-nvme-fs-2"
	podNVMeEmpty = "writer-nvme-empty"
	podVolume    = map[string]string{podNVMeFS: "nvme-fs", podNVMeBlock: "nvme-block", podISCSI: "iscsi-fs", podNVMeFS2: "nvme-fs", podNVMeEmpty: "nvme-empty"}
)

func (l *Lab) scenario() error {
	vols := labVolumes()
	handles := map[string]string{}
	for _, v := range vols {
		handles[v.Name] = v.Handle
	}
	steps := []struct {
		name string
		fn   func() error
	}{
		{"targets: nvmet (2 ports, 2 namespaces), LIO (2 portals, CHAP, flaky proxy), iscsid, multipathd", l.targets},
		{"API objects: CSIDriver, secret, 4 PVs and PVCs pre-bound", func() error { return l.createObjects(vols) }},
		{"3 pods Running (NVMe fs, NVMe raw block, iSCSI fs)", func() error {
			return l.startPods(map[string]bool{podNVMeFS: false, podNVMeBlock: true, podISCSI: false})
		}},
		{"checksummed I/O in every container", func() error { return l.ioProgress([]string{podNVMeFS, podNVMeBlock, podISCSI}, 3) }},
		{"kubelet's NodeStage/NodePublish in pathmend's log, with kubelet's paths", func() error {
			return l.kubeletPaths([]string{podNVMeFS, podNVMeBlock, podISCSI}, handles)
		}},
		{"NVMe: port 127.0.0.1:4421 unlinked and its controller deleted: Degraded in pod status and CSINode", l.nvmeBreak},
		{"NVMe: port back, pathmend reconnects the deleted controller: healthy again, no I/O error", l.nvmeHeal},
		{"iSCSI: the session through the proxy stuck (open-iscsi #387): Degraded in pod status and CSINode", l.iscsiBreak},
		{"iSCSI: pathmend kicks the stuck session: healthy again, no I/O error", l.iscsiHeal},
		{"a second pod on the NVMe filesystem PVC", func() error { return l.secondPod(handles["nvme-fs"]) }},
		{"kubelet restarted with 4 pods running: reconstruction, pathmend still used", l.kubeletRestart},
		{"after the restart: an NVMe path lost and back, reported through the new kubelet", l.nvmeBlip},
		{"a pod whose volume cannot be staged (no namespace), deleted: kubelet unstages the uncertain mount, nothing left", func() error {
			return l.stageFails(handles["nvme-empty"])
		}},
		{"pods deleted: kubelet unpublishes and unstages", func() error { return l.deletePods(handles) }},
		{"NVMe ext4 filesystem error (ext4's own knob): kubelet shows FilesystemReadOnly in the pod's status; the pod replaced: checked (fsck -p), writable", func() error {
			return l.filesystemError(handles["nvme-fs"])
		}},
		{"node clean: no controller, session, node record, map, mount or pathmend record left", l.nodeClean},
	}
	for _, s := range steps {
		if err := l.step(s.name, s.fn); err != nil {
			return err
		}
	}
	return nil
}

func (l *Lab) targets() error {
	_, err := l.sh.Run(3*time.Minute, fmt.Sprintf(`
nvme_two_port_target %[1]q 2
nvme_two_port_target %[6]q 0
lio_target_create %[2]q 1
dev=$(lab_loop_create kube-lun0 512)
lio_backstore_iblock kube-lun0 "$dev"
lio_lun_add %[2]q 1 0 kube-lun0
lio_portal_add %[2]q 1 127.0.0.1
lio_portal_add %[2]q 1 127.0.0.2
lio_chap %[2]q 1 %[3]q %[4]q
lio_tpg_enable %[2]q 1
flakyproxy_start %[5]q 127.0.0.2:3260
iscsid_foreground
multipathd_start
`, nqn, iqn, chapUser, chapPassword, proxied, emptyNQN))
	return err
}

// startPods creates the pods (name → raw block) and waits until each runs.
func (l *Lab) startPods(pods map[string]bool) error {
	names := make([]string, 0, len(pods))
	for n := range pods {
		names = append(names, n)
	}
	sort.Strings(names)
	created := map[string]time.Time{}
	for _, n := range names {
		ctx, cancel := l.ctx()
		_, err := l.cs.CoreV1().Pods(workloadNamespace).Create(ctx, writerPod(n, podVolume[n], pods[n]), metav1.CreateOptions{})
		cancel()
		if err != nil {
			return err
		}
		created[n] = time.Now()
	}
	for _, n := range names {
		// Under TCG a stage can outlast kubelet's 2 minutes and fail once
		// (see the README), and kubelet backs off before it tries again.
		p, err := l.waitRunning(n, 10*time.Minute)
		if err != nil {
			return err
		}
		l.note("%s Running %.1fs after its creation (uid %s)", n, time.Since(created[n]).Seconds(), p.UID)
	}
	return nil
}

// ioReport reads a running pod's writer log.
func (l *Lab) ioReport(name string) (IOReport, error) {
	p, err := l.pod(name)
	if err != nil {
		return IOReport{}, err
	}
	return readWriterLog("/var/log/pods", p)
}

// ioProgress waits until every pod has done at least n more rounds than
// now, and fails on any error line or a stopped container.
func (l *Lab) ioProgress(pods []string, n int) error {
	base := map[string]int{}
	for _, p := range pods {
		r, err := l.ioReport(p)
		if err != nil {
			return err
		}
		base[p] = r.Rounds
	}
	err := l.wait(3*time.Minute, fmt.Sprintf("%d more I/O rounds in %s", n, strings.Join(pods, ", ")), func() (bool, error) {
		for _, p := range pods {
			r, err := l.ioReport(p)
			if err != nil {
				return false, err
			}
			if len(r.Errors) > 0 {
				return false, hardError{fmt.Errorf("%s: %s", p, strings.Join(r.Errors, "; "))}
			}
			if r.Rounds < base[p]+n {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	var parts []string
	for _, p := range pods {
		r, _ := l.ioReport(p)
		parts = append(parts, fmt.Sprintf("%s %d rounds", p, r.Rounds))
	}
	l.note("no I/O error; %s (256 KiB written, fsynced, read back O_DIRECT and compared per round)", strings.Join(parts, ", "))
	return l.podsUp(pods)
}

// podsUp checks that each pod's container still runs, never restarted.
func (l *Lab) podsUp(pods []string) error {
	for _, n := range pods {
		p, err := l.pod(n)
		if err != nil {
			return err
		}
		up := false
		for _, cs := range p.Status.ContainerStatuses {
			up = cs.State.Running != nil && cs.RestartCount == 0
		}
		l.check(up, "%s: %s", n, containerState(p))
	}
	return nil
}

func (l *Lab) rpcs() ([]RPC, error) { return readRPCs(filepath.Join(l.out, "pathmend.log")) }

// kubelet's paths: a filesystem volume is staged at
// plugins/kubernetes.io/csi/<driver>/<sha256 of the handle>/globalmount and
// published at pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount; a block
// volume is staged at plugins/kubernetes.io/csi/volumeDevices/staging/<pv>
// and published at plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>.
func stagingPattern(pv string, block bool) *regexp.Regexp {
	if block {
		return regexp.MustCompile("^" + regexp.QuoteMeta(kubeletDir+"/plugins/kubernetes.io/csi/volumeDevices/staging/"+pv) + "$")
	}
	return regexp.MustCompile("^" + regexp.QuoteMeta(kubeletDir+"/plugins/kubernetes.io/csi/"+driverName+"/") + "[0-9a-f]{64}/globalmount$")
}

func publishPath(pv, uid string, block bool) string {
	if block {
		return kubeletDir + "/plugins/kubernetes.io/csi/volumeDevices/publish/" + pv + "/" + uid
	}
	return kubeletDir + "/pods/" + uid + "/volumes/kubernetes.io~csi/" + pv + "/mount"
}

func (l *Lab) kubeletPaths(pods []string, handles map[string]string) error {
	rpcs, err := l.rpcs()
	if err != nil {
		return err
	}
	for _, n := range pods {
		p, err := l.pod(n)
		if err != nil {
			return err
		}
		pv := podVolume[n]
		id := handles[pv]
		block := pv == "nvme-block"
		stages := calls(rpcs, "NodeStageVolume", id)
		l.check(len(stages) > 0, "no NodeStageVolume of %s in pathmend's log", id)
		for _, s := range stages {
			st := s.Field("staging_target_path")
			l.check(stagingPattern(pv, block).MatchString(st), "NodeStageVolume %s: staging path %q is not kubelet's", id, st)
			l.check(s.Error == "" || strings.Contains(s.Error, "code = Aborted") && inFlight(rpcs, s), "NodeStageVolume %s failed: %s", id, s.Error)
			l.note("%s: NodeStageVolume staging_target_path=%s", id, st)
		}
		want := publishPath(pv, string(p.UID), block)
		found := false
		for _, pub := range calls(rpcs, "NodePublishVolume", id) {
			if pub.Field("target_path") == want {
				found = true
				l.check(pub.Error == "", "NodePublishVolume %s at %s failed: %s", id, want, pub.Error)
				l.check(stagingPattern(pv, block).MatchString(pub.Field("staging_target_path")), "NodePublishVolume %s: staging path %q", id, pub.Field("staging_target_path"))
			}
		}
		l.check(found, "no NodePublishVolume of %s at %s (pod %s)", id, want, n)
		if found {
			l.note("%s: NodePublishVolume target_path=%s", id, want)
		}
	}
	l.rpcFailures(rpcs, 0)
	return nil
}

// rpcFailures fails the step for every call after the first `from`
// entries that pathmend answered with an error, except NotFound for the
// health or stats of a volume not staged at that moment (between
// pathmend's "Staged volume" and "Unstaged volume" lines): kubelet probes
// a volume as soon as it starts to mount it, and NotFound is the answer
// the CSI spec asks for then; and Aborted for a call sent again while the
// same call on the volume was still running: kubelet gives NodeStage
// 2 minutes (csiTimeout), which an iSCSI login, mkfs and mount can take
// under TCG, then sends it again, and "operation pending for volume" is
// the spec's answer. Those are counted in a note.
func (l *Lab) rpcFailures(rpcs []RPC, from int) {
	staged := map[string]bool{}
	early, aborted := 0, 0
	for i, r := range rpcs {
		if r.Event {
			staged[r.VolumeID] = r.Method == "Staged volume"
			continue
		}
		if i < from || r.Error == "" {
			continue
		}
		if r.Method == "NodeStageVolume" && l.unstageable[r.VolumeID] {
			continue // its failure is the point (stageFails)
		}
		if strings.Contains(r.Error, "code = Aborted") && inFlight(rpcs, r) {
			aborted++
			continue
		}
		if (r.Method == "NodeGetVolumeHealth" || r.Method == "NodeGetVolumeStats") &&
			strings.Contains(r.Error, "code = NotFound") && !staged[r.VolumeID] {
			early++
			continue
		}
		l.check(false, "%s %s failed: %s (request: %s)", r.Method, r.VolumeID, r.Error, r.Request)
	}
	if early > 0 {
		l.note("%d health or stats calls for volumes not staged at the time answered NotFound", early)
	}
	if aborted > 0 {
		l.note("%d calls sent again while the same call on the volume was still running answered Aborted, as the CSI spec asks (kubelet gives NodeStage 2 minutes, then retries)", aborted)
	}
}

// countByMethod summarises calls: "NodeGetVolumeHealth 12, …".
func countByMethod(rpcs []RPC) string {
	n := map[string]int{}
	for _, r := range rpcs {
		if !r.Event {
			n[r.Method]++
		}
	}
	var keys []string
	for k := range n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(parts, ", ")
}

// nvmeController prints the controller of the lab subsystem to endpoint.
func (l *Lab) nvmeController(endpoint string) (string, error) {
	host, port, _ := strings.Cut(endpoint, ":")
	out, err := l.sh.Run(30*time.Second, fmt.Sprintf(`
for c in /sys/class/nvme/nvme*; do
	[ "$(cat "$c/subsysnqn" 2>/dev/null)" = %q ] || continue
	case $(cat "$c/address" 2>/dev/null) in traddr=%s,trsvcid=%s*) basename "$c"; exit 0 ;; esac
done
exit 1`, nqn, host, port))
	return strings.TrimSpace(out), err
}

func (l *Lab) nvmeBreak() error {
	c, err := l.nvmeController(nvmeB)
	if err != nil {
		return fmt.Errorf("no controller to %s: %w", nvmeB, err)
	}
	if _, err := l.sh.Run(time.Minute, fmt.Sprintf(`
nvmet_port_unlink 2 %[1]q
nvme_wait_state %[2]s connecting 30
nvme_host_delete %[2]s
lab_wait 20 "%[2]s deleted" sh -c '! test -e /sys/class/nvme/%[2]s'`, nqn, c)); err != nil {
		return err
	}
	l.note("%s (to %s) went connecting when its port was unlinked, then was deleted: the kernel will not reconnect it", c, nvmeB)
	return l.expectDegraded([]string{podNVMeFS, podNVMeBlock}, nqn)
}

// expectDegraded waits until kubelet reports Degraded for each pod's
// volume and StorageDegraded for the backend in CSINode, and checks the
// containers' I/O goes on.
func (l *Lab) expectDegraded(pods []string, backend string) error {
	t0 := time.Now()
	seen, err := l.waitVolumeHealth(pods, "Degraded in the pods' volume health", 2*time.Minute, hasVolumeStatus(corev1.VolumeHealthDegraded))
	for _, p := range pods {
		l.note("%s status.volumeHealth[data]: %s", p, describeVolumeHealth(seen[p]))
	}
	if err != nil {
		return err
	}
	l.note("kubelet wrote Degraded %.1fs after the fault", time.Since(t0).Seconds())
	sh, err := l.waitStorageHealth("StorageDegraded naming "+backend+" in CSINode", time.Minute, storageCondition(storagev1.StorageDegraded, backend))
	l.note("CSINode %s status.storageHealth[%s]: %s", nodeName, driverName, describeStorageHealth(sh))
	l.check(err == nil, "CSINode storage health: %v", err)
	return l.ioProgress(pods, 2)
}

// expectHealthy waits until kubelet reports the pods' volumes healthy and
// CSINode names the backend no more, and checks the I/O had no error.
func (l *Lab) expectHealthy(pods []string, backend string, since time.Time) error {
	seen, err := l.waitVolumeHealth(pods, "no condition in the pods' volume health", 3*time.Minute, volumeHealthy)
	for _, p := range pods {
		l.note("%s status.volumeHealth[data]: %s", p, describeVolumeHealth(seen[p]))
	}
	if err != nil {
		return err
	}
	l.note("kubelet cleared the condition %.1fs after the repair began", time.Since(since).Seconds())
	sh, err := l.waitStorageHealth("no condition naming "+backend+" in CSINode", time.Minute, storageClear(backend))
	l.note("CSINode status.storageHealth[%s]: %s", driverName, describeStorageHealth(sh))
	l.check(err == nil, "CSINode storage health: %v", err)
	return l.ioProgress(pods, 2)
}

func (l *Lab) nvmeHeal() error {
	t0 := time.Now()
	if _, err := l.sh.Run(time.Minute, fmt.Sprintf("nvmet_port_link 2 %q", nqn)); err != nil {
		return err
	}
	if err := l.wait(2*time.Minute, "pathmend to reconnect "+nvmeB, func() (bool, error) {
		c, err := l.nvmeController(nvmeB)
		if err != nil || c == "" {
			return false, nil
		}
		b, err := os.ReadFile("/sys/class/nvme/" + c + "/state")
		return err == nil && strings.TrimSpace(string(b)) == "live", nil
	}); err != nil {
		return err
	}
	c, _ := l.nvmeController(nvmeB)
	// The kernel deleted the controller and never reconnects one it has
	// deleted: pathmend must have.
	reconnects, err := l.waitLines("Reconnected path", `"endpoint":"`+nvmeB+`"`)
	l.check(err == nil, "%s is live again but pathmend logged no \"Reconnected path\" to it: %v", nvmeB, err)
	l.note("%s live to %s %.1fs after the port came back; pathmend: %s", c, nvmeB, time.Since(t0).Seconds(),
		strings.Join(reconnects, " | "))
	return l.expectHealthy([]string{podNVMeFS, podNVMeBlock}, nqn, t0)
}

// linesWith returns the lines that contain every one of subs.
func linesWith(lines []string, subs ...string) []string {
	var out []string
next:
	for _, line := range lines {
		for _, s := range subs {
			if !strings.Contains(line, s) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// waitLines waits for pathmend's log lines with message msg that hold
// every one of subs. pathmend logs what it did after the kernel shows it
// (the lab has shown up to 3 s between the two): a step that saw the
// kernel's state waits for the line, with a deadline 40 times that.
func (l *Lab) waitLines(msg string, subs ...string) ([]string, error) {
	var lines []string
	err := l.wait(2*time.Minute, fmt.Sprintf("pathmend's %q line with %s", msg, strings.Join(subs, ", ")), func() (bool, error) {
		lines = linesWith(l.pathmendLines(msg), subs...)
		return len(lines) > 0, nil
	})
	return lines, err
}

// pathmendLines returns pathmend's log lines (JSON) whose msg is msg.
func (l *Lab) pathmendLines(msg string) []string {
	b, err := os.ReadFile(filepath.Join(l.out, "pathmend.log"))
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, `"msg":"`+msg+`"`) {
			out = append(out, line)
		}
	}
	return out
}

func (l *Lab) iscsiSession(portal string) (string, error) {
	out, err := l.sh.Run(30*time.Second, fmt.Sprintf("iscsi_session_of %q %q", iqn, portal))
	return strings.TrimSpace(out), err
}

func (l *Lab) iscsiBreak() error {
	s, err := l.iscsiSession(proxied)
	if err != nil {
		return fmt.Errorf("no session through %s: %w", proxied, err)
	}
	var stuck bool
	for attempt := 1; attempt <= 3 && !stuck; attempt++ {
		out, err := l.sh.Run(5*time.Minute, fmt.Sprintf(`lab_say() { echo "$*"; }
if iscsi_make_stuck %[1]s; then echo STUCK; else
	lab_wait 60 "%[1]s back in LOGGED_IN" iscsi_state_is %[1]s LOGGED_IN || true
fi`, s))
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if line != "" && line != "STUCK" {
				l.note("attempt %d: %s", attempt, line)
			}
		}
		if err != nil {
			return err
		}
		stuck = strings.Contains(out, "STUCK")
		if !stuck && attempt < 3 {
			l.retried("attempt %d at the stuck iSCSI session lost the race (iscsid relogged %s in by itself)", attempt, s)
		}
	}
	if !stuck {
		return fmt.Errorf("iscsid relogged %s in by itself in 3 attempts: the stuck state (a race) was not reached", s)
	}
	return l.expectDegraded([]string{podISCSI}, iqn)
}

func (l *Lab) iscsiHeal() error {
	t0 := time.Now()
	var session string
	if err := l.wait(4*time.Minute, "a LOGGED_IN session through "+proxied, func() (bool, error) {
		s, err := l.iscsiSession(proxied)
		if err != nil || s == "" {
			return false, nil
		}
		b, err := os.ReadFile("/sys/class/iscsi_session/" + s + "/state")
		session = s
		return err == nil && strings.TrimSpace(string(b)) == "LOGGED_IN", nil
	}); err != nil {
		return err
	}
	up := time.Since(t0)
	// iscsid never brings a #387-stuck session back by itself: pathmend
	// must have kicked it. Its "repaired" verdict names the new session
	// and comes once pathmend has read it LOGGED_IN.
	kicks, err := l.waitLines("iSCSI session verdict", `"portal":"`+proxied+`"`,
		`"result":"LOGGED_IN"`, `"newSession":"`+session+`"`)
	l.check(err == nil, "the session through %s (%s) is LOGGED_IN again but pathmend logged no verdict that brought it back: %v", proxied, session, err)
	l.note("session through %s (%s) LOGGED_IN %.1fs into this step, pathmend's verdict %.1fs later: %s", proxied, session,
		up.Seconds(), (time.Since(t0) - up).Seconds(), strings.Join(kicks, " | "))
	return l.expectHealthy([]string{podISCSI}, iqn, t0)
}

func (l *Lab) secondPod(handle string) error {
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	if err := l.startPods(map[string]bool{podNVMeFS2: false}); err != nil {
		return err
	}
	if err := l.ioProgress([]string{podNVMeFS, podNVMeFS2}, 3); err != nil {
		return err
	}
	after, err := l.rpcs()
	if err != nil {
		return err
	}
	p, err := l.pod(podNVMeFS2)
	if err != nil {
		return err
	}
	want := publishPath("nvme-fs", string(p.UID), false)
	// kubelet publishes the second pod from the staging mount it already
	// has: the same staging path as the first pod's.
	var staging string
	for _, r := range calls(before, "NodeStageVolume", handle) {
		if r.Done > 0 && r.Error == "" {
			staging = r.Field("staging_target_path")
		}
	}
	found := false
	for _, r := range calls(after[len(before):], "NodePublishVolume", handle) {
		if r.Field("target_path") == want {
			found = true
			l.check(r.Field("staging_target_path") == staging && staging != "", "NodePublishVolume %s at %s from staging path %q, the volume is staged at %q", handle, want, r.Field("staging_target_path"), staging)
		}
	}
	l.check(found, "no NodePublishVolume of %s at %s", handle, want)
	stages := calls(after[len(before):], "NodeStageVolume", handle)
	l.note("calls for the second pod: %s; NodeStageVolume of %s again: %d (kubelet reuses a device it has staged)", countByMethod(after[len(before):]), handle, len(stages))
	l.rpcFailures(after, len(before))
	return nil
}

// registrations counts the registrar's "kubelet registered" lines.
func (l *Lab) registrations() int {
	b, _ := os.ReadFile(filepath.Join(l.out, "labregistrar.log"))
	return strings.Count(string(b), "kubelet registered")
}

func (l *Lab) kubeletRestart() error {
	pods := []string{podNVMeFS, podNVMeBlock, podISCSI, podNVMeFS2}
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	containers := map[string]string{}
	for _, n := range pods {
		p, err := l.pod(n)
		if err != nil {
			return err
		}
		for _, cs := range p.Status.ContainerStatuses {
			containers[n] = cs.ContainerID
		}
	}
	regs := l.registrations()
	t0 := time.Now()
	if err := l.stop("kubelet", 30*time.Second); err != nil {
		return err
	}
	l.note("kubelet stopped in %.1fs (SIGTERM)", time.Since(t0).Seconds())
	time.Sleep(3 * time.Second)
	t1 := time.Now()
	if err := l.start("kubelet", l.kubeletArgs()...); err != nil {
		return err
	}
	// The new kubelet starts as slowly as the first (startLimit: under
	// load it logged nothing for 3.6 minutes); idle this took 19 s.
	if err := l.wait(startLimit, "kubelet to register pathmend again", func() (bool, error) {
		return l.registrations() > regs, nil
	}); err != nil {
		return err
	}
	l.note("pathmend registered again %.1fs after kubelet started", time.Since(t1).Seconds())
	// Reconstruction marks every device mount and volume mount it finds
	// uncertain (pkg/kubelet/volumemanager/reconciler/reconstruct.go), so
	// the new kubelet stages and publishes each volume again: pathmend's
	// NodeStage of a volume it has staged must answer OK (idempotent), and
	// each pod's NodePublish at the same target path too.
	stagedVols := []string{"lab-nvme-ns1", "lab-nvme-ns2", "lab-iscsi-lun0"}
	targets := map[string]string{}
	for _, n := range pods {
		p, err := l.pod(n)
		if err != nil {
			return err
		}
		pv := podVolume[n]
		targets[publishPath(pv, string(p.UID), pv == "nvme-block")] = handleOf(pv)
	}
	var missing []string
	if err := l.wait(5*time.Minute, "the new kubelet's NodeStage of every volume and NodePublish of every pod", func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		missing = notRedone(rpcs[len(before):], stagedVols, targets)
		return len(missing) == 0, nil
	}); err != nil {
		return fmt.Errorf("%w (missing: %s)", err, strings.Join(missing, "; "))
	}
	l.note("the new kubelet sent NodeStageVolume for every volume again (each answered OK) and NodePublishVolume for every pod at its old target path")
	if err := l.wait(3*time.Minute, "a NodeGetVolumeHealth from the new kubelet for every volume", func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, r := range calls(rpcs[len(before):], "NodeGetVolumeHealth", "") {
			seen[r.VolumeID] = true
		}
		return len(seen) >= 3, nil
	}); err != nil {
		return err
	}
	if err := l.ioProgress(pods, 3); err != nil {
		return err
	}
	for _, n := range pods {
		p, err := l.pod(n)
		if err != nil {
			return err
		}
		for _, cs := range p.Status.ContainerStatuses {
			l.check(cs.ContainerID == containers[n], "%s: container %s after the restart, %s before", n, cs.ContainerID, containers[n])
		}
	}
	after, err := l.rpcs()
	if err != nil {
		return err
	}
	l.note("calls from the restarted kubelet so far: %s", countByMethod(after[len(before):]))
	for _, v := range stagedVols {
		l.note("%s after the restart: NodeStageVolume %d, NodePublishVolume %d", v,
			len(calls(after[len(before):], "NodeStageVolume", v)), len(calls(after[len(before):], "NodePublishVolume", v)))
	}
	l.rpcFailures(after, len(before))
	return nil
}

func (l *Lab) nvmeBlip() error {
	if _, err := l.sh.Run(time.Minute, fmt.Sprintf("nvmet_port_unlink 2 %q", nqn)); err != nil {
		return err
	}
	if err := l.expectDegraded([]string{podNVMeFS, podNVMeBlock, podNVMeFS2}, nqn); err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := l.sh.Run(time.Minute, fmt.Sprintf("nvmet_port_link 2 %q", nqn)); err != nil {
		return err
	}
	return l.expectHealthy([]string{podNVMeFS, podNVMeBlock, podNVMeFS2}, nqn, t0)
}

func (l *Lab) deletePods(handles map[string]string) error {
	pods := []string{podNVMeFS, podNVMeBlock, podISCSI, podNVMeFS2}
	for _, n := range pods {
		r, err := l.ioReport(n)
		if err != nil {
			return err
		}
		l.check(len(r.Errors) == 0, "%s: %s", n, strings.Join(r.Errors, "; "))
		l.note("%s over its life: %d rounds, last %d, %d errors", n, r.Rounds, r.Last, len(r.Errors))
	}
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	t0 := time.Now()
	for _, n := range pods {
		ctx, cancel := l.ctx()
		err := l.cs.CoreV1().Pods(workloadNamespace).Delete(ctx, n, metav1.DeleteOptions{})
		cancel()
		if err != nil {
			return err
		}
	}
	if err := l.wait(5*time.Minute, "the pods gone", func() (bool, error) {
		ctx, cancel := l.ctx()
		defer cancel()
		list, err := l.cs.CoreV1().Pods(workloadNamespace).List(ctx, metav1.ListOptions{})
		return err == nil && len(list.Items) == 0, err
	}); err != nil {
		return err
	}
	l.note("pods gone %.1fs after the delete", time.Since(t0).Seconds())
	if err := l.wait(5*time.Minute, "NodeUnstageVolume of every volume", func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		for pv, h := range handles {
			if pv == "nvme-empty" {
				continue // unstaged in its own step
			}
			if len(calls(rpcs[len(before):], "NodeUnstageVolume", h)) == 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return err
	}
	after, err := l.rpcs()
	if err != nil {
		return err
	}
	l.note("calls after the delete: %s", countByMethod(after[len(before):]))
	l.rpcFailures(after, len(before))
	return nil
}

// nodeClean checks that nothing of the volumes is left: no NVMe controller
// of the subsystem, no iSCSI session to the target, no iscsiadm node
// record of it, no multipath map, no kubelet CSI mount, no pathmend
// record.
func (l *Lab) nodeClean() error {
	err := l.wait(2*time.Minute, "the kernel to drop the volumes' controllers and sessions", func() (bool, error) {
		out, err := l.sh.Run(30*time.Second, fmt.Sprintf(`
left=
for c in /sys/class/nvme/nvme*; do case $(cat "$c/subsysnqn" 2>/dev/null) in %q|%q) left="$left controller:$(basename "$c")" ;; esac; done
for s in /sys/class/iscsi_session/session*; do [ "$(cat "$s/targetname" 2>/dev/null)" = %q ] && left="$left session:$(basename "$s")"; done
echo "$left"`, nqn, emptyNQN, iqn))
		return err == nil && strings.TrimSpace(out) == "", err
	})
	if err != nil {
		return err
	}
	out, _ := command("iscsiadm", "-m", "node", "-T", iqn)
	l.check(strings.Contains(out, "No records found"), "iscsiadm node records of %s left: %s", iqn, strings.TrimSpace(out))
	out, _ = command("dmsetup", "ls", "--target", "multipath")
	l.check(strings.Contains(out, "No devices found") || strings.TrimSpace(out) == "", "multipath maps left: %s", strings.TrimSpace(out))
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		l.check(!strings.Contains(line, "kubernetes.io/csi") && !strings.Contains(line, "kubernetes.io~csi"), "mount left: %s", line)
	}
	recs, _ := filepath.Glob("/var/lib/pathmend/volumes/*.json")
	l.check(len(recs) == 0, "pathmend records left: %v", recs)
	loops, _ := command("losetup", "-a")
	for _, line := range strings.Split(loops, "\n") {
		l.check(!strings.Contains(line, "/dev/nvme") && !strings.Contains(line, "/dev/dm-"), "loop device over a volume left: %s", line)
	}
	l.note("no controller of %s, no session to %s, no node record, no multipath map, no CSI mount, no record in /var/lib/pathmend", nqn, iqn)
	return nil
}

// stageFails: a pod on a volume whose subsystem exports no namespace.
// pathmend's NodeStage connects, finds no namespace, repairs once, fails
// and detaches what it attached; kubelet retries. The pod is deleted
// while its mount is uncertain: kubelet calls NodeUnstage for it, pathmend
// answers OK, and no controller of the subsystem is left.
func (l *Lab) stageFails(handle string) error {
	l.unstageable[handle] = true
	before, err := l.rpcs()
	if err != nil {
		return err
	}
	ctx, cancel := l.ctx()
	_, err = l.cs.CoreV1().Pods(workloadNamespace).Create(ctx, writerPod(podNVMeEmpty, podVolume[podNVMeEmpty], false), metav1.CreateOptions{})
	cancel()
	if err != nil {
		return err
	}
	var failed RPC
	if err := l.wait(4*time.Minute, "a failed NodeStageVolume of "+handle, func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		for _, r := range calls(rpcs[len(before):], "NodeStageVolume", handle) {
			if r.Error != "" {
				failed = r
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		return err
	}
	l.note("NodeStageVolume %s failed as it should: %s", handle, failed.Error)
	p, err := l.pod(podNVMeEmpty)
	if err != nil {
		return err
	}
	l.check(p.Status.Phase == corev1.PodPending, "%s is %s, want Pending", podNVMeEmpty, p.Status.Phase)
	t0 := time.Now()
	ctx, cancel = l.ctx()
	err = l.cs.CoreV1().Pods(workloadNamespace).Delete(ctx, podNVMeEmpty, metav1.DeleteOptions{})
	cancel()
	if err != nil {
		return err
	}
	var unstage RPC
	if err := l.wait(5*time.Minute, "kubelet's NodeUnstageVolume of "+handle, func() (bool, error) {
		rpcs, err := l.rpcs()
		if err != nil {
			return false, err
		}
		us := calls(rpcs[len(before):], "NodeUnstageVolume", handle)
		if len(us) == 0 {
			return false, nil
		}
		unstage = us[len(us)-1]
		return true, nil
	}); err != nil {
		return err
	}
	l.check(unstage.Error == "", "NodeUnstageVolume %s after a failed stage: %s", handle, unstage.Error)
	l.note("kubelet called NodeUnstageVolume for the uncertain mount %.1fs after the delete (staging_target_path=%s): %s",
		time.Since(t0).Seconds(), unstage.Field("staging_target_path"), map[bool]string{true: "OK", false: unstage.Error}[unstage.Error == ""])
	after, err := l.rpcs()
	if err != nil {
		return err
	}
	stages := calls(after[len(before):], "NodeStageVolume", handle)
	l.note("NodeStageVolume of %s: %d attempts, every one failed: %v", handle, len(stages), allFailed(stages))
	out, err := l.sh.Run(time.Minute, fmt.Sprintf(`lab_wait 30 "no controller of %[1]s" sh -c 'for c in /sys/class/nvme/nvme*; do [ "$(cat "$c/subsysnqn" 2>/dev/null)" = %[1]q ] && exit 1; done; exit 0'`, emptyNQN))
	l.check(err == nil, "controllers of %s left after the failed stages: %v %s", emptyNQN, err, out)
	recs, _ := filepath.Glob("/var/lib/pathmend/volumes/*.json")
	l.note("no controller of %s left; %d pathmend records (the volumes still in use)", emptyNQN, len(recs))
	return nil
}

// notRedone names what a restarted kubelet has not yet done again: a
// volume of stages with no NodeStageVolume that ended in pathmend's
// "Staged volume" or "Volume already staged", a target path of targets
// (path → volume ID) with no NodePublishVolume there. A call that failed
// does not count.
func notRedone(rpcs []RPC, stages []string, targets map[string]string) []string {
	var missing []string
	for _, v := range stages {
		ok := false
		for _, r := range calls(rpcs, "NodeStageVolume", v) {
			ok = ok || r.Done > 0 && r.Error == ""
		}
		if !ok {
			missing = append(missing, "NodeStageVolume "+v)
		}
	}
	paths := make([]string, 0, len(targets))
	for p := range targets {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		ok := false
		for _, r := range calls(rpcs, "NodePublishVolume", targets[p]) {
			ok = ok || r.Field("target_path") == p && r.Error == ""
		}
		if !ok {
			missing = append(missing, "NodePublishVolume "+targets[p]+" at "+p)
		}
	}
	return missing
}

func allFailed(rs []RPC) bool {
	for _, r := range rs {
		if r.Error == "" {
			return false
		}
	}
	return len(rs) > 0
}
