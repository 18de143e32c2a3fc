package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
)

// StreamID names one event publisher: a replica and its data-parallel rank (each DP rank
// runs its own publisher on port + rank, docs/kv-events.md, "Data-parallel ranks").
type StreamID struct {
	Replica string
	Rank    int
}

func (id StreamID) String() string { return fmt.Sprintf("%s/dp%d", id.Replica, id.Rank) }

// Handler receives what a subscription learns, in order, from one goroutine per
// subscription. Implementations must not block for long.
type Handler interface {
	// Batch applies one batch; seq is its sequence number. Batches of a stream arrive in
	// increasing seq order (replayed ones included) with every gap reported first.
	Batch(id StreamID, seq uint64, b *Batch)
	// Restart: the sequence went backwards, so the publisher (the engine) restarted and
	// its cache is empty.
	Restart(id StreamID)
	// Gap: batches [from, to) were lost; replayed says whether a replay recovered them.
	// When it did not, the stream's token-domain state is uncertain.
	Gap(id StreamID, from, to uint64, replayed bool)
	// DecodeError counts a message that could not be decoded (it is skipped): malformed,
	// or over one of the bounds of limits.go (ErrOverLimit; DropReason names it), which
	// a replay's reply can be too.
	DecodeError(id StreamID, err error)
	// Connected reports the stream's own state: true once a subscription's ZMTP
	// handshake completed and what the engine's replay buffer holds since the last
	// batch applied (since its start, on the first connection) is applied (or, on a
	// bound socket, a peer's first message arrived), false when that connection is lost.
	Connected(id StreamID, up bool)
}

// Source is one publisher to subscribe to (the engine binds, we connect).
type Source struct {
	ID StreamID
	// Endpoint is the engine's PUB endpoint, e.g. tcp://10.0.0.7:5557.
	Endpoint string
	// Topic is the subscription prefix ("" = everything).
	Topic string
	// Replay is the engine's ROUTER replay endpoint, "" when not configured.
	Replay string
}

// Options tune subscriptions; zero values take the defaults.
type Options struct {
	// ReplayTimeout bounds one replay request (until the END marker).
	ReplayTimeout time.Duration
	// RetryInterval is the first wait before reconnecting a lost or failed stream; it
	// doubles per failed attempt up to MaxRetryInterval (with +-20% jitter), and starts
	// over once a connection has lived StableAfter.
	RetryInterval    time.Duration
	MaxRetryInterval time.Duration
	StableAfter      time.Duration
	// HandshakeTimeout bounds a connection's ZMTP greeting and handshake (a peer that
	// accepts TCP and then says nothing would otherwise hold the dial, or a bound
	// socket's connection, for good).
	HandshakeTimeout time.Duration
	// PeerCheck, on a bound socket (Listen), is asked about every message's topic
	// with the address of the peer that sent it; a false drops the message and the
	// peer's connection before the message's body is read (zsub.go). nil accepts every
	// peer.
	PeerCheck PeerCheck
	Logger    *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.ReplayTimeout <= 0 {
		o.ReplayTimeout = 2 * time.Second
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = 100 * time.Millisecond
	}
	if o.MaxRetryInterval <= 0 {
		o.MaxRetryInterval = 2 * time.Second
	}
	if o.StableAfter <= 0 {
		o.StableAfter = 5 * time.Second
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// endSeq is the replay end marker: (-1).to_bytes(8, "big", signed=True).
const endSeq = ^uint64(0)

// stream tracks one publisher's sequence numbers.
type stream struct {
	src     Source
	applied int64  // highest seq applied (live or replayed); -1 before the first
	live    int64  // highest seq received live; -1 before the first
	lastSum uint64 // xxhash of the last applied batch's payload, with a replay endpoint (catchUp)
	dec     *Decoder
	batch   Batch
}

func newStream(src Source) *stream {
	return &stream{src: src, applied: -1, live: -1, dec: NewDecoder()}
}

// Subscribe connects to src's publisher as a SUB (zsub.go) and feeds h until ctx ends.
// Bad input is counted and skipped. A lost stream (the peer closed, the network cut it,
// a frame above the cap, a failed handshake) is dialled again after a capped
// exponential backoff, and the batches published meanwhile are fetched from the replay
// endpoint before live ones are applied. The first connection replays the engine's
// buffer from its start: a control plane that (re)starts beside a running engine
// rebuilds what the engine cached without waiting for the engine's next batch.
func Subscribe(ctx context.Context, src Source, h Handler, o Options) {
	o = o.withDefaults()
	st := newStream(src)
	wait := o.RetryInterval
	for ctx.Err() == nil {
		sub, err := dialSub(ctx, src.Endpoint, src.Topic, o.HandshakeTimeout, MaxMessageBytes)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			o.Logger.Debug("kv events: connect failed, retrying", "stream", src.ID, "endpoint", src.Endpoint, "in", wait, "err", err)
			sleep(ctx, jitter(wait))
			wait = min(2*wait, o.MaxRetryInterval)
			continue
		}
		up := time.Now()
		st.catchUp(ctx, h, o) // what was published while the stream was down, or ever
		h.Connected(src.ID, true)
		err = readStream(ctx, sub, func(frames [][]byte) { st.handleLive(ctx, frames, h, o) })
		sub.Close()
		h.Connected(src.ID, false)
		if ctx.Err() != nil {
			return
		}
		if time.Since(up) >= o.StableAfter {
			wait = o.RetryInterval
		}
		o.Logger.Warn("kv events: stream lost, reconnecting", "stream", src.ID, "endpoint", src.Endpoint, "in", wait, "err", err)
		sleep(ctx, jitter(wait))
		wait = min(2*wait, o.MaxRetryInterval)
	}
}

// jitter spreads d by +-20% so subscriptions that lost one engine do not redial in step.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// readStream hands a subscription's messages to onMsg, in order, until ctx ends (nil)
// or the connection fails (its error).
func readStream(ctx context.Context, sub *zsub, onMsg func([][]byte)) error {
	stop := context.AfterFunc(ctx, func() { sub.Close() })
	defer stop()
	for {
		frames, err := sub.recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		onMsg(frames)
	}
}

// catchUp runs after each connection: the batches published while the stream was down
// (before the first connection: all the engine still buffers) are replayed now rather
// than when (if ever) the next live batch reveals the gap. The
// replay starts at the last batch applied, whose payload must be the one applied: an
// engine that restarted and has already published past our sequence number would
// otherwise pass its new batches off as the old stream's.
func (st *stream) catchUp(ctx context.Context, h Handler, o Options) {
	if st.src.Replay == "" {
		return
	}
	got := st.replay(ctx, st.applied, h, o)
	if len(got) > 0 && got[0].Err == nil && int64(got[0].Seq) == st.applied && xxhash.Sum64(got[0].Payload) != st.lastSum {
		h.Restart(st.src.ID)
		st.applied, st.live = -1, -1
		got = st.replay(ctx, 0, h, o)
	}
	from := st.applied + 1
	first := -1
	for i, r := range got {
		if r.Err == nil && int64(r.Seq) >= from {
			first = i
			break
		}
	}
	if first < 0 {
		return // nothing was published meanwhile (or a restart that the next live batch shows)
	}
	start := int64(got[first].Seq)
	next := start
	for _, r := range got[first:] {
		if r.Err != nil || int64(r.Seq) != next {
			break
		}
		next++
	}
	// [from, start) is older than the engine's buffer: lost. [start, next) is replayed.
	if st.applied >= 0 {
		h.Gap(st.src.ID, uint64(from), uint64(next), start == from)
	}
	for _, r := range got[first:] {
		if int64(r.Seq) >= next || r.Err != nil {
			break
		}
		st.apply(r.Seq, r.Payload, h)
	}
}

// replay asks st's replay endpoint for the batches from from on. A reply that grew past
// MaxReplayBytes is counted as a dropped message; what came before is returned.
func (st *stream) replay(ctx context.Context, from int64, h Handler, o Options) []Replayed {
	rctx, cancel := context.WithTimeout(ctx, o.ReplayTimeout)
	defer cancel()
	got, err := Replay(rctx, st.src.Replay, uint64(max(from, 0)))
	if err != nil {
		o.Logger.Warn("kv events: replay failed", "stream", st.src.ID, "from", from, "err", err)
		if errors.Is(err, ErrOverLimit) {
			h.DecodeError(st.src.ID, err)
		}
	}
	return got
}

// splitFrames accepts [topic, seq, payload] (live, and replies of vLLM >= 0.26) and
// [seq, payload] (replies of older vLLM and SGLang).
func splitFrames(frames [][]byte) (topic []byte, seq uint64, payload []byte, err error) {
	switch len(frames) {
	case 3:
		topic, frames = frames[0], frames[1:]
	case 2:
	default:
		return nil, 0, nil, fmt.Errorf("%w: %d frames, want 3", ErrMalformed, len(frames))
	}
	if len(frames[0]) != 8 {
		return nil, 0, nil, fmt.Errorf("%w: sequence frame of %d bytes", ErrMalformed, len(frames[0]))
	}
	return topic, binary.BigEndian.Uint64(frames[0]), frames[1], nil
}

// handleLive processes one live message: restart and gap detection, replay, apply.
func (st *stream) handleLive(ctx context.Context, frames [][]byte, h Handler, o Options) {
	_, seq, payload, err := splitFrames(frames)
	if err != nil {
		h.DecodeError(st.src.ID, err)
		return
	}
	if seq == endSeq || seq > 1<<62 {
		h.DecodeError(st.src.ID, fmt.Errorf("%w: sequence %d", ErrMalformed, seq))
		return
	}
	s := int64(seq)
	if st.live >= 0 && s <= st.live {
		// The publisher counts from 0 again: the engine restarted with an empty cache.
		h.Restart(st.src.ID)
		st.applied, st.live = -1, -1
	}
	st.live = s
	if s <= st.applied {
		return // already applied from a replay
	}
	if from := st.applied + 1; s > from {
		var got []Replayed
		if st.src.Replay != "" {
			got = st.replay(ctx, from, h, o)
		}
		// Recovered when the replay holds every batch from `from` up to the live one.
		next := from
		for _, r := range got {
			if r.Err == nil && int64(r.Seq) == next {
				next++
			} else if r.Err != nil || int64(r.Seq) > next {
				break
			}
		}
		// Before the first message nothing was known, so nothing became uncertain;
		// a replay from 0 there is a best-effort rebuild (e.g. after our restart).
		if st.applied >= 0 {
			h.Gap(st.src.ID, uint64(from), seq, next >= s)
		}
		for _, r := range got {
			if r.Err != nil {
				h.DecodeError(st.src.ID, r.Err)
			} else if int64(r.Seq) > st.applied {
				st.apply(r.Seq, r.Payload, h)
			}
		}
		if s <= st.applied {
			return // the replay already held it
		}
	}
	st.apply(seq, payload, h)
}

func (st *stream) apply(seq uint64, payload []byte, h Handler) {
	st.applied = int64(seq)
	if st.src.Replay != "" {
		// Only catchUp reads it, and only with a replay endpoint. xxhash, because it
		// sums every payload: FNV-64a was a visible share of ingest's CPU.
		st.lastSum = xxhash.Sum64(payload)
	}
	defer st.batch.release() // a big batch's memory goes as soon as it is applied
	if err := st.dec.Decode(payload, &st.batch); err != nil {
		h.DecodeError(st.src.ID, err)
		if errors.Is(err, ErrOverLimit) {
			// A batch no engine step makes: its events are lost, as in a gap.
			h.Gap(st.src.ID, seq, seq+1, false)
		}
		return
	}
	h.Batch(st.src.ID, seq, &st.batch)
}

// Resolver maps a topic received on a central (bound) socket to its source.
type Resolver func(topic string) (Source, bool)

// Listen binds endpoint for engines that connect to us (llm-d's topology), reads each
// connection as a SUB (zsub.go) and feeds h, telling streams apart by topic; messages
// whose topic does not resolve are counted by unknown and dropped. It returns the bound
// address (tests bind port 0) and a channel closed when serving stops, after ctx ends.
//
// A goroutine per connection reads it and hands each message to its stream's own
// goroutine, so streams are decoded and applied in parallel, each in order, as
// subscriptions that dial are. With o.PeerCheck, a message whose topic its
// peer's address may not publish fails that connection before its body is read.
func Listen(ctx context.Context, endpoint string, resolve Resolver, h Handler, unknown func(topic string), o Options) (net.Addr, <-chan struct{}, error) {
	o = o.withDefaults()
	network, addr, err := zmtpAddr(endpoint)
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, nil, fmt.Errorf("kv events: listen %s: %w", endpoint, err)
	}
	l := &listener{ctx: ctx, resolve: resolve, h: h, unknown: unknown, o: o,
		streams: map[StreamID]chan sourced{}, conns: map[net.Conn]struct{}{}}
	stop := context.AfterFunc(ctx, func() { ln.Close(); l.closeConns() })
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer stop()
		l.accept(ln)
		l.readers.Wait()
		l.mu.Lock()
		for _, q := range l.streams {
			close(q)
		}
		l.mu.Unlock()
		l.appliers.Wait()
	}()
	return ln.Addr(), done, nil
}

// listener is a bound socket's state: its connections and its streams' queues.
type listener struct {
	ctx      context.Context
	resolve  Resolver
	h        Handler
	unknown  func(string)
	o        Options
	readers  sync.WaitGroup // a goroutine per connection
	appliers sync.WaitGroup // a goroutine per stream
	mu       sync.Mutex
	streams  map[StreamID]chan sourced
	conns    map[net.Conn]struct{}
	closed   bool
}

func (l *listener) accept(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			l.o.Logger.Debug("kv events: accept", "err", err)
			sleep(l.ctx, 10*time.Millisecond) // out of descriptors and the like
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			c.Close()
			continue
		}
		l.conns[c] = struct{}{}
		l.readers.Add(1)
		l.mu.Unlock()
		go l.read(c)
	}
}

func (l *listener) closeConns() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
}

// read serves one engine's connection until it fails or the socket closes.
func (l *listener) read(c net.Conn) {
	defer l.readers.Done()
	defer func() {
		l.mu.Lock()
		delete(l.conns, c)
		l.mu.Unlock()
		c.Close()
	}()
	s, err := startSub(l.ctx, c, "", l.o.HandshakeTimeout, MaxMessageBytes)
	if err != nil {
		l.o.Logger.Debug("kv events: handshake", "peer", c.RemoteAddr(), "err", err)
		return
	}
	if l.o.PeerCheck != nil {
		remote := c.RemoteAddr()
		s.allowed = func(topic []byte) bool { return l.o.PeerCheck(topic[:min(len(topic), maxTopic)], remote) }
	}
	for {
		frames, err := s.recv()
		if err != nil {
			if l.ctx.Err() == nil {
				l.o.Logger.Debug("kv events: recv", "peer", c.RemoteAddr(), "err", err)
			}
			return
		}
		topic, _, _, err := splitFrames(frames)
		if err != nil {
			l.unknown("")
			continue
		}
		src, ok := l.resolve(string(topic))
		if !ok {
			l.unknown(string(topic))
			continue
		}
		q := l.queue(src)
		if q == nil {
			return
		}
		select {
		case q <- sourced{src, cloneFrames(frames)}: // the reader's buffer is reused
		case <-l.ctx.Done():
			return
		}
	}
}

// queue is src's stream queue, its applier started on first use; nil once closed.
func (l *listener) queue(src Source) chan sourced {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	q := l.streams[src.ID]
	if q == nil {
		q = make(chan sourced, streamQueue)
		l.streams[src.ID] = q
		l.appliers.Add(1)
		go func() {
			defer l.appliers.Done()
			serveStream(l.ctx, src, q, l.h, l.o)
		}()
	}
	return q
}

// cloneFrames copies a message's frames into one new array.
func cloneFrames(frames [][]byte) [][]byte {
	n := 0
	for _, f := range frames {
		n += len(f)
	}
	buf := make([]byte, 0, n)
	out := make([][]byte, len(frames))
	for i, f := range frames {
		buf = append(buf, f...)
		out[i] = buf[len(buf)-len(f) : len(buf) : len(buf)]
	}
	return out
}

// streamQueue bounds the messages waiting for one stream of a bound socket; when it is
// full the socket's reader waits (as it did for every stream before).
const streamQueue = 16

// sourced is a message of a bound socket and the source its topic resolved to.
type sourced struct {
	src    Source
	frames [][]byte
}

// serveStream applies one stream's messages from a bound socket, in order, until q is
// closed; after ctx ends it drops them.
func serveStream(ctx context.Context, src Source, q <-chan sourced, h Handler, o Options) {
	st := newStream(src)
	h.Connected(src.ID, true)
	for m := range q {
		if ctx.Err() != nil {
			continue
		}
		st.src = m.src
		st.handleLive(ctx, m.frames, h, o)
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }
