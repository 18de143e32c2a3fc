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
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// rawPub accepts one subscriber and speaks as a ZMTP publisher written at the socket:
// hello (greeting and READY; nil: a PUB's); then, with send, the subscriber's greeting
// and commands are read (with zsub's own frame reader: zsub's, go-zeromq's or any
// subscriber's, in any order) and send gets its subscription frame as it came.
func rawPub(tb testing.TB, hello []byte, send func(subscription []byte, c net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	tb.Cleanup(func() { ln.Close() })
	if hello == nil {
		hello = append(zmtpGreetingBytes(), zmtpReady()...)
	}
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(hello)
		if send != nil {
			in := &zsub{c: c, r: bufio.NewReader(c), max: MaxMessageBytes}
			if _, err := io.ReadFull(in.r, make([]byte, zmtpGreeting)); err != nil {
				return
			}
			for { // the subscriber's commands (READY), then its subscription (a message)
				flags, body, err := in.frame(nil, 0)
				if err != nil {
					return
				}
				if flags&zmtpCommand == 0 {
					send(appendFrame(nil, flags, body), c)
					break
				}
			}
		}
		io.Copy(io.Discard, c)
	}()
	return "tcp://" + ln.Addr().String()
}

// runPython starts script under py with args: each line written to stdin drives it, out
// reads what it prints. Both end with the test.
func runPython(t *testing.T, py, script string, args ...string) (stdin io.Writer, out *bufio.Scanner) {
	cmd := exec.Command(py, append([]string{"-c", script}, args...)...)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Wait() })
	return in, bufio.NewScanner(stdout)
}

func frame(flags byte, body []byte) []byte { return appendFrame(nil, flags, body) }

func message(frames ...[]byte) []byte {
	var b []byte
	for i, f := range frames {
		flags := byte(zmtpMore)
		if i == len(frames)-1 {
			flags = 0
		}
		b = append(b, frame(flags, f)...)
	}
	return b
}

func seqBytes(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// go-zeromq's PUB (the engine simulator's) filters by the subscription zsub sends and
// delivers multipart messages, short and long frames, in order.
func TestZsubReadsAGoZeromqPublisher(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	require.NoError(t, pub.Listen("tcp://127.0.0.1:0"))
	s, err := dialSub(ctx, "tcp://"+pub.Addr().String(), "kv", time.Second, MaxMessageBytes)
	require.NoError(t, err)
	defer s.Close()
	require.Eventually(t, func() bool { return len(pub.(zmq4.Topics).Topics()) == 1 }, 5*time.Second, 5*time.Millisecond)
	big := bytes.Repeat([]byte("x"), 300_000)
	require.NoError(t, pub.Send(zmq4.NewMsgFrom([]byte("other"), seqBytes(9), []byte("no"))))
	for i := range 3 {
		require.NoError(t, pub.Send(zmq4.NewMsgFrom([]byte("kv"), seqBytes(uint64(i)), append(big[:i*1000], byte(i)))))
	}
	for i := range 3 {
		frames, err := s.recv()
		require.NoError(t, err)
		require.Len(t, frames, 3)
		assert.Equal(t, "kv", string(frames[0]), "the publisher filters by the subscription")
		assert.Equal(t, uint64(i), binary.BigEndian.Uint64(frames[1]))
		assert.Equal(t, append(big[:i*1000:i*1000], byte(i)), frames[2])
	}
}

// vLLM publishes through pyzmq (libzmq). With /usr/bin/python3's zmq module present
// (Debian's python3-zmq: libzmq 4.3.4) a real libzmq PUB sends to zsub; without it the
// test is skipped, unless KVROUTE_REQUIRE_LIBZMQ=1.
func TestZsubReadsALibzmqPublisher(t *testing.T) {
	py := libzmqPython(t)
	script := `
import sys, zmq
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
port = pub.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
payload = b"y" * 100000
n = 0
while sys.stdin.readline():
    pub.send_multipart([b"other", n.to_bytes(8, "big"), b"no"])
    pub.send_multipart([b"kv", n.to_bytes(8, "big"), payload + bytes([n % 256])])
    n += 1
    print("sent", flush=True)
`
	stdin, out := runPython(t, py, script)
	require.True(t, out.Scan())
	port := strings.TrimSpace(out.Text())

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := dialSub(ctx, "tcp://127.0.0.1:"+port, "kv", 5*time.Second, MaxMessageBytes)
	require.NoError(t, err)
	defer s.Close()
	// A PUB drops what it sends before the subscription reaches it: send until one
	// arrives, then three more must arrive in order.
	got := make(chan [][]byte, 16)
	go func() {
		for {
			frames, err := s.recv()
			if err != nil {
				close(got)
				return
			}
			got <- [][]byte{bytes.Clone(frames[0]), bytes.Clone(frames[1]), bytes.Clone(frames[2])}
		}
	}()
	var first uint64
	for waiting := true; waiting; {
		io.WriteString(stdin, "go\n")
		require.True(t, out.Scan())
		select {
		case m := <-got:
			first, waiting = binary.BigEndian.Uint64(m[1]), false
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no message from libzmq's PUB")
		}
	}
	for i := uint64(1); i <= 3; i++ {
		io.WriteString(stdin, "go\n")
		m := <-got
		require.NotNil(t, m)
		assert.Equal(t, "kv", string(m[0]))
		assert.Equal(t, first+i, binary.BigEndian.Uint64(m[1]))
		assert.Len(t, m[2], 100001)
		assert.Equal(t, byte((first+i)%256), m[2][100000])
	}
}

// A length above the cap fails the connection before anything is allocated for it,
// a single frame's or a message's frames together.
func TestZsubRefusesOversizedMessages(t *testing.T) {
	for name, body := range map[string][]byte{
		"one frame of an exabyte": longHeader(1 << 60),
		"frames adding up":        append(frame(zmtpMore, make([]byte, 600)), frame(0, make([]byte, 600))...),
	} {
		t.Run(name, func(t *testing.T) {
			ep := rawPub(t, nil, func(_ []byte, c net.Conn) { c.Write(body) })
			s, err := dialSub(context.Background(), ep, "kv", time.Second, 1000)
			require.NoError(t, err)
			defer s.Close()
			_, err = s.recv()
			assert.ErrorIs(t, err, ErrTooLarge)
		})
	}
}

func TestZsubRefusesWhatIsNotAPublisher(t *testing.T) {
	g := zmtpGreetingBytes()
	zmtp2 := bytes.Clone(g)
	zmtp2[10] = 2
	plain := bytes.Clone(g)
	copy(plain[12:32], "PLAIN\x00\x00\x00\x00")
	push := append(bytes.Clone(g), frame(zmtpCommand, appendProperty([]byte("\x05READY"), "Socket-Type", "PUSH"))...)
	errorCmd := append(bytes.Clone(g), frame(zmtpCommand, []byte("\x05ERROR\x04nope"))...)
	data := append(bytes.Clone(g), frame(0, []byte("hello"))...)
	for name, hello := range map[string][]byte{
		"an HTTP server":       []byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" + strings.Repeat(" ", 64)),
		"ZMTP 2":               append(zmtp2, zmtpReady()...),
		"the PLAIN mechanism":  append(plain, zmtpReady()...),
		"a PUSH socket":        push,
		"an ERROR command":     errorCmd,
		"a message first":      data,
		"a READY without type": append(bytes.Clone(g), frame(zmtpCommand, []byte("\x05READY"))...),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := dialSub(context.Background(), rawPub(t, hello, nil), "kv", time.Second, MaxMessageBytes)
			assert.ErrorIs(t, err, ErrZMTP)
		})
	}
	t.Run("a silent peer", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			if c, err := ln.Accept(); err == nil {
				defer c.Close()
				io.Copy(io.Discard, c)
			}
		}()
		_, err = dialSub(context.Background(), "tcp://"+ln.Addr().String(), "kv", 100*time.Millisecond, MaxMessageBytes)
		var ne net.Error
		assert.True(t, errors.As(err, &ne) && ne.Timeout(), "the handshake times out: %v", err)
	})
	t.Run("an endpoint of another scheme", func(t *testing.T) {
		_, err := dialSub(context.Background(), "inproc://kv", "kv", time.Second, MaxMessageBytes)
		assert.ErrorIs(t, err, ErrZMTP)
	})
}

// Steady state: a message costs no allocation (go-zeromq allocated each frame's body).
func TestZsubRecvAllocatesNothing(t *testing.T) {
	const n = 300
	msg := message([]byte("kv"), seqBytes(1), bytes.Repeat([]byte("p"), 20_000))
	ep := rawPub(t, nil, func(_ []byte, c net.Conn) { c.Write(bytes.Repeat(msg, n+5)) })
	s, err := dialSub(context.Background(), ep, "kv", time.Second, MaxMessageBytes)
	require.NoError(t, err)
	defer s.Close()
	for range 5 {
		_, err := s.recv() // buffers grow to the message's size
		require.NoError(t, err)
	}
	allocs := testing.AllocsPerRun(n-1, func() {
		if f, err := s.recv(); err != nil || len(f) != 3 {
			panic(fmt.Sprint(len(f), err))
		}
	})
	assert.Zero(t, allocs)
}

// A PING between messages (a ZMTP 3.1 peer's heartbeat) is skipped; a command between a
// message's frames fails the connection.
func TestZsubCommands(t *testing.T) {
	ping := frame(zmtpCommand, []byte("\x04PING\x00\x00"))
	ep := rawPub(t, nil, func(_ []byte, c net.Conn) {
		c.Write(append(append(ping, message([]byte("kv"), seqBytes(1), []byte("a"))...), frame(zmtpMore, []byte("kv"))...))
		c.Write(ping)
	})
	s, err := dialSub(context.Background(), ep, "kv", time.Second, MaxMessageBytes)
	require.NoError(t, err)
	defer s.Close()
	f, err := s.recv()
	require.NoError(t, err)
	assert.Equal(t, "a", string(f[2]))
	_, err = s.recv()
	assert.ErrorIs(t, err, ErrZMTP)
}

// Cancelling the subscription's context ends a handshake with a silent peer at once, not
// at the handshake's deadline.
func TestZsubDialEndsWithItsContext(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := dialSub(ctx, "tcp://"+ln.Addr().String(), "kv", time.Hour, MaxMessageBytes)
		done <- err
	}()
	c := <-accepted
	defer c.Close()
	cancel()
	select {
	case err := <-done:
		assert.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("dialSub still waits for the peer's greeting after its context ended")
	}
}

// vLLM's default topic is empty: its messages start with a zero-length frame, and the
// subscription to "" is the 0x01 byte alone.
func TestZsubEmptyTopic(t *testing.T) {
	subs := make(chan []byte, 1)
	ep := rawPub(t, nil, func(subscription []byte, c net.Conn) {
		subs <- subscription
		c.Write(message(nil, seqBytes(7), []byte("payload")))
	})
	s, err := dialSub(context.Background(), ep, "", time.Second, MaxMessageBytes)
	require.NoError(t, err)
	defer s.Close()
	f, err := s.recv()
	require.NoError(t, err)
	require.Len(t, f, 3)
	assert.Empty(t, f[0])
	assert.Equal(t, uint64(7), binary.BigEndian.Uint64(f[1]))
	assert.Equal(t, "payload", string(f[2]))
	assert.Equal(t, []byte{0, 1, 1}, <-subs, "a data frame of 0x01 alone")
}

// libzmqPython is a Python with pyzmq (libzmq), or the test is skipped (failed with
// KVROUTE_REQUIRE_LIBZMQ=1).
func libzmqPython(t *testing.T) string {
	py := "/usr/bin/python3"
	if exec.Command(py, "-c", "import zmq").Run() != nil {
		if os.Getenv("KVROUTE_REQUIRE_LIBZMQ") != "" {
			t.Fatal("KVROUTE_REQUIRE_LIBZMQ is set and /usr/bin/python3 has no zmq module (apt-get install python3-zmq)")
		}
		t.Skip("no libzmq: /usr/bin/python3 has no zmq module (apt-get install python3-zmq)")
	}
	return py
}

// With --kv-bind, vLLM's PUB (libzmq) connects to the control plane's bound socket: the
// accepted side's handshake and a real engine step's batch, through Listen.
func TestListenReadsALibzmqPublisherThatConnects(t *testing.T) {
	py := libzmqPython(t)
	payload, _ := stepPayload(t, sim.Map)
	file := t.TempDir() + "/payload"
	require.NoError(t, os.WriteFile(file, payload, 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rec := &recorder{}
	addr, done, err := Listen(ctx, "tcp://127.0.0.1:0", func(topic string) (Source, bool) {
		return Source{ID: StreamID{"e1", 0}}, topic == "kv@e1"
	}, rec, func(string) {}, Options{Logger: quiet()})
	require.NoError(t, err)
	script := `
import sys, zmq
payload = open(sys.argv[2], "rb").read()
pub = zmq.Context().socket(zmq.PUB)
pub.connect(sys.argv[1])
n = 0
while sys.stdin.readline():
    pub.send_multipart([b"kv@e1", n.to_bytes(8, "big"), payload])
    n += 1
    print("sent", flush=True)
`
	stdin, out := runPython(t, py, script, "tcp://"+addr.String(), file)
	// The PUB drops what it sends before our subscription reaches it: send until a
	// batch arrives.
	deadline := time.Now().Add(20 * time.Second)
	for len(rec.lines()) == 0 {
		require.True(t, time.Now().Before(deadline), "no batch from libzmq's PUB")
		io.WriteString(stdin, "go\n")
		require.True(t, out.Scan())
		time.Sleep(10 * time.Millisecond)
	}
	l := rec.lines()[0]
	assert.True(t, strings.HasPrefix(l, "batch ") && strings.Contains(l, "BlockStored"), l)
	cancel()
	<-done
}
