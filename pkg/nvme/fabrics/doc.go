// Package fabrics connects and disconnects NVMe-oF controllers through the
// kernel's own interface — no nvme-cli, no process.
//
// Connect writes one option string to <dev-root>/nvme-fabrics and reads
// back "instance=N,cntlid=M" on the same descriptor, as the kernel's fabrics
// driver (drivers/nvme/host/fabrics.c) defines it. Disconnect writes "1" to
// <sys-root>/class/nvme/<ctrl>/delete_controller; Rescan writes "1" to
// rescan_controller, both through the writer the Connector is given (in
// pathmend, a sysfs.BoundedWriter: a wedged controller's delete never
// returns, and no RPC or monitor job waits for it for ever). The host NQN and host ID come from /etc/nvme/hostnqn
// and /etc/nvme/hostid (paths configurable) and are generated and persisted
// when absent, so every connect from this node presents the same identity.
//
// The package owns the option string syntax and the mapping of the
// kernel's errnos to typed errors (ErrAlreadyConnected, ErrUnreachable,
// ErrInvalidOptions, …). It does not decide what to connect: that is the
// attacher's and the monitor's job. DH-HMAC-CHAP secrets travel only in the
// option string written to the kernel: never in logs, errors or argv.
package fabrics
