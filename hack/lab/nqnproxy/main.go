// Command nqnproxy makes one nvmet subsystem answer under another
// subsystem's NQN, so a single guest kernel can play two targets that
// share one NQN (two arrays exporting the same subsystem, each handing out
// controller IDs from its own attr_cntlid_min/max range).
//
// It is a TCP proxy for NVMe/TCP without digests. Host to target, it
// rewrites the subsystem NQN in Fabrics Connect data from -host-nqn to
// -target-nqn; target to host, it rewrites the SUBNQN field of Identify
// Controller data back. Every other byte passes unchanged, so the host
// kernel sees a second controller of -host-nqn whose cntlid, serial and
// namespaces come from the -target-nqn subsystem.
//
// With -hold-aen-file, it also holds back the target's asynchronous
// events: while that file exists, the completion of every Asynchronous
// Event Request on the admin queue is dropped instead of forwarded, so the
// host never learns of a namespace the target adds (nvmet reports it with
// a namespace-attribute-changed event) and only a rescan of its own finds
// it. nvmet masks further events of that type until the host reads the
// changed-namespace log, which it does only after an event: the hold lasts
// until the host reconnects. Dropping packets does not do this (TCP
// delivers the event when they flow again); without an event the host's
// view is what its last scan saw.
//
// Usage:
//
//	nqnproxy -listen 127.0.0.3:4420 -connect 127.0.0.1:4420 \
//	    -host-nqn nqn.…:shared -target-nqn nqn.…:shared-b [-hold-aen-file F]
package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
)

// NVMe/TCP PDU types and the offsets this proxy touches (NVMe/TCP 1.0,
// NVMe base 2.0).
const (
	pduCapsuleCmd  = 0x04
	pduCapsuleResp = 0x05
	pduC2HData     = 0x07

	flagHDGST      = 0x01
	flagDDGST      = 0x02
	flagC2HSuccess = 0x08

	opFabrics      = 0x7f
	fcConnect      = 0x01
	opIdentify     = 0x06
	opAsyncEvent   = 0x0c // admin queue only: the I/O queues' 0x0c is Verify
	connectQIDOff  = 42   // QID in the Connect SQE
	cnsController  = 0x01
	connectNQNOff  = 256 // subsysnqn in Connect data
	identifyNQNOff = 768 // SUBNQN in Identify Controller data
	nqnLen         = 256
	maxPDU         = 1 << 20
)

func main() {
	listen := flag.String("listen", "", "address to accept host connections on")
	connect := flag.String("connect", "", "nvmet port to forward to")
	hostNQN := flag.String("host-nqn", "", "NQN the host connects to and sees")
	targetNQN := flag.String("target-nqn", "", "NQN of the nvmet subsystem that answers")
	holdAEN := flag.String("hold-aen-file", "", "while this file exists, asynchronous event completions are not forwarded to the host")
	flag.Parse()
	if *listen == "" || *connect == "" || *hostNQN == "" || *targetNQN == "" || len(*hostNQN) >= nqnLen || len(*targetNQN) >= nqnLen {
		flag.Usage()
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("nqnproxy: %s (%s) -> %s (%s)", *listen, *hostNQN, *connect, *targetNQN)
	p := &proxy{target: *connect, hostNQN: field(*hostNQN), targetNQN: field(*targetNQN), holdAEN: *holdAEN}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go p.serve(c)
	}
}

func field(nqn string) []byte {
	b := make([]byte, nqnLen)
	copy(b, nqn)
	return b
}

type proxy struct {
	target             string
	hostNQN, targetNQN []byte
	holdAEN            string
}

// holding reports whether asynchronous events are held back now.
func (p *proxy) holding() bool {
	if p.holdAEN == "" {
		return false
	}
	_, err := os.Stat(p.holdAEN)
	return err == nil
}

// conn is one proxied queue: whether it is the admin queue, the command
// IDs of Identify Controller commands whose data is still to come, and
// those of outstanding Asynchronous Event Requests.
type conn struct {
	mu       sync.Mutex
	admin    bool
	identify map[uint16]bool
	aer      map[uint16]bool
}

func (p *proxy) serve(host net.Conn) {
	defer host.Close()
	tgt, err := net.Dial("tcp", p.target)
	if err != nil {
		log.Printf("dial %s: %v", p.target, err)
		return
	}
	defer tgt.Close()
	c := &conn{identify: map[uint16]bool{}, aer: map[uint16]bool{}}
	done := make(chan error, 2)
	go func() { done <- pump(host, tgt, func(pdu []byte) (bool, error) { return false, p.fromHost(c, pdu) }) }()
	go func() { done <- pump(tgt, host, func(pdu []byte) (bool, error) { return p.fromTarget(c, pdu) }) }()
	if err := <-done; err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		log.Printf("queue %s: %v", host.RemoteAddr(), err)
	}
}

// pump copies PDUs from src to dst, letting edit change each in place or
// drop it.
func pump(src, dst net.Conn, edit func([]byte) (drop bool, err error)) error {
	defer dst.Close()
	hdr := make([]byte, 8)
	for {
		if _, err := io.ReadFull(src, hdr); err != nil {
			return err
		}
		plen := binary.LittleEndian.Uint32(hdr[4:8])
		if plen < 8 || plen > maxPDU {
			return fmt.Errorf("bad PDU length %d", plen)
		}
		pdu := make([]byte, plen)
		copy(pdu, hdr)
		if _, err := io.ReadFull(src, pdu[8:]); err != nil {
			return err
		}
		drop, err := edit(pdu)
		if err != nil {
			return err
		}
		if drop {
			continue
		}
		if _, err := dst.Write(pdu); err != nil {
			return err
		}
	}
}

func dataOffset(pdu []byte) int {
	if pdo := int(pdu[3]); pdo != 0 {
		return pdo
	}
	off := int(pdu[2])
	if pdu[1]&flagHDGST != 0 {
		off += 4
	}
	return off
}

func (p *proxy) fromHost(c *conn, pdu []byte) error {
	if pdu[0] != pduCapsuleCmd || len(pdu) < 8+64 {
		return nil
	}
	if pdu[1]&(flagHDGST|flagDDGST) != 0 {
		return errors.New("digests are not supported")
	}
	sqe := pdu[8 : 8+64]
	cid := binary.LittleEndian.Uint16(sqe[2:4])
	switch {
	case sqe[0] == opFabrics && sqe[4] == fcConnect:
		c.mu.Lock()
		c.admin = binary.LittleEndian.Uint16(sqe[connectQIDOff:connectQIDOff+2]) == 0
		c.mu.Unlock()
		data := pdu[dataOffset(pdu):]
		if len(data) < connectNQNOff+nqnLen {
			return errors.New("connect without in-capsule data")
		}
		nqn := data[connectNQNOff : connectNQNOff+nqnLen]
		if bytes.Equal(nqn, p.hostNQN) {
			copy(nqn, p.targetNQN)
		}
	case sqe[0] == opIdentify && sqe[40] == cnsController:
		c.mu.Lock()
		c.identify[cid] = true
		c.mu.Unlock()
	case sqe[0] == opAsyncEvent:
		c.mu.Lock()
		if c.admin {
			c.aer[cid] = true
		}
		c.mu.Unlock()
	}
	return nil
}

func (p *proxy) fromTarget(c *conn, pdu []byte) (drop bool, err error) {
	switch pdu[0] {
	case pduCapsuleResp:
		if len(pdu) >= 8+16 {
			cid := binary.LittleEndian.Uint16(pdu[8+12 : 8+14])
			c.mu.Lock()
			delete(c.identify, cid)
			aer := c.aer[cid]
			delete(c.aer, cid)
			c.mu.Unlock()
			if aer && p.holding() {
				log.Printf("held back asynchronous event (cid %d, result %#x)", cid, binary.LittleEndian.Uint32(pdu[8:12]))
				return true, nil
			}
		}
	case pduC2HData:
		if len(pdu) < 24 {
			return false, nil
		}
		cid := binary.LittleEndian.Uint16(pdu[8:10])
		c.mu.Lock()
		pending := c.identify[cid]
		if pending && pdu[1]&flagC2HSuccess != 0 {
			delete(c.identify, cid)
		}
		c.mu.Unlock()
		if !pending {
			return false, nil
		}
		if pdu[1]&(flagHDGST|flagDDGST) != 0 {
			return false, errors.New("digests are not supported")
		}
		datao := int(binary.LittleEndian.Uint32(pdu[12:16]))
		data := pdu[dataOffset(pdu):]
		// The SUBNQN field may straddle C2HData PDUs: patch the overlap,
		// and only when it holds the answering subsystem's NQN.
		lo, hi := max(identifyNQNOff-datao, 0), min(identifyNQNOff+nqnLen-datao, len(data))
		if lo >= hi {
			return false, nil
		}
		want := p.targetNQN[lo+datao-identifyNQNOff : hi+datao-identifyNQNOff]
		if bytes.Equal(data[lo:hi], want) {
			copy(data[lo:hi], p.hostNQN[lo+datao-identifyNQNOff:hi+datao-identifyNQNOff])
		}
	}
	return false, nil
}
