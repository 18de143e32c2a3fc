package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// go-zeromq/zmq4 (v0.17) allocates each frame body from the 8-byte length its peer sends,
// and has no ZMQ_MAXMSGSIZE: one garbage length from anything that completes a ZMTP
// handshake would make the control plane allocate terabytes and die. The go-zeromq
// socket left here (Replay's DEALER; subscriptions, dialled or bound, read with zsub)
// therefore runs over "kvtcp", TCP whose reader follows ZMTP 3 framing and fails the
// connection on a frame larger than MaxMessageBytes before zmq4 sees its length. A
// replay dials a connection of its own, so the transport's bound on all a connection
// carries is a replay's: MaxReplayBytes.
const cappedScheme = "kvtcp"

func init() {
	if err := zmq4.RegisterTransport(cappedScheme, cappedTCP{max: MaxMessageBytes, total: MaxReplayBytes}); err != nil {
		panic(err) // only a second registration of the name can fail
	}
}

// capped rewrites a tcp:// endpoint to the capped transport; others pass unchanged.
func capped(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		return cappedScheme + "://" + rest
	}
	return endpoint
}

// cappedTCP's connections carry frames of at most max bytes, and at most total bytes
// of frames in all (each counted replayFrameCost more than its body).
type cappedTCP struct{ max, total uint64 }

// PeerCheck says whether a message with this topic may come from remote.
type PeerCheck func(topic []byte, remote net.Addr) bool

// maxTopic bounds the topic bytes a PeerCheck is shown; longer topics are checked by
// their first maxTopic bytes (no engine's topic is that long, so they resolve to none).
const maxTopic = 512

func (t cappedTCP) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return newFrameCap(c, t.max, t.total), nil
}

// Listen is not used (a bound socket reads with zsub, Listen in subscriber.go); it
// caps frames all the same.
func (t cappedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := transport.New("tcp").Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return cappedListener{l, t.max, t.total}, nil
}

func (cappedTCP) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

type cappedListener struct {
	net.Listener
	max, total uint64
}

func (l cappedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newFrameCap(c, l.max, l.total), nil
}

// ZMTP 3: a 64-byte greeting, then frames of a flags byte, a 1-byte length (or 8 bytes,
// big-endian, when flags has the LONG bit) and the body.
const (
	zmtpGreeting = 64
	zmtpMore     = 0x01
	zmtpLong     = 0x02
	zmtpCommand  = 0x04
)

// frameCap is a net.Conn whose reads check every ZMTP frame length as it streams past.
//
// It also buffers: zmq4 reads a frame's 2-byte header, its 8-byte length and its body
// each straight from the connection, seven read(2)s per KV-event message, a cost
// BenchmarkIngestEndToEnd's profile shows. Reads land in buf (or, for a read at least as
// large, in the caller's slice), are checked whole, and are handed out from there.
type frameCap struct {
	net.Conn
	max uint64
	// total bounds the frames' bytes over the connection (0: none); spent is what has
	// passed, each frame counted replayFrameCost more than its body.
	total, spent uint64

	buf  []byte // checked bytes not yet delivered: buf[r:w]
	r, w int
	// failed is the check's error once the bytes before it are delivered.
	failed error

	greeting int     // greeting bytes still to pass
	body     uint64  // body bytes of the current frame still to pass
	hdr      [9]byte // the frame header read so far
	hdrN     int
	err      error // sticky: the connection is bad
}

func newFrameCap(c net.Conn, max, total uint64) *frameCap {
	return &frameCap{Conn: c, max: max, total: total, greeting: zmtpGreeting}
}

// capBuffer is a connection's read buffer: a few engine steps' messages.
const capBuffer = 64 << 10

// Read passes bytes through after checking them. A frame whose header announces more
// than max bytes fails the connection, and of the
// bytes read with the one that revealed it, none from that frame's start on are
// delivered: zmq4 never sees the length, so never allocates for it.
func (f *frameCap) Read(p []byte) (int, error) {
	if f.r < f.w {
		n := copy(p, f.buf[f.r:f.w])
		f.r += n
		return n, nil
	}
	if f.failed != nil {
		f.err, f.failed = f.failed, nil
		f.Conn.Close()
	}
	if f.err != nil {
		return 0, f.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) >= capBuffer { // a large body: no copy through buf
		n, err := f.Conn.Read(p)
		ok := f.check(p[:n])
		if ok < n {
			return f.deliver(ok, err)
		}
		return n, err
	}
	if f.buf == nil {
		f.buf = make([]byte, capBuffer)
	}
	n, err := f.Conn.Read(f.buf)
	ok := f.check(f.buf[:n])
	f.r, f.w = 0, ok
	k := copy(p, f.buf[:ok])
	f.r = k
	if f.r < f.w {
		err = nil // the rest is delivered by the next reads; a read error comes again
	} else if ok < n {
		return f.deliver(k, err)
	}
	return k, err
}

// check scans b and returns how many of its leading bytes may be delivered; past
// that, the connection has failed (failed holds why).
func (f *frameCap) check(b []byte) int {
	ok, cerr := f.scan(b)
	if cerr != nil {
		f.failed = cerr
	}
	return ok
}

// deliver returns the n checked bytes of a read whose later bytes failed the check;
// with none, the failure itself.
func (f *frameCap) deliver(n int, _ error) (int, error) {
	if n > 0 {
		return n, nil
	}
	f.err, f.failed = f.failed, nil
	f.Conn.Close()
	return 0, f.err
}

// scan checks b and returns, with an error, how many of its leading bytes precede the
// frame that failed (len(b) without one): none of that frame's bytes in b are
// delivered.
func (f *frameCap) scan(b []byte) (int, error) {
	all, start := len(b), 0 // start: where the current frame began in b (0: before b)
	for len(b) > 0 {
		switch {
		case f.greeting > 0:
			k := min(f.greeting, len(b))
			f.greeting -= k
			b = b[k:]
		case f.body > 0:
			k := min(f.body, uint64(len(b)))
			f.body -= k
			b = b[k:]
		default:
			if f.hdrN == 0 {
				start = all - len(b)
			}
			f.hdr[f.hdrN] = b[0]
			f.hdrN++
			b = b[1:]
			need := 2
			if f.hdr[0]&zmtpLong != 0 {
				need = 9
			}
			if f.hdrN < need {
				continue
			}
			size := uint64(f.hdr[1])
			if need == 9 {
				size = binary.BigEndian.Uint64(f.hdr[1:9])
			}
			if size > f.max {
				return start, fmt.Errorf("kv events: ZMTP frame of %d bytes from %s exceeds %d", size, f.RemoteAddr(), f.max)
			}
			if f.spent += size + replayFrameCost; f.total > 0 && f.spent > f.total {
				return start, fmt.Errorf("kv events: %s sent too much on one connection: %w", f.RemoteAddr(),
					&LimitError{Limit: "replay_bytes", N: int64(f.spent), Max: int64(f.total)})
			}
			f.body, f.hdrN = size, 0
		}
	}
	return all, nil
}
