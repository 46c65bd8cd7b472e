package driver

import (
	"context"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// logInterceptor is the outer interceptor of the gRPC server: the method
// at V(4), the request at V(5) with every credential redacted and every
// value cut (see redacted), and every error at level 0 with the method and
// the volume ID. It logs a request before the door checks it, so a request
// refused for its size or its content is logged the same bounded, redacted
// way. It also maps whatever the handler returned through ToStatus, so no
// handler can leak a raw error.
func logInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	volumeID := ""
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		// The door refuses a volume ID over 128 bytes, but only after this
		// line: log a bounded prefix.
		volumeID = cut(r.GetVolumeId(), maxStringBytes)
	}
	klog.V(4).InfoS("RPC", "method", info.FullMethod, "volumeID", volumeID)
	if klogV := klog.V(5); klogV.Enabled() {
		klogV.InfoS("RPC request", "method", info.FullMethod, "request", redacted{req}.String())
	}
	resp, err := handler(ctx, req)
	if err != nil {
		err = ToStatus(err)
		klog.ErrorS(err, "RPC failed", "method", info.FullMethod, "volumeID", volumeID)
		return nil, err
	}
	if klogV := klog.V(5); klogV.Enabled() {
		klogV.InfoS("RPC response", "method", info.FullMethod, "response", redacted{resp}.String())
	}
	return resp, nil
}
