// Command kubelab runs pathmend under a real kubelet in the lab guest
// (`make kubelet-lab`, hack/lab/kubelet/README.md): it brings up a
// one-node cluster — etcd, kube-apiserver, containerd, `pathmend serve`
// with its registrar, kubelet with the CSIVolumeHealth gate — builds
// NVMe-oF and iSCSI targets with the lab's guest helpers, and walks the
// scenario: pods on an NVMe filesystem PVC, an NVMe raw-block PVC and an
// iSCSI PVC doing checksummed I/O; one path of each broken and healed by
// pathmend while kubelet reports the volume health pathmend gives it in
// pod status and CSINode; a second pod on the same PVC; a kubelet restart
// with the pods running; the pods deleted and the node left with no
// trace of the volumes. Every step is timed; the report goes to stdout
// and to <out>/kubelet-lab.md. The exit status is 1 when any assertion
// failed.
//
//	kubelab -lab /lab
//	kubelab -lab /lab -up    # bring the node up and keep it until SIGINT/SIGTERM
//
// -up is for a lab shell (`make kubelet-lab-shell`): the cluster runs with
// pathmend registered and the admin kubeconfig in <lab>/out, nothing else
// is created.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	fl := flag.NewFlagSet("kubelab", flag.ExitOnError)
	share := fl.String("lab", "/lab", "the lab share: bin/, guest/, deploy/, out/")
	runDir := fl.String("run", "/run/kubelab", "state directory (PKI, etcd data, configs)")
	up := fl.Bool("up", false, "bring the node up and keep it running until SIGINT or SIGTERM")
	_ = fl.Parse(os.Args[1:])
	l := newLab(*share, *runDir)
	go l.sampleMemory()
	if *up {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		err := l.bringUp()
		if err == nil {
			err = l.failedSteps()
		}
		if err == nil {
			fmt.Println("kubelab: node up; KUBECONFIG=" + l.out + "/admin.kubeconfig; SIGINT/SIGTERM stops it")
			<-sigs
		}
		l.shutdown()
		l.report(os.Stdout, err)
		if err != nil {
			os.Exit(1)
		}
		return
	}
	err := l.Run()
	l.report(os.Stdout, err)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubelab:", err)
		os.Exit(1)
	}
}
