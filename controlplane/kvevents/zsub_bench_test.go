package kvevents

import (
	"bytes"
	"context"
	"net"
	"testing"

	"github.com/go-zeromq/zmq4"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// BenchmarkSubscriberRecv is the receive side of a subscription alone: one engine step's
// message (topic, sequence, vLLM's EventBatch of 256 stored and 256 removed blocks) per
// op, streamed over loopback by a publisher written at the socket, read by go-zeromq's
// SUB and by zsub in one run. Nothing is decoded.
//
//	go test ./controlplane/kvevents -run '^$' -bench SubscriberRecv -benchmem -cpu 1
func BenchmarkSubscriberRecv(b *testing.B) {
	payload, _ := stepPayload(b, sim.Map)
	msg := message([]byte("kv"), seqBytes(1), payload)
	for _, impl := range []string{"zmq4", "zsub"} {
		b.Run("impl="+impl, func(b *testing.B) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ep := streamingPub(b, msg)
			var recv func() ([]byte, error)
			switch impl {
			case "zmq4":
				sub := zmq4.NewSub(ctx, zmq4.WithLogger(discardLogger()))
				defer sub.Close()
				sub.SetOption(zmq4.OptionSubscribe, "kv")
				if err := sub.Dial(ep); err != nil {
					b.Fatal(err)
				}
				recv = func() ([]byte, error) {
					m, err := sub.Recv()
					if err != nil {
						return nil, err
					}
					return m.Frames[2], nil
				}
			case "zsub":
				s, err := dialSub(ctx, ep, "kv", 0, MaxMessageBytes)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				recv = func() ([]byte, error) {
					f, err := s.recv()
					if err != nil {
						return nil, err
					}
					return f[2], nil
				}
			}
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				p, err := recv()
				if err != nil || len(p) != len(payload) {
					b.Fatal(len(p), err)
				}
			}
		})
	}
}

// streamingPub accepts one subscriber, completes a PUB's handshake (rawPub) and then
// writes msg over and over until the connection closes.
func streamingPub(tb testing.TB, msg []byte) string {
	chunk := bytes.Repeat(msg, max(1, (256<<10)/len(msg)))
	return rawPub(tb, nil, func(_ []byte, c net.Conn) {
		for {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	})
}
