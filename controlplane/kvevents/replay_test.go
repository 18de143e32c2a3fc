package kvevents

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawRouter is a replay endpoint written at the socket: it greets as a ZMTP ROUTER,
// reads one request (a DEALER's ["", start_seq]) and hands the connection to answer.
func rawRouter(tb testing.TB, answer func(c net.Conn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	tb.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write(append(zmtpGreetingBytes(), frame(zmtpCommand, appendProperty([]byte("\x05READY"), "Socket-Type", "ROUTER"))...))
		in := &zsub{c: c, r: bufio.NewReader(c), max: MaxMessageBytes}
		if _, err := io.ReadFull(in.r, make([]byte, zmtpGreeting)); err != nil {
			return
		}
		for { // the DEALER's READY, then the request's frames
			flags, _, err := in.frame(nil, 0)
			if err != nil {
				return
			}
			if flags&(zmtpCommand|zmtpMore) == 0 {
				break
			}
		}
		answer(c)
	}()
	return "tcp://" + ln.Addr().String()
}

// replies writes n replies [seq, payload] (as a ROUTER sends them to a DEALER: after
// the empty delimiter), all with the same payload, then the END marker.
func replies(n int, payload []byte) func(net.Conn) {
	return func(c net.Conn) {
		for i := range n {
			hdr := append(frame(zmtpMore, nil), frame(zmtpMore, seqBytes(uint64(i)))...)
			if len(payload) > 255 {
				hdr = append(append(hdr, zmtpLong), longHeader(uint64(len(payload)))[1:]...)
			} else {
				hdr = append(hdr, 0, byte(len(payload)))
			}
			if _, err := (&net.Buffers{hdr, payload}).WriteTo(c); err != nil {
				return
			}
		}
		c.Write(message(nil, seqBytes(endSeq), nil))
	}
}

// A replay peer cannot make the control plane hold more than MaxReplayBytes of its
// reply (the heap after GC, with the reply still referenced), however it sends it: in big batches (40 x 32 MB within the 2 s timeout took
// the process to 1.6 GB), or in a great many empty ones. The reply is cut there, with
// ErrOverLimit, and what came before it is returned; a reply within the bound is read
// whole.
func TestReplayStopsAtItsBound(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		payload []byte
		whole   bool
	}{
		{"big batches", 24, make([]byte, 4<<20), false},
		{"empty batches", 1_000_000, nil, false},
		{"an ordinary reply", 200, make([]byte, 20<<10), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ep := rawRouter(t, replies(tc.n, tc.payload))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			before := heapAfterGC()
			got, err := Replay(ctx, ep, 0)
			held := int64(heapAfterGC()) - int64(before) // what the reply holds
			runtime.KeepAlive(got)
			t.Logf("%d of %d replies, holding %d MB, err %v", len(got), tc.n, held>>20, err)
			for i, r := range got {
				if r.Err != nil || r.Seq != uint64(i) || len(r.Payload) != len(tc.payload) {
					t.Fatalf("reply %d: seq %d, %d bytes, err %v", i, r.Seq, len(r.Payload), r.Err)
				}
			}
			if tc.whole {
				if err != nil || len(got) != tc.n {
					t.Fatalf("%d of %d replies, err %v", len(got), tc.n, err)
				}
				return
			}
			if !errors.Is(err, ErrOverLimit) || DropReason(err) != "replay_bytes" {
				t.Errorf("err = %v, want the replay_bytes bound", err)
			}
			if held > MaxReplayBytes+4<<20 {
				t.Errorf("the reply holds %d MB; the bound is %d MB", held>>20, MaxReplayBytes>>20)
			}
		})
	}
}

// heapAfterGC is the live heap: what is still referenced after a collection.
func heapAfterGC() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
