package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pathmend/pathmend/pkg/sysfs"
	"github.com/pathmend/pathmend/pkg/volume"
)

func TestToStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want codes.Code
	}{
		{"nil", nil, codes.OK},
		{"field error", &volume.FieldError{Key: "nqn", Reason: "bad"}, codes.InvalidArgument},
		{"wrapped field error", fmt.Errorf("parse: %w", &volume.FieldError{Key: "lun", Reason: "bad"}), codes.InvalidArgument},
		{"coded", notFound("gone"), codes.NotFound},
		{"wrapped coded", fmt.Errorf("attach: %w", failedPrecondition("not built")), codes.FailedPrecondition},
		{"aborted", &codedError{code: codes.Aborted, msg: "busy"}, codes.Aborted},
		{"deadline", fmt.Errorf("connect: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"canceled", context.Canceled, codes.Canceled},
		{"internal wrapping a deadline", internal(context.DeadlineExceeded, "mount"), codes.DeadlineExceeded},
		{"plain", errors.New("boom"), codes.Internal},
		{"unavailable", fmt.Errorf("attach: %w: no path", volume.ErrUnavailable), codes.Unavailable},
		{"a kernel write that did not return", fmt.Errorf("detach vol: disconnect nvme3: %w", sysfs.ErrWriteTimedOut), codes.Unavailable},
		{"already a status", status.Error(codes.Unavailable, "x"), codes.Unavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ToStatus(tc.err)
			if status.Code(got) != tc.want {
				t.Errorf("ToStatus(%v) = %v, want %v", tc.err, status.Code(got), tc.want)
			}
			if tc.err != nil && status.Convert(got).Message() == "" {
				t.Error("status message is empty")
			}
		})
	}
}

func TestNotBuiltRefusesEveryCall(t *testing.T) {
	a := NotBuilt(volume.TransportISCSI)
	_, err := a.Attach(context.Background(), volume.AttachRequest{VolumeID: "v"})
	if status.Code(ToStatus(err)) != codes.FailedPrecondition {
		t.Errorf("Attach: %v, want FailedPrecondition", err)
	}
	if c := a.Health(context.Background(), volume.Record{}); c.Status != volume.Inaccessible {
		t.Errorf("Health = %+v, want Inaccessible", c)
	}
	if _, err := a.Expand(context.Background(), volume.Record{}); err == nil {
		t.Error("Expand succeeded")
	}
	if err := a.Detach(context.Background(), volume.Record{}, volume.CoTenants{}); err == nil {
		t.Error("Detach succeeded")
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"unix:///csi/csi.sock", "/csi/csi.sock", true},
		{"unix:/csi/csi.sock", "/csi/csi.sock", true},
		{"unix:///var/lib/kubelet/plugins/csi.pathmend.io//csi.sock", "/var/lib/kubelet/plugins/csi.pathmend.io/csi.sock", true},
		{"unix://relative.sock", "", false},
		{"tcp://127.0.0.1:10000", "", false},
		{"/csi/csi.sock", "", false},
		{"unix:", "", false},
	} {
		got, err := ParseEndpoint(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseEndpoint(%q) = %q, %v; want %q ok=%t", tc.in, got, err, tc.want, tc.ok)
		}
	}
}
