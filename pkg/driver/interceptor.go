package driver

import (
	"context"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"google.golang.org/grpc"
	"k8s.io/klog/v2"
)

// logInterceptor is the one logging interceptor of the gRPC server: the
// method at V(4), the request with secrets stripped at V(5), and every error
// at level 0 with the method and the volume ID. It also maps whatever the
// handler returned through ToStatus, so no handler can leak a raw error.
func logInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	volumeID := ""
	if r, ok := req.(interface{ GetVolumeId() string }); ok {
		volumeID = r.GetVolumeId()
	}
	klog.V(4).InfoS("RPC", "method", info.FullMethod, "volumeID", volumeID)
	if klogV := klog.V(5); klogV.Enabled() {
		klogV.InfoS("RPC request", "method", info.FullMethod, "request", protosanitizer.StripSecrets(req).String())
	}
	resp, err := handler(ctx, req)
	if err != nil {
		err = ToStatus(err)
		klog.ErrorS(err, "RPC failed", "method", info.FullMethod, "volumeID", volumeID)
		return nil, err
	}
	if klogV := klog.V(5); klogV.Enabled() {
		klogV.InfoS("RPC response", "method", info.FullMethod, "response", protosanitizer.StripSecrets(resp).String())
	}
	return resp, nil
}
