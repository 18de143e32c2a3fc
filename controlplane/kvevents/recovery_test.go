package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// relay is a loopback TCP relay between the subscriber and a publisher that a test can
// cut, restore, and make inject bytes between two ZMTP messages.
type relay struct {
	t      *testing.T
	addr   string
	target string

	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
	inject []byte // written downstream at the next message boundary
}

func newRelay(t *testing.T, target string) *relay {
	r := &relay{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	r.serve(ln)
	t.Cleanup(r.cut)
	return r
}

func (r *relay) serve(ln net.Listener) {
	r.mu.Lock()
	r.ln = ln
	r.mu.Unlock()
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", r.target)
			if err != nil {
				down.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, down, up)
			r.mu.Unlock()
			go func() { io.Copy(up, down); up.Close(); down.Close() }()
			go func() { r.copyFrames(down, up); up.Close(); down.Close() }()
		}
	}()
}

// copyFrames forwards publisher -> subscriber one ZMTP frame at a time (after the
// 64-byte greeting), so injected bytes land between messages.
func (r *relay) copyFrames(dst io.Writer, src io.Reader) {
	buf := make([]byte, 64)
	if _, err := io.ReadFull(src, buf); err != nil {
		return
	}
	if _, err := dst.Write(buf); err != nil {
		return
	}
	for {
		hdr := make([]byte, 2, 9)
		if _, err := io.ReadFull(src, hdr); err != nil {
			return
		}
		size := uint64(hdr[1])
		if hdr[0]&zmtpLong != 0 {
			hdr = hdr[:9]
			if _, err := io.ReadFull(src, hdr[2:]); err != nil {
				return
			}
			size = binary.BigEndian.Uint64(hdr[1:])
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(src, body); err != nil {
			return
		}
		if _, err := dst.Write(append(hdr, body...)); err != nil {
			return
		}
		const more, command = 0x01, 0x04
		if hdr[0]&(more|command) == 0 { // the end of a message
			r.mu.Lock()
			inj := r.inject
			r.inject = nil
			r.mu.Unlock()
			if inj != nil {
				dst.Write(inj)
			}
		}
	}
}

// cut closes the listener and every relayed connection.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ln != nil {
		r.ln.Close()
		r.ln = nil
	}
	for _, c := range r.conns {
		c.Close()
	}
	r.conns = nil
}

// restore listens on the same address again.
func (r *relay) restore() {
	ln, err := net.Listen("tcp", r.addr)
	if err != nil {
		r.t.Fatalf("relay restore: %v", err)
	}
	r.serve(ln)
}

// seqLog is a Handler that keeps the sequence numbers applied, per publisher epoch.
type seqLog struct {
	mu        sync.Mutex
	epochs    [][]uint64 // applied seqs; a Restart starts a new epoch
	gaps      []string
	connected bool
	ups       int
}

func newSeqLog() *seqLog { return &seqLog{epochs: [][]uint64{nil}} }

func (l *seqLog) Batch(id StreamID, seq uint64, b *Batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epochs[len(l.epochs)-1] = append(l.epochs[len(l.epochs)-1], seq)
}
func (l *seqLog) Restart(id StreamID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.epochs = append(l.epochs, nil)
}
func (l *seqLog) Gap(id StreamID, from, to uint64, replayed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.gaps = append(l.gaps, fmt.Sprintf("%d-%d replayed=%v", from, to, replayed))
}
func (l *seqLog) DecodeError(id StreamID, err error) {}
func (l *seqLog) Connected(id StreamID, up bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.connected = up
	if up {
		l.ups++
	}
}

func (l *seqLog) epochsN() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.epochs)
}

// has says whether the current epoch applied exactly 0..n-1, in order.
func (l *seqLog) has(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.epochs[len(l.epochs)-1]
	if len(e) != n {
		return false
	}
	for i, s := range e {
		if s != uint64(i) {
			return false
		}
	}
	return true
}

func (l *seqLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for i, e := range l.epochs {
		fmt.Fprintf(&b, "epoch %d: %v\n", i, e)
	}
	fmt.Fprintf(&b, "gaps %v, connected %v, connections %d", l.gaps, l.connected, l.ups)
	return b.String()
}

// waitUntil polls cond until the deadline; it returns how long it took.
func waitUntil(t *testing.T, within time.Duration, what func() string, cond func() bool, tick func()) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what())
		}
		if tick != nil {
			tick()
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// A subscription resumes the engine's events within 5 s after it lost its stream, and
// the batches published meanwhile are replayed: no sequence number is missing.
func TestStreamRecovers(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fault breaks the stream; heal (if any) ends the fault. The publisher may
		// be replaced (a restart), so both get and return it.
		fault func(r *relay, p *publisher.Publisher) *publisher.Publisher
		heal  func(r *relay, p *publisher.Publisher) *publisher.Publisher
		// restart: the engine restarted, its sequence numbers start again at 0.
		restart bool
	}{
		{name: "frame above the cap", fault: func(r *relay, p *publisher.Publisher) *publisher.Publisher {
			hdr := []byte{zmtpLong, 0, 0, 0, 0, 0, 0, 0, 0}
			binary.BigEndian.PutUint64(hdr[1:], MaxMessageBytes+1)
			r.mu.Lock()
			r.inject = hdr
			r.mu.Unlock()
			p.Publish(stored(999)) // carries the injection to the subscriber
			return p
		}},
		{name: "network cut", fault: func(r *relay, p *publisher.Publisher) *publisher.Publisher {
			r.cut()
			return p
		}, heal: func(r *relay, p *publisher.Publisher) *publisher.Publisher {
			r.restore()
			return p
		}},
		{name: "publisher restart", restart: true, fault: func(r *relay, p *publisher.Publisher) *publisher.Publisher {
			ep, rep := p.Endpoint(), p.ReplayEndpoint()
			p.Close()
			star := func(e string) string { return strings.Replace(e, "127.0.0.1", "*", 1) }
			return openPub(t, star(ep), star(rep), false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := openPub(t, "tcp://*:0", "tcp://*:0", false)
			defer func() { pub.Close() }()
			r := newRelay(t, strings.TrimPrefix(pub.Endpoint(), "tcp://"))
			log := newSeqLog()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				Subscribe(ctx, Source{ID: StreamID{Replica: "e"}, Endpoint: "tcp://" + r.addr, Replay: pub.ReplayEndpoint()}, log,
					Options{Logger: quiet()})
			}()
			defer func() { cancel(); <-done }()
			for !pub.Subscribed() {
				time.Sleep(5 * time.Millisecond)
			}
			// A live stream: publish until the first batches arrive (slow joiner).
			n := 0
			waitUntil(t, 10*time.Second, func() string { return "first batches: " + log.String() }, func() bool { return log.has(n) && n >= 5 }, func() {
				if !log.has(n) && n > 0 {
					return
				}
				pub.Publish(stored(uint64(n)))
				n++
			})
			if tc.name == "frame above the cap" {
				n++ // the batch that carried the injected frame header
			}
			pub = tc.fault(r, pub)
			if tc.restart {
				n = 0
			}
			// Events published while the stream is down are lost live...
			waitUntil(t, 5*time.Second, func() string { return "connected=false: " + log.String() }, func() bool { log.mu.Lock(); defer log.mu.Unlock(); return !log.connected || tc.restart }, nil)
			for range 5 {
				pub.Publish(stored(uint64(100 + n)))
				n++
			}
			if tc.heal != nil {
				pub = tc.heal(r, pub)
			}
			// ...and replayed once it is back, within 5 s (a restart needs a live batch
			// to be noticed, so one is published per wait step there).
			epochs := 1
			if tc.restart {
				epochs = 2 // the restart was noticed: the new engine's batches are a new stream
			}
			took := waitUntil(t, 5*time.Second, func() string { return "all batches after the fault: " + log.String() }, func() bool { return log.epochsN() == epochs && log.has(n) }, func() {
				if tc.restart {
					pub.Publish(stored(uint64(100 + n)))
					n++
				}
			})
			log.mu.Lock()
			up := log.connected
			log.mu.Unlock()
			if !up {
				t.Fatalf("connected=false after recovery:\n%s", log)
			}
			t.Logf("resumed and replayed in %v: %s", took.Round(time.Millisecond), log)
		})
	}
}
