package kvevents

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// zsub is a subscription's connection to one publisher, spoken without go-zeromq: ZMTP
// 3.0 with the NULL mechanism (RFC 23), as go-zeromq's SUB speaks it, which libzmq's PUB
// (vLLM's, through pyzmq) accepts: a 64-byte greeting each way, a READY command each way
// (ours says Socket-Type SUB, the peer's must say PUB or XPUB), then the subscription
// as a data message, 0x01 and the topic. go-zeromq allocates every frame's body and hands
// each message through two goroutines; a KV-event message is tens of kilobytes, so that
// shows in end-to-end ingest (BenchmarkSubscriberRecv, BenchmarkIngestEndToEnd). zsub
// reads the frames into one buffer it keeps, and a message's frames are valid until the
// next recv.
//
// Frames above max (and messages whose frames add up to more) fail the connection before
// anything is allocated for them, as frameCap does for go-zeromq's sockets.
type zsub struct {
	c   net.Conn
	r   *bufio.Reader
	max uint64

	// allowed, when set, is asked about each message's topic (its first frame) before
	// the rest is read; false fails the connection (a bound socket's peer check).
	allowed func(topic []byte) bool

	body   []byte   // the current message's frames, back to back
	frames [][]byte // slices of body
	ends   []int
	hdr    [9]byte // a frame's header (here, not on the stack: the reader would move it to the heap)
}

// Errors of the ZMTP exchange.
var (
	ErrZMTP      = errors.New("kv events: zmtp")
	ErrTooLarge  = errors.New("kv events: message above the size cap")
	ErrPeer      = errors.New("kv events: peer refused")
	zmtpNullMech = [20]byte{'N', 'U', 'L', 'L'}
)

// zsubBuffer is the connection's read buffer; zsubKeep is the largest message buffer kept
// between messages (a larger one is let go after its message).
const (
	zsubBuffer = 64 << 10
	zsubKeep   = 4 << 20
)

// dialSub connects to a tcp:// or ipc:// endpoint, completes the handshake within
// handshake and subscribes to topic.
func dialSub(ctx context.Context, endpoint, topic string, handshake time.Duration, max uint64) (*zsub, error) {
	network, addr, err := zmtpAddr(endpoint)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return startSub(ctx, c, topic, handshake, max)
}

// zmtpAddr is the network and address of a tcp:// or ipc:// endpoint ("*" for every
// interface, as ZMQ writes it).
func zmtpAddr(endpoint string) (network, addr string, err error) {
	network, addr, ok := strings.Cut(endpoint, "://")
	switch {
	case !ok:
	case network == "ipc":
		return "unix", addr, nil
	case network == "tcp":
		if rest, ok := strings.CutPrefix(addr, "*:"); ok {
			addr = ":" + rest
		}
		return "tcp", addr, nil
	}
	return "", "", fmt.Errorf("%w: endpoint %q: want tcp:// or ipc://", ErrZMTP, endpoint)
}

// startSub runs the SUB's side of the handshake on c, dialled or accepted (ZMTP's NULL
// handshake is the same either way), within handshake, and subscribes to topic. It closes
// c on failure.
func startSub(ctx context.Context, c net.Conn, topic string, handshake time.Duration, max uint64) (*zsub, error) {
	s := &zsub{c: c, r: bufio.NewReaderSize(c, zsubBuffer), max: max}
	if handshake > 0 {
		c.SetDeadline(time.Now().Add(handshake))
	}
	stop := context.AfterFunc(ctx, func() { c.Close() }) // shutdown does not wait for a slow peer
	err := s.handshake(topic)
	if !stop() {
		err = ctx.Err() // the close above ended the handshake
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return s, nil
}

func (s *zsub) Close() error { return s.c.Close() }

// handshake sends the greeting and READY, reads the peer's, and subscribes. The
// subscription waits for the peer's READY: libzmq 4.3.4's PUB closed the connection,
// without a byte, when it came in the same write as the greeting and READY
// (TestZsubReadsALibzmqPublisher).
func (s *zsub) handshake(topic string) error {
	out := make([]byte, 0, 64+32+2+9+len(topic))
	out = append(out, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0) // signature, version 3.0
	out = append(out, zmtpNullMech[:]...)
	out = append(out, make([]byte, 32)...) // as-server 0, filler
	ready := appendProperty([]byte("\x05READY"), "Socket-Type", "SUB")
	out = appendFrame(out, zmtpCommand, ready)
	if _, err := s.c.Write(out); err != nil {
		return err
	}
	if err := s.peerReady(); err != nil {
		return err
	}
	_, err := s.c.Write(appendFrame(out[:0], 0, append([]byte{1}, topic...)))
	return err
}

// peerReady reads the peer's greeting and READY: ZMTP 3 or later, the NULL mechanism,
// a PUB or XPUB socket.
func (s *zsub) peerReady() error {

	var g [64]byte
	if _, err := io.ReadFull(s.r, g[:]); err != nil {
		return fmt.Errorf("%w: greeting: %w", ErrZMTP, err)
	}
	if g[0] != 0xff || g[9] != 0x7f {
		return fmt.Errorf("%w: not a ZMTP greeting", ErrZMTP)
	}
	if g[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, want 3", ErrZMTP, g[10], g[11])
	}
	if !bytes.Equal(g[12:32], zmtpNullMech[:]) {
		return fmt.Errorf("%w: peer's mechanism %q, want NULL", ErrZMTP, bytes.TrimRight(g[12:32], "\x00"))
	}
	flags, cmd, err := s.frame(nil, 0)
	if err != nil {
		return fmt.Errorf("%w: handshake: %w", ErrZMTP, err)
	}
	if flags&zmtpCommand == 0 {
		return fmt.Errorf("%w: peer sent a message before READY", ErrZMTP)
	}
	name, props, ok := cutName(cmd)
	switch {
	case ok && name == "ERROR":
		return fmt.Errorf("%w: peer refused: %q", ErrZMTP, props)
	case !ok || name != "READY":
		return fmt.Errorf("%w: peer's first command is not READY", ErrZMTP)
	}
	st, err := property(props, "Socket-Type")
	if err != nil {
		return err
	}
	if st != "PUB" && st != "XPUB" {
		return fmt.Errorf("%w: peer is a %s socket, want PUB", ErrZMTP, st)
	}
	return nil
}

// recv reads the next message's frames (commands between messages are skipped). The
// frames are valid until the next recv.
func (s *zsub) recv() ([][]byte, error) {
	if cap(s.body) > zsubKeep {
		s.body = nil
	}
	for {
		s.body, s.ends = s.body[:0], s.ends[:0]
		var flags byte
		var err error
		for {
			flags, s.body, err = s.frame(s.body, uint64(len(s.body)))
			if err != nil {
				return nil, err
			}
			if flags&zmtpCommand != 0 {
				break // a command (ZMTP 3.1 peers' PING) mid-stream: not a message
			}
			s.ends = append(s.ends, len(s.body))
			if len(s.ends) == 1 && s.allowed != nil && !s.allowed(s.body) {
				return nil, fmt.Errorf("%w: %s sent a topic its address may not publish", ErrPeer, s.c.RemoteAddr())
			}
			if flags&zmtpMore == 0 {
				s.frames = s.frames[:0]
				start := 0
				for _, e := range s.ends {
					s.frames = append(s.frames, s.body[start:e:e])
					start = e
				}
				return s.frames, nil
			}
		}
		if len(s.ends) > 0 {
			return nil, fmt.Errorf("%w: a command inside a message", ErrZMTP)
		}
	}
}

// frame appends the next frame's body to dst and returns its flags; held is what the
// message holds already, counted against max.
func (s *zsub) frame(dst []byte, held uint64) (byte, []byte, error) {
	hdr := s.hdr[:]
	if _, err := io.ReadFull(s.r, hdr[:2]); err != nil {
		return 0, dst, err
	}
	flags, size := hdr[0], uint64(hdr[1])
	if flags&^(zmtpMore|zmtpLong|zmtpCommand) != 0 {
		return 0, dst, fmt.Errorf("%w: frame flags %#x", ErrZMTP, flags)
	}
	if flags&zmtpLong != 0 {
		if _, err := io.ReadFull(s.r, hdr[2:]); err != nil {
			return 0, dst, err
		}
		size = binary.BigEndian.Uint64(hdr[1:9])
	}
	if size > s.max || held+size > s.max {
		return 0, dst, fmt.Errorf("%w: a frame of %d bytes (cap %d)", ErrTooLarge, size, s.max)
	}
	n := len(dst)
	dst = growTo(dst, n+int(size))
	if _, err := io.ReadFull(s.r, dst[n:]); err != nil {
		return 0, dst[:n], err
	}
	return flags, dst, nil
}

// growTo extends b to length n, reallocating (doubled) only when its capacity is short.
func growTo(b []byte, n int) []byte {
	if n <= cap(b) {
		return b[:n]
	}
	nb := make([]byte, n, max(n, 2*cap(b)))
	copy(nb, b)
	return nb
}

func appendFrame(b []byte, flags byte, body []byte) []byte {
	if len(body) > 255 {
		b = append(b, flags|zmtpLong)
		return append(binary.BigEndian.AppendUint64(b, uint64(len(body))), body...)
	}
	return append(append(b, flags, byte(len(body))), body...)
}

func appendProperty(b []byte, name, value string) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

// cutName splits a command body into its name and the rest.
func cutName(cmd []byte) (string, []byte, bool) {
	if len(cmd) == 0 || int(cmd[0]) > len(cmd)-1 {
		return "", nil, false
	}
	return string(cmd[1 : 1+cmd[0]]), cmd[1+cmd[0]:], true
}

// property finds name (case-insensitive, as the RFC says) in a command's metadata.
func property(props []byte, name string) (string, error) {
	for len(props) > 0 {
		n := int(props[0])
		if len(props) < 1+n+4 {
			return "", fmt.Errorf("%w: malformed READY metadata", ErrZMTP)
		}
		k := string(props[1 : 1+n])
		vn := binary.BigEndian.Uint32(props[1+n:])
		props = props[1+n+4:]
		if uint64(vn) > uint64(len(props)) {
			return "", fmt.Errorf("%w: malformed READY metadata", ErrZMTP)
		}
		if strings.EqualFold(k, name) {
			return string(props[:vn]), nil
		}
		props = props[vn:]
	}
	return "", fmt.Errorf("%w: READY without %s", ErrZMTP, name)
}
