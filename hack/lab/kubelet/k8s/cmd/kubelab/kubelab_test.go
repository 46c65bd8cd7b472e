package main

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// repoRoot is the pathmend checkout this nested module lives in.
const repoRoot = "../../../../../.."

// Lines as `pathmend serve --logging-format=json -v=5` writes them (the
// request is protosanitizer's JSON of the request, secrets stripped).
const pathmendLog = `{"ts":1796162400000.000,"caller":"driver/interceptor.go:20","msg":"RPC","v":4,"method":"/csi.v1.Node/NodeStageVolume","volumeID":"lab-nvme-ns1"}
{"ts":1796162400000.100,"caller":"driver/interceptor.go:22","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"staging_target_path\":\"/var/lib/kubelet/plugins/kubernetes.io/csi/csi.pathmend.io/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/globalmount\",\"volume_capability\":{\"AccessType\":{\"Mount\":{\"fs_type\":\"ext4\"}}},\"volume_id\":\"lab-nvme-ns1\",\"secrets\":\"***stripped***\"}"}
not json at all
{"ts":1796162400900.000,"caller":"driver/node_stage.go:122","msg":"Staged volume","v":2,"volumeID":"lab-nvme-ns1","stagingPath":"/s","accessType":"mount","fsType":"ext4","device":"/dev/nvme0n1"}
{"ts":1796162401000.000,"caller":"driver/interceptor.go:22","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodePublishVolume","request":"{\"staging_target_path\":\"/s\",\"target_path\":\"/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/nvme-fs/mount\",\"volume_id\":\"lab-nvme-ns1\"}"}
{"ts":1796162402000.000,"caller":"driver/interceptor.go:22","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeGetVolumeHealth","request":"{\"volume_id\":\"lab-nvme-ns2\",\"volume_publish_path\":\"/p\"}"}
{"ts":1796162402100.000,"caller":"driver/interceptor.go:28","msg":"RPC failed","err":"rpc error: code = NotFound desc = volume lab-nvme-ns2 is not staged or published at /p","method":"/csi.v1.Node/NodeGetVolumeHealth","volumeID":"lab-nvme-ns2"}
`

func TestReadRPCs_RequestsWithTheirFailures(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pathmend.log")
	if err := os.WriteFile(p, []byte(pathmendLog), 0o644); err != nil {
		t.Fatal(err)
	}
	rpcs, err := readRPCs(p)
	if err != nil {
		t.Fatal(err)
	}
	type got struct{ Method, VolumeID, Staging, Target, Error string }
	var gs []got
	for _, r := range rpcs {
		if r.Event {
			if r.Method != "Staged volume" || r.VolumeID != "lab-nvme-ns1" {
				t.Errorf("event %+v, want lab-nvme-ns1 staged", r)
			}
			continue
		}
		gs = append(gs, got{r.Method, r.VolumeID, r.Field("staging_target_path"), r.Field("target_path"), r.Error})
	}
	want := []got{
		{"NodeStageVolume", "lab-nvme-ns1", "/var/lib/kubelet/plugins/kubernetes.io/csi/csi.pathmend.io/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef/globalmount", "", ""},
		{"NodePublishVolume", "lab-nvme-ns1", "/s", "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/nvme-fs/mount", ""},
		{"NodeGetVolumeHealth", "lab-nvme-ns2", "", "", "rpc error: code = NotFound desc = volume lab-nvme-ns2 is not staged or published at /p"},
	}
	if diff := cmp.Diff(want, gs); diff != "" {
		t.Errorf("RPCs (-want +got):\n%s", diff)
	}
	if !stagingPattern("nvme-fs", false).MatchString(gs[0].Staging) {
		t.Errorf("kubelet's filesystem staging path %q does not match the pattern", gs[0].Staging)
	}
	if got := countByMethod(rpcs); got != "NodeGetVolumeHealth 1, NodePublishVolume 1, NodeStageVolume 1" {
		t.Errorf("countByMethod = %q", got)
	}
	if n := len(calls(rpcs, "NodePublishVolume", "lab-nvme-ns1")); n != 1 {
		t.Errorf("calls(NodePublishVolume, lab-nvme-ns1) = %d, want 1", n)
	}
}

// What the lab saw under load: kubelet's NodeStage of the iSCSI volume
// ran past kubelet's 2 minutes, kubelet sent it again twice while it ran
// (Aborted), the first finished, and the third found it staged.
const retriedStageLog = `{"ts":1796162400000.000,"caller":"driver/interceptor.go:26","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"volume_id\":\"lab-iscsi-lun0\"}"}
{"ts":1796162520000.000,"caller":"driver/interceptor.go:26","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"volume_id\":\"lab-iscsi-lun0\"}"}
{"ts":1796162520100.000,"caller":"driver/interceptor.go:31","msg":"RPC failed","method":"/csi.v1.Node/NodeStageVolume","volumeID":"lab-iscsi-lun0","err":"rpc error: code = Aborted desc = an operation on volume lab-iscsi-lun0 is already in progress (a CSI call)"}
{"ts":1796162539000.000,"caller":"driver/interceptor.go:26","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"volume_id\":\"lab-iscsi-lun0\"}"}
{"ts":1796162539500.000,"caller":"driver/node_stage.go:131","msg":"Staged volume","v":2,"volumeID":"lab-iscsi-lun0"}
{"ts":1796162539100.000,"caller":"driver/interceptor.go:31","msg":"RPC failed","method":"/csi.v1.Node/NodeStageVolume","volumeID":"lab-iscsi-lun0","err":"rpc error: code = Aborted desc = an operation on volume lab-iscsi-lun0 is already in progress (a CSI call)"}
{"ts":1796162544000.000,"caller":"driver/interceptor.go:26","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"volume_id\":\"lab-iscsi-lun0\"}"}
{"ts":1796162544300.000,"caller":"driver/node_stage.go:83","msg":"Volume already staged","v":4,"volumeID":"lab-iscsi-lun0"}
{"ts":1796162550000.000,"caller":"driver/interceptor.go:26","msg":"RPC request","v":5,"method":"/csi.v1.Node/NodeStageVolume","request":"{\"volume_id\":\"lab-iscsi-lun0\"}"}
{"ts":1796162550100.000,"caller":"driver/interceptor.go:31","msg":"RPC failed","method":"/csi.v1.Node/NodeStageVolume","volumeID":"lab-iscsi-lun0","err":"rpc error: code = Aborted desc = an operation on volume lab-iscsi-lun0 is already in progress (a CSI call)"}
`

func TestInFlight_AbortedOnlyWhileTheSameCallRuns(t *testing.T) {
	p := filepath.Join(t.TempDir(), "pathmend.log")
	if err := os.WriteFile(p, []byte(retriedStageLog), 0o644); err != nil {
		t.Fatal(err)
	}
	rpcs, err := readRPCs(p)
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		Line, Done int
		Aborted    bool
		InFlight   bool
	}
	var gs []got
	for _, r := range calls(rpcs, "NodeStageVolume", "lab-iscsi-lun0") {
		gs = append(gs, got{r.Line, r.Done, strings.Contains(r.Error, "code = Aborted"), inFlight(rpcs, r)})
	}
	want := []got{
		{Line: 1, Done: 5}, // did the work
		{Line: 2, Done: 3, Aborted: true, InFlight: true}, // the first still running
		{Line: 4, Done: 6, Aborted: true, InFlight: true}, // its answer came after the first ended
		{Line: 7, Done: 8}, // already staged
		{Line: 9, Done: 10, Aborted: true, InFlight: false}, // nothing running: a real failure
	}
	if diff := cmp.Diff(want, gs); diff != "" {
		t.Errorf("NodeStageVolume calls (-want +got):\n%s", diff)
	}
}

func TestStagingAndPublishPaths_AreKubeletsLayout(t *testing.T) {
	if !stagingPattern("nvme-block", true).MatchString("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/nvme-block") {
		t.Error("block staging path does not match")
	}
	if stagingPattern("nvme-block", true).MatchString("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/nvme-block-2") {
		t.Error("block staging pattern matches another PV")
	}
	if stagingPattern("nvme-fs", false).MatchString("/var/lib/kubelet/plugins/kubernetes.io/csi/csi.pathmend.io/xyz/globalmount") {
		t.Error("filesystem staging pattern matches a path without kubelet's SHA-256 directory")
	}
	if got := publishPath("nvme-block", "u1", true); got != "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/nvme-block/u1" {
		t.Errorf("block publish path %q", got)
	}
}

func TestReadWriterLog_CountsRoundsAndErrors(t *testing.T) {
	dir := t.TempDir()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w", UID: types.UID("u1")}}
	logDir := filepath.Join(dir, "default_w_u1", "writer")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	log := strings.Join([]string{
		"2026-12-01T22:00:00.1Z stdout F ok 1 aaaa",
		"2026-12-01T22:00:01.1Z stdout F ok 2 bbbb",
		"2026-12-01T22:00:02.1Z stdout F ERROR round 3: write: dd: I/O error",
		"2026-12-01T22:00:02.2Z stderr F something else",
	}, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(logDir, "0.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := readWriterLog(dir, pod)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(IOReport{Rounds: 2, Last: 2, Errors: []string{"ERROR round 3: write: dd: I/O error"}}, r); diff != "" {
		t.Errorf("IOReport (-want +got):\n%s", diff)
	}
	if _, err := readWriterLog(t.TempDir(), pod); err == nil {
		t.Error("a pod with no container log gave no error")
	}
}

func TestVolumes_AdaptTheExamples(t *testing.T) {
	claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "nvme-block", UID: "c1"}}
	for _, v := range labVolumes() {
		pv, err := v.PV(filepath.Join(repoRoot, "deploy", "examples"), claim)
		if err != nil {
			t.Fatal(err)
		}
		if pv.Spec.CSI.Driver != driverName || pv.Spec.CSI.VolumeHandle != v.Handle || *pv.Spec.VolumeMode != v.Mode {
			t.Errorf("%s: driver %s handle %s mode %s", v.Name, pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle, *pv.Spec.VolumeMode)
		}
		if diff := cmp.Diff(v.Attributes, pv.Spec.CSI.VolumeAttributes); diff != "" {
			t.Errorf("%s: attributes (-want +got):\n%s", v.Name, diff)
		}
		if pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.UID != claim.UID {
			t.Errorf("%s: claimRef %+v, want the claim's UID", v.Name, pv.Spec.ClaimRef)
		}
		if (v.Secret == nil) != (pv.Spec.CSI.NodeStageSecretRef == nil) {
			t.Errorf("%s: node-stage secret ref %+v", v.Name, pv.Spec.CSI.NodeStageSecretRef)
		}
		pvc := v.PVC()
		if pvc.Spec.VolumeName != v.Name || *pvc.Spec.StorageClassName != "" {
			t.Errorf("%s: PVC names %q, class %q", v.Name, pvc.Spec.VolumeName, *pvc.Spec.StorageClassName)
		}
	}
	d, err := csiDriver(filepath.Join(repoRoot, "deploy", "base", "csidriver.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if d.Spec.AttachRequired == nil || *d.Spec.AttachRequired {
		t.Error("the CSIDriver asks for attach: without a controller manager no VolumeAttachment would ever be made")
	}
}

func TestWriterPod_NeedsNoControllerNoCNINoRegistry(t *testing.T) {
	for _, block := range []bool{false, true} {
		p := writerPod("w", "c", block)
		c := p.Spec.Containers[0]
		if p.Spec.NodeName != nodeName || !p.Spec.HostNetwork || *p.Spec.AutomountServiceAccountToken || c.ImagePullPolicy != corev1.PullNever {
			t.Errorf("block=%v: nodeName %q hostNetwork %v token %v pull %s", block, p.Spec.NodeName, p.Spec.HostNetwork, *p.Spec.AutomountServiceAccountToken, c.ImagePullPolicy)
		}
		if block != (len(c.VolumeDevices) == 1) || block == (len(c.VolumeMounts) == 1) {
			t.Errorf("block=%v: devices %v mounts %v", block, c.VolumeDevices, c.VolumeMounts)
		}
	}
}

func TestPKI_ServingCertificateVerifiesForTheNode(t *testing.T) {
	dir := t.TempDir()
	p, err := newPKI(dir, []net.IP{net.ParseIP(nodeIP)})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(p.CACert) {
		t.Fatal("CA certificate does not parse")
	}
	b, err := os.ReadFile(p.Path(apiserverCrtFile))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{nodeIP, "kubernetes.default.svc"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("serving certificate for %s: %v", name, err)
		}
	}
	tokens, err := os.ReadFile(p.Path(tokensFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{p.AdminToken + ",lab-admin,", p.KubeletToken + ",system:node:" + nodeName + ",", `"system:nodes"`} {
		if !strings.Contains(string(tokens), want) {
			t.Errorf("token file lacks %q:\n%s", want, tokens)
		}
	}
	if p.AdminToken == p.KubeletToken {
		t.Error("two clients share a token")
	}
}

func TestRPCFailures_NotFoundBeforeStagingIsNoFailure(t *testing.T) {
	nf := "rpc error: code = NotFound desc = volume v is not staged on this node"
	rpcs := []RPC{
		{Method: "NodeGetVolumeHealth", VolumeID: "v", Error: nf},
		{Method: "NodeStageVolume", VolumeID: "v"},
		// Asked while the stage runs: pathmend has no record yet.
		{Method: "NodeGetVolumeHealth", VolumeID: "v", Error: nf},
		{Event: true, Method: "Staged volume", VolumeID: "v"},
		{Method: "NodeGetVolumeHealth", VolumeID: "v"},
		{Method: "NodeUnstageVolume", VolumeID: "v"},
		{Event: true, Method: "Unstaged volume", VolumeID: "v"},
		{Method: "NodeGetVolumeStats", VolumeID: "v", Error: nf},
	}
	l := newLab(t.TempDir(), t.TempDir())
	l.cur = &Step{}
	l.rpcFailures(rpcs, 0)
	if len(l.cur.Failures) != 0 {
		t.Errorf("failures %q, want none: the volume was not staged at either NotFound", l.cur.Failures)
	}
	staged := append(rpcs[:5:5], RPC{Method: "NodeGetVolumeHealth", VolumeID: "v", Error: nf}, RPC{Method: "NodePublishVolume", VolumeID: "v", Error: "rpc error: code = Internal desc = x"})
	l.cur = &Step{}
	l.rpcFailures(staged, 0)
	if len(l.cur.Failures) != 2 {
		t.Errorf("failures %q, want 2: NotFound for a staged volume and the failed publish", l.cur.Failures)
	}
	l.cur = &Step{}
	l.rpcFailures(staged, len(staged))
	if len(l.cur.Failures) != 0 {
		t.Errorf("failures before `from` counted: %q", l.cur.Failures)
	}
}

// What the restarted kubelet sent in the lab: reconstruction marks every
// mount uncertain, so each volume is staged and each pod published again.
func TestNotRedone_NamesTheStagesAndPublishesStillOwed(t *testing.T) {
	req := func(vol, target string) string {
		return `{"volume_id":"` + vol + `","target_path":"` + target + `"}`
	}
	targets := map[string]string{"/pods/a/mount": "fs", "/pods/b/mount": "fs", "/publish/blk/c": "blk"}
	rpcs := []RPC{
		{Method: "NodeStageVolume", VolumeID: "fs", Request: req("fs", ""), Done: 2},
		{Method: "NodeStageVolume", VolumeID: "blk", Request: req("blk", ""), Done: 3, Error: "rpc error: code = Internal desc = x"},
		{Method: "NodeStageVolume", VolumeID: "iscsi", Request: req("iscsi", "")}, // still running
		{Method: "NodePublishVolume", VolumeID: "fs", Request: req("fs", "/pods/a/mount")},
		{Method: "NodePublishVolume", VolumeID: "blk", Request: req("blk", "/publish/blk/c"), Error: "rpc error: code = Internal desc = x"},
	}
	want := []string{
		"NodeStageVolume blk",
		"NodeStageVolume iscsi",
		"NodePublishVolume fs at /pods/b/mount",
		"NodePublishVolume blk at /publish/blk/c",
	}
	if diff := cmp.Diff(want, notRedone(rpcs, []string{"fs", "blk", "iscsi"}, targets)); diff != "" {
		t.Errorf("notRedone (-want +got):\n%s", diff)
	}
	done := append(rpcs,
		RPC{Method: "NodeStageVolume", VolumeID: "blk", Request: req("blk", ""), Done: 9},
		RPC{Method: "NodeStageVolume", VolumeID: "iscsi", Request: req("iscsi", ""), Done: 10},
		RPC{Method: "NodePublishVolume", VolumeID: "fs", Request: req("fs", "/pods/b/mount")},
		RPC{Method: "NodePublishVolume", VolumeID: "blk", Request: req("blk", "/publish/blk/c")},
	)
	if got := notRedone(done, []string{"fs", "blk", "iscsi"}, targets); len(got) != 0 {
		t.Errorf("notRedone = %q, want nothing owed", got)
	}
}

func TestLinesWith_EverySubstring(t *testing.T) {
	lines := []string{
		`{"msg":"iSCSI session verdict","portal":"127.0.0.3:3260","result":"LOGGED_IN"}`,
		`{"msg":"iSCSI session verdict","portal":"127.0.0.3:3260","verdict":"wait"}`,
		`{"msg":"iSCSI session verdict","portal":"127.0.0.1:3260","result":"LOGGED_IN"}`,
	}
	got := linesWith(lines, `"portal":"127.0.0.3:3260"`, `"result":"LOGGED_IN"`)
	if diff := cmp.Diff(lines[:1], got); diff != "" {
		t.Errorf("linesWith (-want +got):\n%s", diff)
	}
}

// kubeletProgress reads the kubelet started last: its first klog line and
// its registration attempt, as seconds after its start.
func TestKubeletProgressReadsTheLastStartOfKubelet(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 19, 44, 40, 0, time.Local)
	log := `==== kubelab: starting kubelet at 2026-12-04T19:30:00Z: /lab/bin/kubelet
I1204 19:30:05.000000     100 server.go:257] "Effective KubeletConfiguration"
I1204 19:30:09.000000     100 kubelet_node_status.go:75] "Attempting to register node" node="pathmend-lab"
==== kubelab: starting kubelet at 2026-12-04T19:44:40.75202956Z: /lab/bin/kubelet
	address: 0.0.0.0
I1204 19:48:18.500000     249 server.go:257] "Effective KubeletConfiguration" config=<
E1204 19:49:24.164975     249 kubelet_node_status.go:396] "Error getting the current node from lister"
I1204 19:49:48.673404     249 kubelet_node_status.go:75] "Attempting to register node" node="pathmend-lab"
`
	path := filepath.Join(t.TempDir(), "kubelet.log")
	if err := os.WriteFile(path, []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got := kubeletProgress(path, t0)
	want := "kubelet logged its first line 218.5s after its start and asked to register its Node 308.7s after its start"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if err := os.WriteFile(path, []byte(log[:strings.Index(log, "I1204 19:49:48")]), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := kubeletProgress(path, t0); !strings.HasSuffix(got, "asked to register its Node not yet") {
		t.Errorf("without a registration attempt: %q", got)
	}
}

// The report names the wait that came nearest its limit.
func TestWaitKeepsTheClosestWait(t *testing.T) {
	l := newLab(t.TempDir(), t.TempDir())
	if err := os.MkdirAll(l.out, 0o755); err != nil {
		t.Fatal(err)
	}
	_ = l.wait(time.Hour, "fast", func() (bool, error) { return true, nil })
	n := 0
	_ = l.wait(time.Second, "slow", func() (bool, error) { n++; return n > 2, nil })
	if l.closest.What != "slow" || l.closest.Limit != time.Second {
		t.Fatalf("closest %+v, want the slow wait", l.closest)
	}
	var b strings.Builder
	l.report(&b, nil)
	if !strings.Contains(b.String(), "Closest wait: slow took") {
		t.Errorf("report without the closest wait:\n%s", b.String())
	}
}
