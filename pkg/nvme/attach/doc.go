// Package attach is pathmend's NVMe-oF/TCP Attacher: the driver's
// Attacher for transport "nvme-tcp", beside pkg/iscsi/attach for
// "iscsi". It speaks pkg/volume types only and imports neither pkg/driver
// (nor gRPC) nor the loop; main hands it to the driver.
//
// Attach connects every endpoint of the volume through the kernel's
// fabrics interface (optimized ones first; pkg/nvme/fabrics), finds the
// namespace by identity in sysfs (nsid, NGUID, UUID; never by a name
// glob) and waits for a usable path. When the namespace does not show up,
// or diagnosis finds a defect on the volume's subsystem, it runs one
// repair through the process's heal policy — sparing the co-tenants the
// driver passes in and tearing nothing down while one of them cannot be
// read — and connects once more: the "already connected but unusable"
// loop ends there. Undo disconnects exactly the controllers one Attach
// created; Detach the volume's controllers unless a co-tenant record names
// the subsystem. Health grades the volume's paths from a read of sysfs; Expand
// rescans its controllers.
//
// Invariants: it keeps no intent of its own (the driver holds the
// target's lease around Attach, Undo and Detach); it starts no goroutine;
// secrets given to Attach reach the kernel and nothing else.
package attach
