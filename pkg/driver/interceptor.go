package driver

import (
	"context"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"

	"github.com/pathmend/pathmend/pkg/scrub"
)

// logInterceptor is the outer interceptor of the gRPC server. It first
// hands every secret value the request carries to the process's scrubber
// (registerSecrets), so that no text the call produces can carry one out.
// It puts the driver's logger into the call's context, then logs the
// method at V(4), the request at V(5) with every credential redacted and
// every value cut (see redacted), and every error at level 0 with the
// method and the volume ID. It logs a request before the door checks it,
// so a request refused for its size or its content is logged the same
// bounded, redacted way. It also maps whatever the handler returned
// through ToStatus and scrubs the message, so no handler can leak a raw
// error or a secret in one.
func (d *Driver) logInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if m, ok := req.(proto.Message); ok {
		registerSecrets(scrub.Default, m.ProtoReflect())
	}
	logger := d.logger()
	ctx = klog.NewContext(ctx, logger)
	volumeID := ""
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		// The door refuses a volume ID over 128 bytes, but only after this
		// line: log a bounded prefix.
		volumeID = cut(r.GetVolumeId(), maxStringBytes)
	}
	logger.V(4).Info("RPC", "method", info.FullMethod, "volumeID", volumeID)
	if v := logger.V(5); v.Enabled() {
		v.Info("RPC request", "method", info.FullMethod, "request", redacted{req}.String())
	}
	resp, err := handler(ctx, req)
	if err != nil {
		err = scrubStatus(ToStatus(err))
		logger.Error(err, "RPC failed", "method", info.FullMethod, "volumeID", volumeID)
		return nil, err
	}
	if v := logger.V(5); v.Enabled() {
		v.Info("RPC response", "method", info.FullMethod, "response", redacted{resp}.String())
	}
	return resp, nil
}

// logger is Deps.Logger, or klog's.
func (d *Driver) logger() logr.Logger {
	if d.deps.Logger.GetSink() != nil {
		return d.deps.Logger
	}
	return klog.Background()
}

// scrubStatus replaces every secret the process has seen in a status's
// message (its details are never set).
func scrubStatus(err error) error {
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := scrub.String(s.Message())
	if msg == s.Message() {
		return err
	}
	return status.Error(s.Code(), msg)
}
