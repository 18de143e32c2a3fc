package kvevents

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Replayed is one batch from a replay reply.
type Replayed struct {
	Seq     uint64
	Payload []byte
	Err     error
}

// Replay sends ["", start_seq] over a DEALER (a REQ socket would only read the first
// reply, docs/kv-events.md, "Replay") and collects replies until the END marker, accepting
// both [seq, payload] and [topic, seq, payload]. It returns what arrived, with an error
// when the END marker did not arrive before ctx ended, or when the reply grew past
// MaxReplayBytes (ErrOverLimit: the rest is not read; over tcp:// the transport refuses
// the frame that would cross it before it is allocated).
func Replay(ctx context.Context, endpoint string, from uint64) ([]Replayed, error) {
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(time.Second), zmq4.WithLogger(discardLogger()))
	defer d.Close()
	if err := d.Dial(capped(endpoint)); err != nil {
		return nil, fmt.Errorf("replay: dial %s: %w", endpoint, err)
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		return nil, fmt.Errorf("replay: send: %w", err)
	}
	type recv struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan recv, 1)
	var out []Replayed
	spent := 0
	var wg sync.WaitGroup
	defer wg.Wait()
	defer d.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			m, err := d.Recv()
			select {
			case ch <- recv{m, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return out, fmt.Errorf("replay: no END marker: %w", ctx.Err())
		case r := <-ch:
			if r.err != nil {
				return out, fmt.Errorf("replay: recv: %w", r.err)
			}
			frames := r.m.Frames
			for _, f := range frames {
				spent += len(f) + replayFrameCost
			}
			if spent > MaxReplayBytes {
				return out, fmt.Errorf("replay: %w", overLimit("replay_bytes", spent, MaxReplayBytes))
			}
			if len(frames) > 0 && len(frames[0]) == 0 {
				frames = frames[1:] // the empty delimiter
			}
			if len(frames) == 3 && len(frames[1]) == 8 && len(frames[0]) == 0 && binary.BigEndian.Uint64(frames[1]) == endSeq {
				return out, nil // ["", END, ""]
			}
			if len(frames) == 2 && len(frames[0]) == 8 && binary.BigEndian.Uint64(frames[0]) == endSeq {
				return out, nil // [END, ""]
			}
			_, s, payload, err := splitFrames(frames)
			if err != nil {
				out = append(out, Replayed{Err: err})
				continue
			}
			out = append(out, Replayed{Seq: s, Payload: payload})
		}
	}
}
