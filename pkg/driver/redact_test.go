package driver_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/volume"
)

// captureKlog sends klog's output at verbosity v to a buffer for the rest
// of the test and returns a function that flushes and reads it.
func captureKlog(t *testing.T, v string) func() string {
	t.Helper()
	var buf bytes.Buffer
	var mu sync.Mutex
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	if err := fs.Parse([]string{"-v=" + v, "-logtostderr=false", "-alsologtostderr=false"}); err != nil {
		t.Fatal(err)
	}
	klog.SetOutput(&lockedWriter{w: &buf, mu: &mu})
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		fs.Set("v", "0")
		fs.Set("logtostderr", "true")
	})
	return func() string {
		klog.Flush()
		mu.Lock()
		defer mu.Unlock()
		return buf.String()
	}
}

// credentialValue is the value a test puts under credential key k: a
// well-formed one for its transport, unique to the key, so that a leak
// names the key it came under.
func credentialValue(k string) string {
	switch k {
	case "dhchapSecret":
		return dhchapKey("host-key-that-is-never-logged-01")
	case "dhchapCtrlSecret":
		return dhchapKey("ctrl-key-that-is-never-logged-02")
	}
	return "cred-" + k + "-never-logged-7f3a"
}

// TestCredentialsNeverLogged_V10 runs the RPCs that carry maps through the
// real gRPC server at -v=10 with every credential key of the contract in
// the volume context, the publish context and the secrets (and misspelt
// ones, and one in an over-limit request the door refuses), and asserts
// that no credential value reaches any log line, whether the request is
// accepted or rejected.
func TestCredentialsNeverLogged_V10(t *testing.T) {
	logs := captureKlog(t, "10")
	env := newFakeEnv(t)
	if err := os.WriteFile(env.attacher.device, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	node := csi.NewNodeClient(serveOnSocket(t, env.driver))
	ctx := context.Background()
	staging := mkdir(t, env.dir, "staging")

	creds := map[string]string{}
	var values []string
	for _, d := range volume.Keys() {
		if d.Secret {
			creds[d.Key] = credentialValue(d.Key)
		}
	}
	for _, k := range []string{"chapPasword", "ChapPassword", "example.com/password", "dhchap_secret"} {
		creds[k] = credentialValue(k)
	}
	for _, v := range creds {
		values = append(values, v)
	}
	withCreds := func(base map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for k, v := range creds {
			m[k] = v
		}
		return m
	}
	nvmeSecrets := map[string]string{"dhchapSecret": creds["dhchapSecret"], "dhchapCtrlSecret": creds["dhchapCtrlSecret"]}
	iscsiSecrets := map[string]string{"chapUsername": creds["chapUsername"], "chapPassword": creds["chapPassword"],
		"chapUsernameIn": creds["chapUsernameIn"], "chapPasswordIn": creds["chapPasswordIn"]}
	iscsiContext := map[string]string{"transport": "iscsi", "iqn": "iqn.2001-04.com.example:t1", "portals": "192.0.2.20", "lun": "0"}

	stage := func(id string, vc, pc, secrets map[string]string) {
		_, _ = node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: id, StagingTargetPath: staging, VolumeContext: vc, PublishContext: pc, Secrets: secrets,
			VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		})
	}
	// Accepted: credentials where they belong.
	stage("vol-nvme", nvmeContext(), nil, nvmeSecrets)
	stage("vol-iscsi", iscsiContext, nil, iscsiSecrets)
	// Rejected: every credential key in the volume context, in the publish
	// context, and every one in the secrets at once.
	stage("vol-in-context", withCreds(nvmeContext()), nil, nil)
	stage("vol-in-publish", nvmeContext(), withCreds(nil), nil)
	stage("vol-in-secrets", nvmeContext(), nil, withCreds(nil))
	// Rejected at the door for its size, with credentials in every map.
	big := withCreds(nil)
	big["pad"] = strings.Repeat("p", 5000)
	stage(strings.Repeat("v", 1000), big, big, big)
	// The other RPCs that carry maps.
	_, _ = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: "vol-nvme", StagingTargetPath: staging, TargetPath: staging + "-target",
		VolumeCapability: blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER),
		VolumeContext:    withCreds(nvmeContext()), PublishContext: withCreds(nil), Secrets: withCreds(nil),
	})
	_, _ = node.NodeExpandVolume(ctx, &csi.NodeExpandVolumeRequest{VolumeId: "vol-nvme", VolumePath: staging, Secrets: withCreds(nil)})
	_, _ = node.NodeGetStorageHealth(ctx, &csi.NodeGetStorageHealthRequest{Secrets: withCreds(nil)})

	out := logs()
	if !strings.Contains(out, "RPC request") || !strings.Contains(out, "vol-in-publish") {
		t.Fatalf("no request dumps at -v=10:\n%s", out)
	}
	if !strings.Contains(out, "***stripped***") {
		t.Errorf("no redaction marker in the dumps:\n%s", out)
	}
	for _, v := range values {
		if strings.Contains(out, v) {
			t.Errorf("credential %q found in the log", v)
		}
		// Also the key material of a DH-HMAC-CHAP key on its own.
		if parts := strings.Split(v, ":"); len(parts) > 2 && strings.Contains(out, parts[2]) {
			t.Errorf("key material of %q found in the log", v)
		}
	}
	if strings.Contains(out, strings.Repeat("p", 300)) || strings.Contains(out, strings.Repeat("v", 300)) {
		t.Error("an over-limit value was logged whole")
	}
}
