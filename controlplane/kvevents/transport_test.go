package kvevents

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// zmtpGreetingBytes is a ZMTP 3.0 NULL-mechanism greeting from a client.
func zmtpGreetingBytes() []byte {
	g := make([]byte, zmtpGreeting)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:], "NULL")
	return g
}

// zmtpReady is the READY command of a PUB socket.
func zmtpReady() []byte {
	body := []byte("\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB")
	return append([]byte{0x04, byte(len(body))}, body...)
}

func longHeader(size uint64) []byte {
	h := make([]byte, 9)
	h[0] = zmtpLong
	binary.BigEndian.PutUint64(h[1:], size)
	return h
}

// Frames up to the cap pass byte for byte, short and long; the header of a larger one is
// refused before its last byte is delivered, even when it arrives in pieces.
func TestFrameCapRefusesAnOversizedFrame(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	fc := newFrameCap(server, 1000, 0)
	go func() {
		client.Write(zmtpGreetingBytes())
		client.Write([]byte{0x01, 3, 'a', 'b', 'c'})                  // short frame, MORE
		client.Write(append(longHeader(1000), make([]byte, 1000)...)) // long frame at the cap
		h := longHeader(1001)
		client.Write(h[:4]) // the oversized header in two pieces
		client.Write(h[4:])
	}()
	want := append(append(append(zmtpGreetingBytes(), 0x01, 3, 'a', 'b', 'c'), longHeader(1000)...), make([]byte, 1000)...)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(fc, got); err != nil || string(got) != string(want) {
		t.Fatalf("err %v; the frames within the cap were not passed unchanged", err)
	}
	var hdr [9]byte
	n, err := io.ReadFull(fc, hdr[:])
	if err == nil || !strings.Contains(err.Error(), "1001 bytes") || n > 4 {
		t.Fatalf("read %d header bytes, err %v: want the oversized header refused", n, err)
	}
	if _, err := fc.Read(hdr[:]); err == nil {
		t.Fatal("the connection must stay failed")
	}
}

// Reads are buffered: what precedes a bad frame in the same read is still
// delivered, none of the bad frame is, and bodies larger than the buffer pass through
// unchanged whichever way zmq4 reads them.
func TestFrameCapBuffersReads(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	fc := newFrameCap(server, 1<<20, 0)
	big := make([]byte, 3*capBuffer/2)
	for i := range big {
		big[i] = byte(i * 7)
	}
	var stream []byte
	stream = append(stream, zmtpGreetingBytes()...)
	stream = append(stream, 0x01, 2, 'k', 'v')
	stream = append(append(stream, longHeader(uint64(len(big)))...), big...)
	good := len(stream)
	stream = append(stream, 0x00, 1, 'x')
	go func() {
		client.Write(stream)                                             // one write: many frames, one read
		client.Write(append([]byte{0x00, 1, 'y'}, longHeader(1<<21)...)) // a good frame, then a bad one
	}()
	got := make([]byte, 64+4+9)
	if _, err := io.ReadFull(fc, got); err != nil || string(got) != string(stream[:len(got)]) {
		t.Fatalf("err %v: headers not passed unchanged", err)
	}
	body := make([]byte, len(big)) // larger than the buffer: partly copied, partly direct
	if _, err := io.ReadFull(fc, body); err != nil || string(body) != string(big) {
		t.Fatalf("err %v: the large body was not passed unchanged", err)
	}
	rest := make([]byte, len(stream)-good+3)
	if _, err := io.ReadFull(fc, rest); err != nil || string(rest) != "\x00\x01x\x00\x01y" {
		t.Fatalf("err %v, got %q: the frames before the bad one must pass", err, rest)
	}
	var hdr [9]byte
	n, err := io.ReadFull(fc, hdr[:])
	if err == nil || !strings.Contains(err.Error(), "exceeds") || n != 0 {
		t.Fatalf("read %d bytes of the oversized frame, err %v", n, err)
	}
}

// A peer on the bound socket that completes the ZMTP handshake and then announces a
// 2^62-byte frame loses its connection; without the cap zmq4 would try to allocate the
// frame and the process would die. Engines publishing afterwards are still heard.
func TestListenSurvivesAHostileZMTPPeer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	addr, done, err := Listen(ctx, "tcp://127.0.0.1:0", func(topic string) (Source, bool) {
		return Source{ID: StreamID{"r1", 0}}, topic == "kv@10.0.0.1@m"
	}, rec, func(string) {}, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	hostile, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer hostile.Close()
	if _, err := hostile.Write(append(append(zmtpGreetingBytes(), zmtpReady()...), longHeader(1<<62)...)); err != nil {
		t.Fatal(err)
	}
	hostile.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := io.Copy(io.Discard, hostile); err != nil {
		t.Fatalf("the control plane did not close the hostile connection: %v", err)
	}

	p, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + addr.String(),
		Topic: "kv@10.0.0.1@m", BufferSteps: 10, HWM: 100}, publisher.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitSubscribed(t, p)
	mustPublish(t, p, stored(1))
	rec.waitFor(t, "batch 0 BlockStored")
	cancel()
	<-done
}
