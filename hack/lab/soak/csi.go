package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/hack/lab/soak/report"
)

// co is the soak as kubelet: it stages and publishes volumes over
// pathmend's socket, retrying a failed call the way kubelet does until it
// succeeds or the bound runs out.
type co struct {
	node   csi.NodeClient
	conn   *grpc.ClientConn
	root   string
	record func(report.Action)
}

func newCO(sock, root string, record func(report.Action)) (*co, error) {
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &co{node: csi.NewNodeClient(conn), conn: conn, root: root, record: record}, nil
}

func (c *co) staging(v *vol) string {
	return filepath.Join(c.root, "kubelet", "plugins", "staging", v.id)
}
func (c *co) target(v *vol) string { return filepath.Join(c.root, "kubelet", "pods", "soak", v.id) }

func capability(v *vol) *csi.VolumeCapability {
	mode := &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}
	if v.block {
		return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}, AccessMode: mode}
	}
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}}, AccessMode: mode}
}

// retryBound is how long a call is retried. kubelet retries forever with
// a backoff up to 2 min; the soak gives up after this and reports it.
const retryBound = 5 * time.Minute

// call runs one RPC until it succeeds, the bound runs out or ctx ends,
// and records it as an action: its start and end, the attempts, the last
// error. during, when set, runs in parallel with the first attempt (a
// kill of pathmend in the middle of it), told by the channel when that
// attempt returned.
func (c *co) call(ctx context.Context, what string, v *vol, rpc func(context.Context) error, during func(first <-chan struct{})) error {
	a := report.Action{At: time.Now(), What: what, Volume: v.id}
	var err error
	var firstErr string
	attempts := 0
	for deadline := time.Now().Add(retryBound); ; {
		attempts++
		first := make(chan struct{})
		var duringDone chan struct{}
		if attempts == 1 && during != nil {
			duringDone = make(chan struct{})
			go func() { defer close(duringDone); during(first) }()
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = rpc(cctx)
		cancel()
		close(first)
		if duringDone != nil {
			// The kill and restart happen before the retries, as they
			// would: kubelet retries against whatever runs then.
			<-duringDone
		}
		if err != nil && firstErr == "" {
			firstErr = err.Error()
		}
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) || status.Code(err) == codes.InvalidArgument {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(min(attempts, 5)) * time.Second):
		}
	}
	a.End = time.Now()
	if attempts > 1 {
		a.Attempts, a.FirstErr = attempts, firstErr
		a.Note = fmt.Sprintf("%d attempts", attempts)
		if err == nil {
			a.Note += ", the first: " + firstErr
		}
	}
	if err != nil {
		a.Err = err.Error()
	}
	c.record(a)
	return err
}

func (c *co) stage(ctx context.Context, v *vol, during func(<-chan struct{})) error {
	if err := os.MkdirAll(c.staging(v), 0o750); err != nil {
		return err
	}
	return c.call(ctx, "stage", v, func(ctx context.Context) error {
		_, err := c.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
			VolumeId: v.id, StagingTargetPath: c.staging(v), VolumeContext: v.context, VolumeCapability: capability(v),
		})
		return err
	}, during)
}

func (c *co) publish(ctx context.Context, v *vol) error {
	return c.call(ctx, "publish", v, func(ctx context.Context) error {
		_, err := c.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
			VolumeId: v.id, StagingTargetPath: c.staging(v), TargetPath: c.target(v), VolumeCapability: capability(v),
		})
		return err
	}, nil)
}

func (c *co) unpublish(ctx context.Context, v *vol) error {
	return c.call(ctx, "unpublish", v, func(ctx context.Context) error {
		_, err := c.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: c.target(v)})
		return err
	}, nil)
}

func (c *co) unstage(ctx context.Context, v *vol, during func(<-chan struct{})) error {
	return c.call(ctx, "unstage", v, func(ctx context.Context) error {
		_, err := c.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: c.staging(v)})
		return err
	}, during)
}

// health is pathmend's NodeGetVolumeHealth of v now, each entry as
// "STATUS Reason" joined by ", " ("HEALTHY" when it has none), or the
// call's error.
func (c *co) health(ctx context.Context, v *vol) string {
	// Asked as kubelet's volume health probe asks: a pathmend that is not
	// serving (the soak kills it and starts it again) is asked again until
	// it answers, a retry the report counts with its cause; any other
	// error is the answer.
	var out string
	_ = c.call(ctx, "health", v, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		resp, err := c.node.NodeGetVolumeHealth(ctx, &csi.NodeGetVolumeHealthRequest{VolumeId: v.id})
		if status.Code(err) == codes.Unavailable {
			out = "error: " + codes.Unavailable.String()
			return err
		}
		if err != nil {
			out = "error: " + status.Code(err).String()
			return nil
		}
		var hs []string
		for _, h := range resp.GetVolumeHealth().GetHealthStatuses() {
			hs = append(hs, h.GetStatus().String()+" "+h.GetReason())
		}
		out = "HEALTHY"
		if len(hs) > 0 {
			out = strings.Join(hs, ", ")
		}
		return nil
	}, nil)
	return out
}
