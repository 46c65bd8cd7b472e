// Command flakyproxy is the lab walk-through's breakable iSCSI portal: a
// TCP proxy (internal/flakyproxy, the one the e2e heal tests use) driven
// by signals from a shell script.
//
//	flakyproxy -listen 127.0.0.3:3260 -connect 127.0.0.2:3260 -watch-file /run/x/watch
//
// SIGUSR1 breaks: every open connection is reset, and every new one as
// soon as the attribute named in -watch-file (a path such as
// /sys/class/iscsi_connection/connection4:0/state, read when the signal
// arrives; empty for none) reads "bound". SIGUSR2 lets traffic pass
// again. SIGTERM/SIGINT stop it. It prints one line per event to stdout:
// "listening", "breaking", "passing", and per connection "forward",
// "reset", "reset bound" or "upstream refused"; after a break, a
// forwarded connection adds "forward bound" when it is seen bound, or
// "forward closed unbound" when iscsid closes it first (its bind failed).
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/pathmend/pathmend/internal/flakyproxy"
)

func main() {
	listen := flag.String("listen", "", "address to accept initiator connections on")
	connect := flag.String("connect", "", "portal to forward to")
	watchFile := flag.String("watch-file", "", "file naming the attribute whose value \"bound\" triggers a reset while breaking")
	flag.Parse()
	if *listen == "" || *connect == "" {
		flag.Usage()
		os.Exit(2)
	}
	var mu sync.Mutex
	say := func(s string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println(s)
	}
	p, err := flakyproxy.Listen(*listen, *connect, func(e flakyproxy.Event) { say(string(e)) })
	if err != nil {
		log.Fatal(err)
	}
	say("listening")
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	for s := range sig {
		switch s {
		case syscall.SIGUSR1:
			p.Break(condition(*watchFile))
			say("breaking")
		case syscall.SIGUSR2:
			p.Pass()
			say("passing")
		default:
			p.Close()
			return
		}
	}
}

// condition reads the attribute path named in watchFile and returns a
// check that it reads "bound", or nil when there is none.
func condition(watchFile string) func() bool {
	if watchFile == "" {
		return nil
	}
	b, err := os.ReadFile(watchFile)
	attr := strings.TrimSpace(string(b))
	if err != nil || attr == "" {
		return nil
	}
	return func() bool {
		v, err := os.ReadFile(attr)
		return err == nil && strings.TrimSpace(string(v)) == "bound"
	}
}
