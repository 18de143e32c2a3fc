package replica

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

func newReplica(t *testing.T) *Replica {
	r, err := New(Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: 0.001, ModelName: "m",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	return r
}

func wait(t *testing.T, h *Handle) Progress {
	have := 0
	for {
		p, err := h.Wait(context.Background(), have)
		require.NoError(t, err)
		if p.Done {
			return p
		}
		have = len(p.Tokens)
	}
}

func TestSubmitStreamsTokensAndEvents(t *testing.T) {
	r := newReplica(t)
	var mu sync.Mutex
	var batches []kvevents.Batch
	r.ObserveEvents(func(b kvevents.Batch) { mu.Lock(); batches = append(batches, b); mu.Unlock() })

	prompt := make([]uint32, 100)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	p := wait(t, must(r.Submit(Request{ID: "a", Prompt: prompt, MaxTokens: 5})))
	assert.Equal(t, "length", p.FinishReason)
	assert.Len(t, p.Tokens, 5)
	assert.Zero(t, p.CachedTokens)
	assert.Equal(t, 100, p.PromptTokens)
	assert.Equal(t, timing.Fast().PrefillTime(100), p.TTFT, "TTFT is simulated time, independent of the time scale")

	p = wait(t, must(r.Submit(Request{ID: "b", Prompt: prompt, MaxTokens: 1})))
	assert.Equal(t, 96, p.CachedTokens)

	mu.Lock()
	require.NotEmpty(t, batches)
	assert.Equal(t, kvevents.BlockStored, batches[0].Events[0].Kind)
	assert.Len(t, batches[0].Events[0].BlockHashes, 6)
	mu.Unlock()

	m := r.Metrics()
	assert.Equal(t, int64(2), m.Success["length"])
	assert.Equal(t, int64(200), m.PrefixQueries)
	assert.Equal(t, int64(96), m.PrefixHits)

	mu.Lock()
	before := len(batches)
	mu.Unlock()
	r.Restart()
	mu.Lock()
	assert.Len(t, batches, before, "a restarted process sends no AllBlocksCleared")
	mu.Unlock()
	assert.Zero(t, r.Metrics().PrefixQueries, "counters restart")
	p = wait(t, must(r.Submit(Request{ID: "c", Prompt: prompt, MaxTokens: 1})))
	assert.Zero(t, p.CachedTokens, "cache cleared")
	assert.Nil(t, r.Publisher(), "events disabled without a config")
}

func TestNewRejectsBadConfig(t *testing.T) {
	_, err := New(Config{Engine: sched.Config{Profile: timing.Fast()}, TimeScale: -1})
	assert.Error(t, err)
	_, err = New(Config{Engine: sched.Config{Profile: timing.Fast(), OnToken: func(*sched.Request, time.Duration) {}}})
	assert.Error(t, err)
}

func must(h *Handle, err error) *Handle {
	if err != nil {
		panic(err)
	}
	return h
}
