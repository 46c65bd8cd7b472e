package driver_test

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/iscsi/iscsitest"
	"github.com/pathmend/pathmend/pkg/nvme"
	"github.com/pathmend/pathmend/pkg/nvme/fabrics"
	"github.com/pathmend/pathmend/pkg/scrub"
)

// The adversarial host: every command prints the node record it names and
// its own command line, as is, in base64, in hex and URL-escaped; a login
// fails after printing them, as iscsiadm does on some failures; a connect
// fails with its options, DH-HMAC-CHAP keys included, in the same
// encodings; a mount fails with the kernel quoting a password. The record
// it prints holds a CHAP setting pathmend was never given. Whatever the
// host prints, no secret may leave the process: not in the answer to
// kubelet, not in a log line, text or JSON, at any verbosity.

// Secrets of the adversarial tests: every character a string escape
// changes, and one beyond ASCII.
const (
	advUser       = "adv-user-Ω-0042"
	advPassword   = `p@ss"w0rd/+=&<x>\y-0042`
	advUserIn     = "adv-target-user-0042"
	advPasswordIn = "adv-target-pass-0042&%"
	// advForeign is the mutual CHAP password the host's node record holds
	// and pathmend was never given: learnt from the record read back.
	advForeign = "record-only-secret-0042"
)

var (
	advHostKey = dhchapKey("adversarial-host-key-never-seen!")
	advCtrlKey = dhchapKey("adversarial-ctrl-key-never-seen!")
	advSecrets = []string{advUser, advPassword, advUserIn, advPasswordIn, advForeign, advHostKey, advCtrlKey}
)

// echo prints text as is, in base64, in hex and URL-escaped.
func echo(text string) string {
	return text + "\nbase64: " + base64.StdEncoding.EncodeToString([]byte(text)) +
		"\nhex: " + hex.EncodeToString([]byte(text)) + "\nurl: " + url.QueryEscape(text) + "\n"
}

// echoingHost makes every command of h print its node record (with the
// foreign mutual CHAP password) and its command line in every encoding;
// with failLogin, every login then fails, exit 24 (authentication).
func echoingHost(h *iscsitest.Host, failLogin bool) {
	inner := h.Exec.Handler
	h.Exec.Handler = func(ctx context.Context, argv []string) iscsitest.Result {
		r := inner(ctx, argv)
		key := ""
		if i := slices.Index(argv, "-T"); i >= 0 && i+1 < len(argv) {
			if j := slices.Index(argv, "-p"); j >= 0 && j+1 < len(argv) {
				key = argv[i+1] + "," + argv[j+1]
			}
		}
		var rec strings.Builder
		rec.WriteString("# BEGIN RECORD 2.1.9\n")
		settings := h.RecordSettings(key)
		for _, k := range slices.Sorted(func(yield func(string) bool) {
			for k := range settings {
				if !yield(k) {
					return
				}
			}
		}) {
			fmt.Fprintf(&rec, "%s = %s\n", k, settings[k])
		}
		rec.WriteString("node.session.auth.password_in = " + advForeign + "\n# END RECORD\n")
		r.Out += echo(rec.String() + "argv: " + strings.Join(argv, " "))
		if failLogin && iscsitest.Has(argv, "--login") {
			r.Code = 24
		}
		return r
	}
}

// echoingConnector fails every connect, printing its options.
type echoingConnector struct{ nvme.Connector }

func (c echoingConnector) Connect(_ context.Context, o fabrics.Options) (fabrics.Result, error) {
	opts := fmt.Sprintf("nqn=%s,traddr=%s,trsvcid=%s,dhchap_secret=%s,dhchap_ctrl_secret=%s", o.NQN, o.Traddr, o.Trsvcid, o.DHCHAPSecret, o.DHCHAPCtrlSecret)
	return fabrics.Result{}, errors.New("write /dev/nvme-fabrics: " + echo(opts) + ": invalid argument")
}

// TestAdversarialHost_NoSecretLeavesTheProcess stages through the real
// gRPC server over the adversarial host, once per log format.
func TestAdversarialHost_NoSecretLeavesTheProcess(t *testing.T) {
	chap := map[string]string{"chapUsername": advUser, "chapPassword": advPassword, "chapUsernameIn": advUserIn, "chapPasswordIn": advPasswordIn}
	dh := map[string]string{"dhchapSecret": advHostKey, "dhchapCtrlSecret": advCtrlKey}
	for _, format := range []string{"text", "json"} {
		t.Run(format, func(t *testing.T) {
			t.Parallel()
			logger, logs := newLogs(t, format)
			n := newNode(t)
			n.logger, n.connector = logger, echoingConnector{n.kernel}
			echoingHost(n.host, true)
			n.start()
			node := csi.NewNodeClient(serveOnSocket(t, n.drv))
			ctx := context.Background()

			answers := map[string]error{}
			// A login that fails after printing the record.
			req := n.stageRequest("vol-iscsi", iscsiVolumeContext(0), false)
			req.Secrets = chap
			_, answers["iSCSI login"] = node.NodeStageVolume(ctx, req)
			// A connect that fails with its options.
			req = n.stageRequest("vol-nvme", nvmeVolumeContext(1), false)
			req.Secrets = dh
			_, answers["NVMe connect"] = node.NodeStageVolume(ctx, req)
			// A mount that fails with the kernel quoting the password,
			// after a login that succeeds (printing the record).
			echoingHost(n.host, false)
			n.mnt.set(func(string, string) error {
				return errors.New("mount: wrong fs type; dmesg: " + echo("auth "+advPassword+" "+advHostKey))
			})
			req = n.stageRequest("vol-iscsi-2", iscsiVolumeContext(1), false)
			req.Secrets = chap
			_, answers["mount"] = node.NodeStageVolume(ctx, req)
			n.mnt.set(nil)
			// A refused request with credential-shaped keys in the volume
			// context, logged at -v=5 and beyond.
			bad := iscsiVolumeContext(0)
			bad["pass"], bad["auth.key"] = advPassword, advHostKey
			req = n.stageRequest("vol-refused", bad, false)
			_, answers["refused"] = node.NodeStageVolume(ctx, req)

			for what, err := range answers {
				st := status.Convert(err)
				if st.Code() == codes.OK {
					t.Errorf("%s: answered OK", what)
				}
				noLeak(t, what+"'s answer", st.Message(), advSecrets...)
				if what != "refused" && !strings.Contains(st.Message(), scrub.Replacement) {
					t.Errorf("%s: the answer shows no scrubbed text, so the host's output never reached it: %s", what, st.Message())
				}
			}
			text := logs.String()
			noLeak(t, "the "+format+" log", text, advSecrets...)
			if !strings.Contains(text, scrub.Replacement) {
				t.Errorf("the log shows no scrubbed text: the host's output never reached it")
			}
			// The foreign record's password is learnt: a later text that
			// carries it in any spelling is scrubbed too.
			noLeak(t, "a later text", scrub.String("later: "+base64.URLEncoding.EncodeToString([]byte(advForeign))), advForeign)
		})
	}
}
