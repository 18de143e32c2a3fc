package publisher

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	cpkv "github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

func TestParseConfig(t *testing.T) {
	cfg, unknown, err := ParseConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://indexer:5557","topic":"kv@10.0.0.1@m","future_field":1}`)
	require.NoError(t, err)
	assert.True(t, cfg.Enabled())
	assert.Equal(t, "tcp://indexer:5557", cfg.Endpoint)
	assert.Equal(t, "kv@10.0.0.1@m", cfg.Topic)
	assert.Equal(t, DefaultBufferSteps, cfg.BufferSteps)
	assert.Equal(t, DefaultHWM, cfg.HWM)
	assert.Empty(t, cfg.ReplayEndpoint)
	assert.Equal(t, []string{"future_field"}, unknown)

	cfg, _, err = ParseConfig(`{"enable_kv_cache_events":true}`)
	require.NoError(t, err)
	assert.Equal(t, "zmq", cfg.Publisher, "newer vLLM: publisher defaults to zmq when enabled")
	assert.Equal(t, DefaultEndpoint, cfg.Endpoint)

	cfg, _, err = ParseConfig(`{"enable_kv_cache_events":false,"publisher":"zmq"}`)
	require.NoError(t, err)
	assert.False(t, cfg.Enabled())
	cfg, _, err = ParseConfig("")
	require.NoError(t, err)
	assert.False(t, cfg.Enabled())

	for _, bad := range []string{`{`, `{"publisher":"kafka"}`, `{"buffer_steps":0}`, `{"hwm":-1}`, `{"endpoint":""}`, `{"buffer_steps":"x"}`} {
		_, _, err := ParseConfig(bad)
		assert.Error(t, err, bad)
	}
}

func TestBindOrConnect(t *testing.T) {
	cases := map[string]bool{
		"tcp://*:5557":         true,
		"tcp://[::]:5557":      true,
		"ipc:///tmp/kv":        true,
		"inproc://kv":          true,
		"tcp://0.0.0.0:5557":   false, // vLLM's gotcha: this connects
		"tcp://indexer:5557":   false,
		"tcp://127.0.0.1:5557": false,
	}
	for ep, bind := range cases {
		assert.Equal(t, bind, ShouldBind(ep), ep)
	}
}

func TestOffsetEndpointPort(t *testing.T) {
	cases := []struct {
		ep   string
		rank int
		want string
	}{
		{"tcp://*:5557", 0, "tcp://*:5557"},
		{"tcp://*:5557", 2, "tcp://*:5559"},
		{"tcp://indexer:5557", 1, "tcp://indexer:5558"},
		{"tcp://[::1]:5557", 1, "tcp://[::1]:5558"},
		{"inproc://kv", 3, "inproc://kv_dp3"},
		{"", 1, ""},
	}
	for _, c := range cases {
		got, err := OffsetEndpointPort(c.ep, c.rank)
		require.NoError(t, err)
		assert.Equal(t, c.want, got)
	}
	_, err := OffsetEndpointPort("ipc:///tmp/kv", 1)
	assert.Error(t, err)
	_, err = OffsetEndpointPort("tcp://host", 1)
	assert.Error(t, err)
	assert.Equal(t, "tcp://127.0.0.1:5557", localize("tcp://*:5557", "127.0.0.1"))
	assert.Equal(t, "tcp://[::1]:5557", localize("tcp://*:5557", "::1"))
	assert.Equal(t, "tcp://10.1.1.1:5557", localize("tcp://10.1.1.1:5557", "127.0.0.1"))
}

// recv receives one message or fails the test after a generous safety timeout (a
// broken publisher must not hang the suite; nothing here asserts on durations).
func recv(t *testing.T, s zmq4.Socket) zmq4.Msg {
	t.Helper()
	ch := make(chan zmq4.Msg, 1)
	go func() {
		m, err := s.Recv()
		if err != nil {
			m = zmq4.Msg{}
		}
		ch <- m
	}()
	select {
	case m := <-ch:
		require.NotEmpty(t, m.Frames, "recv failed")
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
	}
	return zmq4.Msg{}
}

func batch(hash uint64) kvevents.Batch {
	return kvevents.Batch{TS: 1700000000.5, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{hash}, Medium: "GPU"}}}
}

func open(t *testing.T, legacy bool) *Publisher {
	cfg, _, err := ParseConfig(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:0","replay_endpoint":"tcp://*:0","buffer_steps":4,"topic":"kv@sim@m"}`)
	require.NoError(t, err)
	p, err := Open(cfg, Options{Encoding: kvevents.Array, BindHost: "127.0.0.1", LegacyReplay: legacy, DataParallelRank: 0,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	assert.Contains(t, p.Endpoint(), "tcp://127.0.0.1:")
	assert.NotContains(t, p.Endpoint(), ":0")
	return p
}

func subscribe(t *testing.T, p *Publisher, prefix string) zmq4.Socket {
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	t.Cleanup(func() { sub.Close(); cancel() })
	require.NoError(t, sub.Dial(p.Endpoint()))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, prefix))
	// ZeroMQ drops messages published before the subscription arrives (slow joiner).
	for deadline := time.Now().Add(10 * time.Second); !p.Subscribed(); {
		require.True(t, time.Now().Before(deadline), "subscription never arrived")
		time.Sleep(5 * time.Millisecond)
	}
	return sub
}

func dealer(t *testing.T, p *Publisher) zmq4.Socket {
	ctx, cancel := context.WithCancel(context.Background())
	d := zmq4.NewDealer(ctx)
	t.Cleanup(func() { d.Close(); cancel() })
	require.NoError(t, d.Dial(p.ReplayEndpoint()))
	return d
}

func TestInteropSubscribeAndReplay(t *testing.T) {
	p := open(t, false)
	sub := subscribe(t, p, "kv@sim")

	for i := range 3 {
		seq, err := p.Publish(batch(uint64(100 + i)))
		require.NoError(t, err)
		assert.Equal(t, uint64(i), seq)
	}
	for i := range 3 {
		m := recv(t, sub)
		require.Len(t, m.Frames, 3, "topic, seq, payload")
		assert.Equal(t, "kv@sim@m", string(m.Frames[0]))
		assert.Equal(t, uint64(i), binary.BigEndian.Uint64(m.Frames[1]), "8-byte big-endian seq from 0")
		b, err := cpkv.Decode(m.Frames[2])
		require.NoError(t, err)
		assert.Equal(t, []uint64{uint64(100 + i)}, b.Events[0].Hashes)
		assert.Equal(t, cpkv.BlockRemoved, b.Events[0].Kind)
		assert.Equal(t, "GPU", b.Events[0].Medium)
		assert.True(t, b.HasDPRank)
		assert.Equal(t, 0, b.DPRank)
	}

	// Paused: seq 3 and 4 are kept but not sent; the subscriber sees 2 -> 5 and replays.
	p.SetPaused(true)
	_, _ = p.Publish(batch(103))
	_, _ = p.Publish(batch(104))
	p.SetPaused(false)
	_, _ = p.Publish(batch(105))
	m := recv(t, sub)
	require.Equal(t, uint64(5), binary.BigEndian.Uint64(m.Frames[1]), "gap after the pause")

	d := dealer(t, p)
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, seqBytes(3))))
	for want := uint64(3); want <= 5; want++ {
		r := recv(t, d)
		require.Len(t, r.Frames, 4, "v0.26 shape: \"\", topic, seq, payload")
		assert.Empty(t, r.Frames[0])
		assert.Equal(t, "kv@sim@m", string(r.Frames[1]))
		assert.Equal(t, want, binary.BigEndian.Uint64(r.Frames[2]))
		b, err := cpkv.Decode(r.Frames[3])
		require.NoError(t, err)
		assert.Equal(t, []uint64{100 + want}, b.Events[0].Hashes)
	}
	end := recv(t, d)
	require.Len(t, end.Frames, 4)
	assert.Equal(t, [][]byte{{}, {}, EndSeq, {}}, normalize(end.Frames), "end marker [\"\", END_SEQ, \"\"]")

	// The buffer holds buffer_steps=4 batches: asking for seq 0 returns 2..5.
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, seqBytes(0))))
	assert.Equal(t, uint64(2), binary.BigEndian.Uint64(recv(t, d).Frames[2]))

	// A restart: seq back to 0, buffer emptied.
	p.Reset()
	seq, err := p.Publish(batch(200))
	require.NoError(t, err)
	assert.Zero(t, seq)
}

func TestInteropLegacyReplayShape(t *testing.T) {
	p := open(t, true)
	_, _ = p.Publish(batch(1))
	d := dealer(t, p)
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, seqBytes(0))))
	r := recv(t, d)
	require.Len(t, r.Frames, 3, "<= v0.25 shape: \"\", seq, payload")
	assert.Equal(t, uint64(0), binary.BigEndian.Uint64(r.Frames[1]))
	end := recv(t, d)
	assert.Equal(t, [][]byte{{}, EndSeq, {}}, normalize(end.Frames))
}

func TestInvalidReplayRequestIsIgnored(t *testing.T) {
	p := open(t, false)
	_, _ = p.Publish(batch(1))
	d := dealer(t, p)
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, []byte("bad"))))
	require.NoError(t, d.Send(zmq4.NewMsgFrom(nil, seqBytes(0))))
	r := recv(t, d)
	assert.Equal(t, uint64(0), binary.BigEndian.Uint64(r.Frames[2]), "the bad request got no answer; the good one did")
}

func TestOpenRequiresEnabled(t *testing.T) {
	_, err := Open(Config{}, Options{})
	assert.Error(t, err)
}

func normalize(frames [][]byte) [][]byte {
	out := make([][]byte, len(frames))
	for i, f := range frames {
		out[i] = append([]byte{}, f...)
	}
	return out
}

func TestConnectModeWithDataParallelOffset(t *testing.T) {
	// llm-d's legacy topology: the subscriber binds, the engine connects. DP rank 1
	// connects to the configured port + 1.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	require.NoError(t, sub.Listen("tcp://127.0.0.1:0"))
	require.NoError(t, sub.SetOption(zmq4.OptionSubscribe, ""))
	port := sub.Addr().(*net.TCPAddr).Port

	cfg, _, err := ParseConfig(fmt.Sprintf(`{"enable_kv_cache_events":true,"endpoint":"tcp://127.0.0.1:%d"}`, port-1))
	require.NoError(t, err)
	p, err := Open(cfg, Options{Encoding: kvevents.Map, DataParallelRank: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, fmt.Sprintf("tcp://127.0.0.1:%d", port), p.Endpoint())
	for deadline := time.Now().Add(10 * time.Second); !p.Subscribed(); {
		require.True(t, time.Now().Before(deadline), "subscription never arrived")
		time.Sleep(5 * time.Millisecond)
	}
	_, err = p.Publish(batch(9))
	require.NoError(t, err)
	m := recv(t, sub)
	require.Len(t, m.Frames, 3)
	assert.Empty(t, m.Frames[0], "empty topic: empty frame 0")
	b, err := cpkv.Decode(m.Frames[2])
	require.NoError(t, err)
	assert.True(t, b.HasDPRank)
	assert.Equal(t, 1, b.DPRank)
}
