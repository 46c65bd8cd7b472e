// Package nvme is pathmend's model of the host's NVMe state, the
// diagnosis of NVMe-oF/TCP paths built on it, and the mechanism that acts
// on those paths when policy says so.
//
// It owns the read model (Host, Subsystem, Controller, Namespace, Path)
// and its readers (Read, Reader, Index), Inspect, which turns one Host
// plus the staged volumes' Expectations into heal.Defect values, and the
// per-volume answers built on them (Locate, ReportPaths, ConditionOf,
// CurrentDevices). It is not read-only: the Repairer deletes and rescans
// controllers (delete_controller, rescan_controller through a Detacher
// and Rescanner), ApplyTunes writes controller timeouts and a head's
// delayed_removal_secs, and ConnectOptions builds what pkg/nvme/fabrics
// writes to /dev/nvme-fabrics; every write goes through the one rooted
// sysfs.FS (or the fabrics connector), so a test sees exactly what was
// written. It does not decide on repairs (package heal) and never starts
// a process: the package imports neither os/exec nor an exec seam, which
// a test enforces. The CSI attacher is package nvme/attach.
//
// # Sysfs layout read (Linux 6.1, the kernel of the lab fixtures)
//
// The fixtures under testdata/fixtures were captured from Debian's
// 6.1.0-57-amd64 kernel with native multipath on (nvme_core.multipath=Y). Paths are relative to the sysfs
// root:
//
//	class/nvme-subsystem/nvme-subsysN -> devices/virtual/nvme-subsystem/nvme-subsysN
//	    subsysnqn model serial            required
//	    iopolicy                          only with CONFIG_NVME_MULTIPATH
//	    subsystype                        "nvm" or "discovery" (5.18+)
//	    nvmeX -> ../../nvme-fabrics/ctl/nvmeX     one link per member controller
//	    nvmeNnH/                          multipath head block device
//	        nsid wwid size                required (size in 512-byte sectors)
//	        nguid uuid                    hidden by the kernel when zero
//	        dev                           major:minor (block/nvmeNnH/dev; read by CurrentDevices)
//	        delayed_removal_secs          Linux 6.16 and later; absent on 6.1
//	class/nvme/nvmeX -> devices/virtual/nvme-fabrics/ctl/nvmeX
//	    state transport cntlid subsysnqn kato      required
//	    address hostnqn ctrl_loss_tmo reconnect_delay fast_io_fail_tmo
//	                                      required of fabrics controllers
//	    nvmeNcXnH/                        hidden leg of head nvmeNnH
//	        ana_state ana_grpid           hidden when the controller has no ANA
//	    nvmeXnH/                          with multipath off: this
//	                                      controller's own block device, with
//	                                      the head's and the leg's attributes
//
// N (subsystem instance), X (controller instance) and H (head instance,
// shared by every device of one namespace) are independent numbers. A leg
// carries no link to its head on 6.1 (the multipath/ directory of a head
// appeared in 6.15); the name is the link: nvme<N>c<X>n<H> belongs to
// nvme<N>n<H>. The timeouts print "off" when disabled. address is
// key=value pairs (traddr, trsvcid, host_traddr, host_iface, and src_addr
// while connected). A controller's CreatedAt is its directory's mtime.
//
// # Reading
//
// Read lists the subsystems, then the controllers, and reads each
// attribute once with one bounded read. A Reader does the same again and
// again (the loop's NVMe transport and the attacher keep one each): it
// lists every directory and reads every
// attribute that can change while its object lives each time, and the
// attributes fixed for an object's life once per object, kept under the
// sysfs.Identity of its directory, so a new object under an old name is
// read afresh. Its ScopePaths reads only the volatile attributes that
// diagnosis and path reports decide on and leaves the others zero; Index
// answers the per-volume lookups of a tick by NQN. ReadTarget reads the
// objects of one subsystem NQN only — what answering for one volume costs
// — and equals that NQN's part of a full read (TargetOf). PeekTarget does
// the same without listing the two class directories while the Reader
// keeps their listings (until Forget: a controller or subsystem instance
// added or removed, events lost); a caller that would act on something
// missing from it confirms with ReadTarget. docs/performance.md
// lists which attribute is which and why. A missing required attribute is
// an error naming its path. An object whose directory disappears between
// the listing and the read (ENOENT on the attribute and on the directory)
// is a race with the kernel: it is left out and recorded in Host.Skipped
// with its subsystem, and Inspect decides nothing about that subsystem.
// The kernel removes a device's class link (class/nvme/<ctrl>,
// block/<disk>) before its attributes and its attributes before its
// directory, so a missing attribute whose link (for a leg: whose nsid) is
// gone too is such a race as well. A leg whose head does not exist (a
// namespace being added or removed) is recorded the same way.
//
// # Defect rules
//
// Inspect considers subsystems that are settled, not discovery subsystems,
// and whose controllers are all NVMe/TCP. Subsystems are grouped by NQN.
// A controller is usable for a namespace when it is live and its leg's ANA
// state is optimized, non-optimized or absent (no ANA).
//
//   - AmbiguousHead (scope subsystem, key: the instance name): an NQN is
//     answered by several instances and exactly one has a usable path;
//     each other instance is reported, and the rules below apply to the
//     usable one only. If none or several are usable, nothing is reported
//     for the NQN.
//   - NoNamespace (subsystem, key: NQN): at least one controller is live
//     and the subsystem exports no namespace. Teardown: every controller.
//   - NamespaceMissing (subsystem, key: NQN): a staged volume's namespace
//     is absent: at least one controller is live, the subsystem exports
//     namespaces, and every one of them contradicts the volume's identity
//     (nsid, nguid or uuid differ). A namespace that publishes none of the
//     fields the volume gives is "don't know", and nothing is reported.
//     One defect per subsystem lists every such volume.
//   - StaleEndpoint (controller, key: NQN and endpoint): the controller is
//     dead (the kernel gave up on it), or staged volumes on its NQN exist,
//     each can be compared without name resolution, and none lists its
//     traddr:trsvcid. Resetting and connecting controllers to a listed
//     endpoint are the kernel's reconnect, not a defect.
//   - ControllerNotContributing (controller, key: NQN and endpoint): the
//     controller is live, the subsystem exports namespaces, and the
//     controller has no leg to at least one of them that another
//     controller has a leg to (a namespace with no leg at all is going
//     away, or has no path to blame one controller for). Reported only when
//     the controller is not already StaleEndpoint.
//
// Controllers being deleted, and states this package does not know, yield
// no controller defect. The key of a controller defect holds the NQN as
// well as the endpoint, because one target port serves many subsystems.
//
// Teardown lists controllers not live first, then by their best leg to
// the namespaces concerned: none or unusable, non-optimized, optimized.
// CoTenants are the namespaces other than the defect's subject that the
// teardown would strand: it removes one of their legs and leaves no usable
// one, having taken the last usable leg or the last leg of all.
//
// # Devices and timeouts
//
// CurrentDevices gives the block devices a staged volume's namespace has
// now, with their numbers, for the driver to compare with what the
// volume's users hold: Linux 6.1 removes a multipath head whose namespace
// lost its last path and makes a new one (new name, new number) when
// paths return. To keep that from happening in an outage, ConnectOptions
// connects with pathmend's timeout defaults where a volume context sets
// none (TimeoutsOf: ctrl_loss_tmo -1, fast_io_fail_tmo 600,
// reconnect_delay 5), and TimeoutTunes plans the writes that align
// controllers already connected (all three attributes are writable on a
// live 6.1 controller) and set a head's delayed_removal_secs where the
// kernel has it; ApplyTunes writes them through the sysfs root.
//
// # Invariants
//
// Model values are snapshots of one read; nothing mutates a Host after
// Read returns it, and Inspect only reads it. Successive Hosts of one
// Reader share the slices and strings of what did not change. Output order is
// deterministic: subsystems, controllers, namespaces and paths by
// instance number, defects as documented on Inspect.
package nvme
