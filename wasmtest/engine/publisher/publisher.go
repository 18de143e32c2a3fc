package publisher

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// EndSeq is the replay end marker's sequence: (-1).to_bytes(8, "big", signed=True).
var EndSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// Options are the simulator's settings beyond vLLM's KVEventsConfig.
type Options struct {
	Encoding kvevents.Encoding
	// DataParallelRank offsets the endpoints' ports and fills EventBatch.data_parallel_rank.
	DataParallelRank int
	// LegacyReplay answers replay requests in the <= v0.25 shape: [seq, payload] per batch
	// and [END_SEQ, ""] at the end, instead of [topic, seq, payload] and ["", END_SEQ, ""].
	LegacyReplay bool
	// BindHost replaces the "*" host of tcp bind endpoints ("tcp://*:5557"). Default
	// 127.0.0.1 (loopback only); "0.0.0.0" binds every interface, as vLLM does.
	BindHost string
	Logger   *slog.Logger
}

type entry struct {
	seq     uint64
	payload []byte
}

// Publisher is one engine's KV event publisher. Its methods are safe for concurrent use.
type Publisher struct {
	cfg    Config
	opt    Options
	topic  []byte
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	pub, router          zmq4.Socket
	endpoint, replayAddr string

	mu     sync.Mutex
	enc    *kvevents.Encoder
	seq    uint64
	ring   []entry // circular, len <= BufferSteps
	next   int     // ring write position once full
	paused bool
	sent   uint64
	held   uint64 // batches not sent because paused
}

// Open binds (or connects) the PUB socket and, if configured, binds the ROUTER replay
// socket. cfg must be enabled (cfg.Enabled()).
func Open(cfg Config, opt Options) (*Publisher, error) {
	if !cfg.Enabled() {
		return nil, errors.New("publisher: KV events are not enabled (enable_kv_cache_events with publisher zmq)")
	}
	if opt.Encoding == "" {
		opt.Encoding = kvevents.Map
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.BindHost == "" {
		opt.BindHost = "127.0.0.1"
	}
	ep, err := OffsetEndpointPort(cfg.Endpoint, opt.DataParallelRank)
	if err != nil {
		return nil, err
	}
	replayEP, err := OffsetEndpointPort(cfg.ReplayEndpoint, opt.DataParallelRank)
	if err != nil {
		return nil, err
	}
	enc, err := newEncoder(opt)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, opt: opt, topic: []byte(cfg.Topic), log: opt.Logger, ctx: ctx, cancel: cancel,
		enc: enc}

	// go-zeromq logs connection trouble (a probing control plane, a subscriber that
	// went away) to stderr by default; keep it in the engine's log at debug level.
	zlog := zmq4.WithLogger(slog.NewLogLogger(opt.Logger.Handler(), slog.LevelDebug))
	if ShouldBind(ep) {
		p.pub = zmq4.NewPub(ctx, zlog)
		addr := localize(ep, opt.BindHost)
		if err := p.pub.Listen(addr); err != nil {
			cancel()
			return nil, fmt.Errorf("publisher: bind %s: %w", addr, err)
		}
		p.endpoint = actual(addr, p.pub.Addr())
	} else {
		// vLLM connects for endpoints without a wildcard (llm-d's central-SUB topology).
		// libzmq connects lazily; go-zeromq's Dial blocks, so keep dialling in the background.
		p.pub = zmq4.NewPub(ctx, zlog, zmq4.WithDialerMaxRetries(-1), zmq4.WithDialerRetry(250*time.Millisecond), zmq4.WithAutomaticReconnect(true))
		p.endpoint = ep
		p.wg.Go(func() {
			if err := p.pub.Dial(ep); err != nil && ctx.Err() == nil {
				p.log.Warn("kv events: connect failed", "endpoint", ep, "err", err)
			}
		})
	}
	if cfg.HWM > 0 {
		if err := p.pub.SetOption(zmq4.OptionHWM, cfg.HWM); err != nil {
			p.Close()
			return nil, fmt.Errorf("publisher: set hwm %d: %w", cfg.HWM, err)
		}
	}
	if replayEP != "" {
		p.router = zmq4.NewRouter(ctx, zlog)
		addr := localize(replayEP, opt.BindHost)
		if err := p.router.Listen(addr); err != nil {
			p.Close()
			return nil, fmt.Errorf("publisher: bind replay %s: %w", addr, err)
		}
		p.replayAddr = actual(addr, p.router.Addr())
		p.wg.Go(p.serveReplay)
	}
	p.log.Info("kv events publishing", "endpoint", p.endpoint, "replay", p.replayAddr, "topic_len", len(p.topic), "encoding", string(opt.Encoding))
	return p, nil
}

// actual returns the endpoint with the port the OS picked (for "tcp://host:0").
func actual(ep string, a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !strings.HasPrefix(ep, "tcp://") {
		return ep
	}
	host := ep[len("tcp://"):strings.LastIndexByte(ep, ':')]
	if host == "0.0.0.0" || host == "*" || host == "" {
		host = ta.IP.String()
	}
	return "tcp://" + net.JoinHostPort(strings.Trim(host, "[]"), fmt.Sprint(ta.Port))
}

// Endpoint returns the PUB address (with the actual port when bound to port 0).
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint returns the ROUTER address, or "" without replay.
func (p *Publisher) ReplayEndpoint() string { return p.replayAddr }

// Topic returns frame 0 of every message.
func (p *Publisher) Topic() string { return string(p.topic) }

// Subscribed reports whether some subscriber's subscription reached the PUB socket
// (go-zeromq tracks them; tests use it to avoid ZeroMQ's slow-joiner loss).
func (p *Publisher) Subscribed() bool {
	t, ok := p.pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// Publish assigns the batch the next sequence number, keeps it for replay and sends
// it, unless paused (then it is only kept: subscribers see a gap they can replay).
// The batch's data_parallel_rank is set to the publisher's rank, as vLLM does.
func (p *Publisher) Publish(b kvevents.Batch) (uint64, error) {
	b.DataParallelRank = p.opt.DataParallelRank
	p.mu.Lock()
	defer p.mu.Unlock()
	payload, err := p.enc.Encode(b)
	if err != nil {
		return 0, fmt.Errorf("publisher: %w", err)
	}
	seq := p.seq
	p.seq++
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, entry{seq, payload})
	} else {
		p.ring[p.next] = entry{seq, payload}
		p.next = (p.next + 1) % len(p.ring)
	}
	if p.paused {
		p.held++
		return seq, nil
	}
	if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seqBytes(seq), payload)); err != nil {
		return seq, fmt.Errorf("publisher: send seq %d: %w", seq, err)
	}
	p.sent++
	return seq, nil
}

// Reset starts over as a restarted engine process does: sequence 0, empty replay buffer.
func (p *Publisher) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq, p.ring, p.next = 0, p.ring[:0], 0
	p.enc, _ = newEncoder(p.opt) // a new process knows none of the old one's pages (checked in Open)
}

// newEncoder returns the encoder of opt's layout.
func newEncoder(opt Options) (*kvevents.Encoder, error) {
	return kvevents.NewEncoder(opt.Encoding), nil
}

// SetPaused stops (true) or resumes (false) sending; batches keep their sequence
// numbers and stay replayable.
func (p *Publisher) SetPaused(paused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
}

// Paused reports whether sending is paused.
func (p *Publisher) Paused() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.paused
}

// NextSeq returns the sequence number the next batch will get.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Close stops both sockets.
func (p *Publisher) Close() error {
	p.cancel()
	var err error
	if p.router != nil {
		err = p.router.Close()
	}
	if e := p.pub.Close(); e != nil && err == nil {
		err = e
	}
	p.wg.Wait()
	return err
}

func seqBytes(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// replayFrom returns the buffered batches with seq >= start, oldest first.
func (p *Publisher) replayFrom(start uint64) []entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []entry
	n := len(p.ring)
	for i := range n {
		e := p.ring[(p.next+i)%n]
		if e.seq >= start {
			out = append(out, e)
		}
	}
	return out
}

// serveReplay answers ["", start_seq] requests on the ROUTER socket: every buffered
// batch from start_seq, then the end marker.
func (p *Publisher) serveReplay() {
	for {
		msg, err := p.router.Recv()
		if p.ctx.Err() != nil {
			return
		}
		if err != nil {
			p.log.Warn("kv events replay: recv", "err", err)
			continue
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			p.log.Warn("kv events replay: Invalid replay request", "frames", len(f))
			continue
		}
		id, start := f[0], binary.BigEndian.Uint64(f[2])
		batches := p.replayFrom(start)
		for _, e := range batches {
			var out zmq4.Msg
			if p.opt.LegacyReplay {
				out = zmq4.NewMsgFrom(id, nil, seqBytes(e.seq), e.payload)
			} else {
				out = zmq4.NewMsgFrom(id, nil, p.topic, seqBytes(e.seq), e.payload)
			}
			if err := p.router.Send(out); err != nil {
				p.log.Warn("kv events replay: send", "seq", e.seq, "err", err)
				break
			}
		}
		end := zmq4.NewMsgFrom(id, nil, nil, EndSeq, nil)
		if p.opt.LegacyReplay {
			end = zmq4.NewMsgFrom(id, nil, EndSeq, nil)
		}
		if err := p.router.Send(end); err != nil {
			p.log.Warn("kv events replay: send end marker", "err", err)
		}
		p.log.Debug("kv events replay served", "from", start, "batches", len(batches))
	}
}
