package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"testing"
)

const (
	hostSide   = "nqn.2024-01.io.pathmend.lab:shared"
	targetSide = "nqn.2024-01.io.pathmend.lab:shared-node-b"
)

func testProxy() (*proxy, *conn) {
	return &proxy{hostNQN: field(hostSide), targetNQN: field(targetSide)}, &conn{identify: map[uint16]bool{}, aer: map[uint16]bool{}}
}

// capsule builds a CapsuleCmd PDU: 8-byte header, 64-byte SQE, data.
func capsule(sqe [64]byte, data []byte) []byte {
	pdu := make([]byte, 72+len(data))
	pdu[0], pdu[2] = pduCapsuleCmd, 72
	if len(data) > 0 {
		pdu[3] = 72
	}
	binary.LittleEndian.PutUint32(pdu[4:8], uint32(len(pdu)))
	copy(pdu[8:72], sqe[:])
	copy(pdu[72:], data)
	return pdu
}

// c2h builds a C2HData PDU carrying data at offset datao of command cid.
func c2h(cid uint16, datao int, data []byte, last bool) []byte {
	pdu := make([]byte, 24+len(data))
	pdu[0], pdu[2], pdu[3] = pduC2HData, 24, 24
	if last {
		pdu[1] = 0x04 | flagC2HSuccess
	}
	binary.LittleEndian.PutUint32(pdu[4:8], uint32(len(pdu)))
	binary.LittleEndian.PutUint16(pdu[8:10], cid)
	binary.LittleEndian.PutUint32(pdu[12:16], uint32(datao))
	binary.LittleEndian.PutUint32(pdu[16:20], uint32(len(data)))
	copy(pdu[24:], data)
	return pdu
}

func TestFromHost_RewritesTheConnectNQN(t *testing.T) {
	p, c := testProxy()
	var sqe [64]byte
	sqe[0], sqe[4] = opFabrics, fcConnect
	data := make([]byte, 1024)
	copy(data[connectNQNOff:], hostSide)
	copy(data[512:], "nqn.2014-08.org.nvmexpress:uuid:host")
	pdu := capsule(sqe, data)
	if err := p.fromHost(c, pdu); err != nil {
		t.Fatal(err)
	}
	got := pdu[72+connectNQNOff : 72+connectNQNOff+nqnLen]
	if !bytes.Equal(got, field(targetSide)) {
		t.Errorf("connect subsysnqn = %q, want %q", bytes.TrimRight(got, "\x00"), targetSide)
	}
	if !bytes.HasPrefix(pdu[72+512:], []byte("nqn.2014-08.org.nvmexpress:uuid:host\x00")) {
		t.Error("the host NQN field changed")
	}
}

func TestFromTarget_RewritesSUBNQNOfIdentifyControllerAcrossPDUs(t *testing.T) {
	p, c := testProxy()
	var sqe [64]byte
	sqe[0], sqe[40] = opIdentify, cnsController
	binary.LittleEndian.PutUint16(sqe[2:4], 7)
	if err := p.fromHost(c, capsule(sqe, nil)); err != nil {
		t.Fatal(err)
	}
	id := make([]byte, 4096)
	copy(id[4:], "SERIAL-B")
	copy(id[identifyNQNOff:], targetSide)
	// The data arrives in two PDUs split inside the SUBNQN field.
	first, second := c2h(7, 0, append([]byte(nil), id[:800]...), false), c2h(7, 800, append([]byte(nil), id[800:]...), true)
	for _, pdu := range [][]byte{first, second} {
		if drop, err := p.fromTarget(c, pdu); err != nil || drop {
			t.Fatal(drop, err)
		}
	}
	got := append(append([]byte(nil), first[24:]...), second[24:]...)
	if !bytes.Equal(got[identifyNQNOff:identifyNQNOff+nqnLen], field(hostSide)) {
		t.Errorf("SUBNQN = %q, want %q", bytes.TrimRight(got[identifyNQNOff:identifyNQNOff+nqnLen], "\x00"), hostSide)
	}
	if !bytes.Equal(got[:identifyNQNOff], id[:identifyNQNOff]) || !bytes.Equal(got[identifyNQNOff+nqnLen:], id[identifyNQNOff+nqnLen:]) {
		t.Error("bytes outside SUBNQN changed")
	}
	if c.identify[7] {
		t.Error("command 7 still pending after its last data PDU")
	}
}

func TestFromTarget_LeavesOtherCommandsAlone(t *testing.T) {
	p, c := testProxy()
	data := make([]byte, 4096)
	copy(data[identifyNQNOff:], targetSide)
	pdu := c2h(9, 0, append([]byte(nil), data...), true)
	if drop, err := p.fromTarget(c, pdu); err != nil || drop {
		t.Fatal(drop, err)
	}
	if !bytes.Equal(pdu[24:], data) {
		t.Error("data of a command that is not Identify Controller changed")
	}
}

// resp builds a CapsuleResp PDU completing command cid with result.
func resp(cid uint16, result uint32) []byte {
	pdu := make([]byte, 24)
	pdu[0], pdu[2] = pduCapsuleResp, 8
	binary.LittleEndian.PutUint32(pdu[4:8], 24)
	binary.LittleEndian.PutUint32(pdu[8:12], result)
	binary.LittleEndian.PutUint16(pdu[8+12:8+14], cid)
	return pdu
}

// While the hold file exists, the completion of an Asynchronous Event
// Request on the admin queue is dropped; other completions, an I/O queue's
// opcode 0x0c (Verify) and everything after the file is gone pass.
func TestFromTarget_HoldsBackAsyncEvents(t *testing.T) {
	hold := t.TempDir() + "/hold"
	connect := func(qid uint16) (*proxy, *conn) {
		p, c := testProxy()
		p.holdAEN = hold
		var sqe [64]byte
		sqe[0], sqe[4] = opFabrics, fcConnect
		binary.LittleEndian.PutUint16(sqe[connectQIDOff:], qid)
		data := make([]byte, 1024)
		copy(data[connectNQNOff:], hostSide)
		if err := p.fromHost(c, capsule(sqe, data)); err != nil {
			t.Fatal(err)
		}
		return p, c
	}
	submit := func(p *proxy, c *conn, op byte, cid uint16) {
		var sqe [64]byte
		sqe[0] = op
		binary.LittleEndian.PutUint16(sqe[2:4], cid)
		if err := p.fromHost(c, capsule(sqe, nil)); err != nil {
			t.Fatal(err)
		}
	}
	dropped := func(p *proxy, c *conn, cid uint16) bool {
		drop, err := p.fromTarget(c, resp(cid, 0x00020002))
		if err != nil {
			t.Fatal(err)
		}
		return drop
	}
	p, admin := connect(0)
	submit(p, admin, opAsyncEvent, 3)
	submit(p, admin, opIdentify, 4)
	if dropped(p, admin, 3) {
		t.Error("an event was held back without the hold file")
	}
	if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	submit(p, admin, opAsyncEvent, 5)
	if !dropped(p, admin, 5) {
		t.Error("an event passed while held")
	}
	if dropped(p, admin, 4) {
		t.Error("an Identify completion was dropped")
	}
	pio, io := connect(1)
	submit(pio, io, opAsyncEvent, 6) // Verify on an I/O queue
	if dropped(pio, io, 6) {
		t.Error("an I/O completion was dropped")
	}
}
