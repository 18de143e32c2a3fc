package kvevents

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// recorder is a Handler that writes down what it is told.
type recorder struct {
	mu  sync.Mutex
	log []string
}

func (r *recorder) add(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

func (r *recorder) Batch(id StreamID, seq uint64, b *Batch) {
	var kinds []string
	for _, e := range b.Events {
		kinds = append(kinds, e.Kind.String())
	}
	r.add("batch %d %s", seq, strings.Join(kinds, ","))
}
func (r *recorder) Restart(id StreamID) { r.add("restart") }
func (r *recorder) Gap(id StreamID, from, to uint64, replayed bool) {
	r.add("gap %d-%d replayed=%v", from, to, replayed)
}
func (r *recorder) DecodeError(id StreamID, err error) { r.add("decode error") }
func (r *recorder) Connected(id StreamID, up bool)     {}

func (r *recorder) lines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.log...)
}

// waitFor polls until the recorder's log ends with want (generous deadline; no timing
// assertions).
func (r *recorder) waitFor(t *testing.T, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		l := r.lines()
		if len(l) >= len(want) && strings.Join(l[len(l)-len(want):], "\n") == strings.Join(want, "\n") {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("log\n%s\ndoes not end with\n%s", strings.Join(r.lines(), "\n"), strings.Join(want, "\n"))
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func openPub(t *testing.T, endpoint, replay string, legacy bool) *publisher.Publisher {
	t.Helper()
	cfg := publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: endpoint, ReplayEndpoint: replay, BufferSteps: 100, HWM: 10000}
	p, err := publisher.Open(cfg, publisher.Options{Encoding: sim.Map, LegacyReplay: legacy, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func stored(h uint64) sim.Batch {
	return sim.Batch{TS: 1, Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{h}, TokenIDs: make([]uint32, 16), BlockSize: 16, Medium: "GPU"}}}
}

func removed(h uint64) sim.Batch {
	return sim.Batch{TS: 1, Events: []sim.Event{{Kind: sim.BlockRemoved, BlockHashes: []uint64{h}, Medium: "GPU"}}}
}

var cleared = sim.Batch{TS: 1, Events: []sim.Event{{Kind: sim.AllBlocksCleared}}}

func mustPublish(t *testing.T, p *publisher.Publisher, b sim.Batch) {
	t.Helper()
	if _, err := p.Publish(b); err != nil {
		t.Fatal(err)
	}
}

// waitSubscribed avoids ZeroMQ's slow-joiner loss: a PUB drops messages until the
// subscription reached it.
func waitSubscribed(t *testing.T, p *publisher.Publisher) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !p.Subscribed() {
		if time.Now().After(deadline) {
			t.Fatal("subscription never reached the publisher")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSubscriberLiveGapReplayRestart(t *testing.T) {
	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy_replay=%v", legacy), func(t *testing.T) {
			p := openPub(t, "tcp://*:0", "tcp://*:0", legacy)
			defer func() { p.Close() }()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec := &recorder{}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Subscribe(ctx, Source{ID: StreamID{"r1", 0}, Endpoint: p.Endpoint(), Replay: p.ReplayEndpoint()}, rec,
					Options{Logger: quiet(), RetryInterval: 20 * time.Millisecond})
			}()
			waitSubscribed(t, p)

			mustPublish(t, p, stored(1))
			mustPublish(t, p, removed(1))
			mustPublish(t, p, cleared)
			rec.waitFor(t, "batch 0 BlockStored", "batch 1 BlockRemoved", "batch 2 AllBlocksCleared")

			// Lost messages: the subscriber sees seq 6 after 2, replays 3..5 from the
			// engine's buffer, then applies 6 (and nothing twice).
			p.SetPaused(true)
			mustPublish(t, p, stored(2))
			mustPublish(t, p, stored(3))
			mustPublish(t, p, removed(2))
			p.SetPaused(false)
			mustPublish(t, p, stored(4))
			rec.waitFor(t, "gap 3-6 replayed=true", "batch 3 BlockStored", "batch 4 BlockStored", "batch 5 BlockRemoved", "batch 6 BlockStored")

			// The engine restarts: a new process on the same port counts from 0.
			ep := p.Endpoint()
			port := ep[strings.LastIndexByte(ep, ':')+1:]
			p.Close()
			p = openPub(t, "tcp://*:"+port, "", legacy)
			waitSubscribed(t, p)
			mustPublish(t, p, stored(5))
			rec.waitFor(t, "restart", "batch 0 BlockStored")
			cancel()
			<-done
		})
	}
}

// A control plane that starts (or restarts) beside an engine that has been running: the
// first connection replays the engine's buffer at once, although the engine publishes
// nothing more, and the stream counts as connected only once that is applied.
func TestSubscriberFirstConnectionReplaysTheBuffer(t *testing.T) {
	p := openPub(t, "tcp://*:0", "tcp://*:0", false)
	defer p.Close()
	mustPublish(t, p, stored(1))
	mustPublish(t, p, stored(2))
	mustPublish(t, p, removed(1))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &connRecorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Subscribe(ctx, Source{ID: StreamID{"r1", 0}, Endpoint: p.Endpoint(), Replay: p.ReplayEndpoint()}, rec,
			Options{Logger: quiet(), RetryInterval: 20 * time.Millisecond})
	}()
	rec.waitFor(t, "batch 0 BlockStored", "batch 1 BlockStored", "batch 2 BlockRemoved", "connected")
	// Live batches follow on, nothing twice.
	waitSubscribed(t, p)
	mustPublish(t, p, stored(3))
	rec.waitFor(t, "connected", "batch 3 BlockStored")
	cancel()
	<-done
}

// connRecorder is a recorder that also logs a stream's connection.
type connRecorder struct{ recorder }

func (r *connRecorder) Connected(id StreamID, up bool) {
	if up {
		r.add("connected")
	}
}

func TestSubscriberGapWithoutReplay(t *testing.T) {
	p := openPub(t, "tcp://*:0", "", false)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	go Subscribe(ctx, Source{ID: StreamID{"r1", 0}, Endpoint: p.Endpoint()}, rec, Options{Logger: quiet()})
	waitSubscribed(t, p)
	mustPublish(t, p, stored(1))
	rec.waitFor(t, "batch 0 BlockStored")
	p.SetPaused(true)
	mustPublish(t, p, stored(2))
	p.SetPaused(false)
	mustPublish(t, p, stored(3))
	rec.waitFor(t, "gap 1-2 replayed=false", "batch 2 BlockStored")
}

// A replay endpoint that is down: the gap is reported unrecovered, and the stream
// goes on.
func TestSubscriberReplayUnreachable(t *testing.T) {
	p := openPub(t, "tcp://*:0", "", false)
	defer p.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "tcp://" + ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	go Subscribe(ctx, Source{ID: StreamID{"r1", 0}, Endpoint: p.Endpoint(), Replay: dead}, rec, Options{Logger: quiet(), ReplayTimeout: 500 * time.Millisecond})
	waitSubscribed(t, p)
	mustPublish(t, p, stored(1))
	rec.waitFor(t, "batch 0 BlockStored")
	p.SetPaused(true)
	mustPublish(t, p, stored(2))
	p.SetPaused(false)
	mustPublish(t, p, stored(3))
	rec.waitFor(t, "gap 1-2 replayed=false", "batch 2 BlockStored")
}

// Central topology: we bind, engines connect (llm-d's legacy layout), told apart by topic.
func TestListenCentral(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	var unknownMu sync.Mutex
	var unknown []string
	addr, done, err := Listen(ctx, "tcp://127.0.0.1:0", func(topic string) (Source, bool) {
		if topic == "kv@10.0.0.1@m" {
			return Source{ID: StreamID{"r1", 0}}, true
		}
		return Source{}, false
	}, rec, func(topic string) { unknownMu.Lock(); unknown = append(unknown, topic); unknownMu.Unlock() }, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	cfg := publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + addr.String(), Topic: "kv@10.0.0.1@m", BufferSteps: 10, HWM: 100}
	p, err := publisher.Open(cfg, publisher.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	other, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + addr.String(), Topic: "kv@10.9.9.9@m", BufferSteps: 10, HWM: 100}, publisher.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	waitSubscribed(t, p)
	waitSubscribed(t, other)
	mustPublish(t, p, stored(1))
	mustPublish(t, other, stored(1))
	mustPublish(t, p, removed(1))
	rec.waitFor(t, "batch 0 BlockStored", "batch 1 BlockRemoved")
	deadline := time.Now().Add(20 * time.Second)
	for {
		unknownMu.Lock()
		n := len(unknown)
		unknownMu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the unknown topic was not counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
}

// gated records batches per stream; r1's first batch waits for release.
type gated struct {
	recorder
	blocked, release chan struct{}
	once             sync.Once
}

func (g *gated) Batch(id StreamID, seq uint64, b *Batch) {
	if id.Replica == "r1" {
		g.once.Do(func() { close(g.blocked); <-g.release })
	}
	g.add("%s %d", id.Replica, seq)
}

// With one bound socket for every engine, each stream is applied by a goroutine of its
// own: a stream whose handler is busy holds up no other, and every stream's
// batches stay in their order.
func TestListenAppliesStreamsInParallelEachInOrder(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g := &gated{blocked: make(chan struct{}), release: make(chan struct{})}
	addr, done, err := Listen(ctx, "tcp://127.0.0.1:0", func(topic string) (Source, bool) {
		switch topic {
		case "kv@10.0.0.1@m":
			return Source{ID: StreamID{"r1", 0}}, true
		case "kv@10.0.0.2@m":
			return Source{ID: StreamID{"r2", 0}}, true
		}
		return Source{}, false
	}, g, func(string) {}, Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	var pubs []*publisher.Publisher
	for _, topic := range []string{"kv@10.0.0.1@m", "kv@10.0.0.2@m"} {
		p, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + addr.String(),
			Topic: topic, BufferSteps: 10, HWM: 100}, publisher.Options{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		waitSubscribed(t, p)
		pubs = append(pubs, p)
	}
	mustPublish(t, pubs[0], stored(1))
	<-g.blocked // r1's handler is busy with batch 0...
	for i := range 3 {
		mustPublish(t, pubs[0], removed(uint64(i)))
	}
	mustPublish(t, pubs[1], stored(1))
	mustPublish(t, pubs[1], removed(1))
	g.waitFor(t, "r2 0", "r2 1") // ...and r2 is applied meanwhile
	close(g.release)
	g.waitFor(t, "r1 0", "r1 1", "r1 2", "r1 3")
	cancel()
	<-done
}

// Bad messages are counted and skipped; the stream goes on.
func TestHandleLiveSkipsBadInput(t *testing.T) {
	rec := &recorder{}
	st := newStream(Source{ID: StreamID{"r", 0}})
	seq := func(n uint64) []byte { return []byte{0, 0, 0, 0, 0, 0, 0, byte(n)} }
	good := []byte{0x93, 0xcb, 0x41, 0xd9, 0x54, 0xfc, 0x40, 0x20, 0, 0, 0x90, 0}
	ctx := context.Background()
	o := Options{}.withDefaults()
	st.handleLive(ctx, [][]byte{nil, seq(0), good}, rec, o)
	st.handleLive(ctx, [][]byte{nil, seq(1), []byte("garbage")}, rec, o)
	st.handleLive(ctx, [][]byte{nil, []byte{1}, good}, rec, o)
	st.handleLive(ctx, [][]byte{good}, rec, o)
	st.handleLive(ctx, [][]byte{nil, seq(2), good}, rec, o)
	want := []string{"batch 0 ", "decode error", "decode error", "decode error", "batch 2 "}
	if got := rec.lines(); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("got %q, want %q", got, want)
	}
}
