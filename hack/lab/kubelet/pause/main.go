// Command pause is the sandbox process of the kubelet lab's pods (the
// image containerd starts first in every pod, as registry.k8s.io/pause
// does in a cluster): it holds the pod's namespaces, reaps the zombies
// that a shared PID namespace hands to it, and exits 0 on SIGINT or
// SIGTERM. It is built static and packed into an image with no other
// file, so the lab pulls nothing.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
