package publish

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Polls asking for the same frame of the same version wait for one encoding of it and
// share its bytes: a composed delta, a full frame, in either format. Before, every poll
// that missed the cache while another was encoding composed and encoded its own copy (a
// herd of pollers one version behind after a slow moment did it hundreds of times).
func TestPollsShareOneEncodingPerFrame(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name    string
		have    uint64
		hasHave bool
		format  uint8
	}{
		{"composed delta, format 2", 1, true, table.FormatTiers},
		{"composed delta, format 1", 1, true, table.FormatVersion},
		{"full frame, format 2", 0, false, table.FormatTiers},
		{"full frame, format 1", 0, false, table.FormatVersion},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := New(Options{FirstVersion: 1})
			for i, keys := range [][]uint64{{1, 2, 3}, {4}, {5}} {
				_, err := p.Publish(update(i == 0, keys...), now.Add(time.Duration(i)*time.Second))
				require.NoError(t, err)
			}
			const polls = 20
			var encodes, waiting atomic.Int32
			arrived := make(chan struct{})
			release := make(chan struct{})
			p.beforeEncode = func() {
				if encodes.Add(1) == 1 {
					close(arrived)
					<-release
				}
			}
			p.waiting = func() { waiting.Add(1) }
			results := make([]Result, polls)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { defer wg.Done(); results[0] = p.FrameFormat(c.have, c.hasHave, "", c.format) }()
			<-arrived // the first poll is encoding
			for i := 1; i < polls; i++ {
				wg.Add(1)
				go func() { defer wg.Done(); results[i] = p.FrameFormat(c.have, c.hasHave, "", c.format) }()
			}
			for waiting.Load() < polls-1 {
				time.Sleep(time.Millisecond) // every other poll waits for the first's bytes
			}
			close(release)
			wg.Wait()
			assert.Equal(t, int32(1), encodes.Load(), "encodings")
			for i, r := range results {
				require.NotEmpty(t, r.Body)
				assert.Same(t, &results[0].Body[0], &r.Body[0], "poll %d has bytes of its own", i)
				assert.Equal(t, uint64(3), r.Version)
			}
			// Later polls of this version find the frame ready.
			r := p.FrameFormat(c.have, c.hasHave, "", c.format)
			assert.Same(t, &results[0].Body[0], &r.Body[0])
			assert.Equal(t, int32(1), encodes.Load())
		})
	}
}

// The first version's full frame is a full frame. Before, the first version's delta
// from "no version" was cached under the full frame's key, and filters without a table
// got a delta (from version 0) where they asked for a full frame, which they refuse,
// until the second version.
func TestFirstVersionFullFrameIsAFullFrame(t *testing.T) {
	p := New(Options{FirstVersion: 1})
	_, err := p.Publish(update(true, 1, 2), time.Unix(1_800_000_000, 0))
	require.NoError(t, err)
	for _, format := range []uint8{table.FormatVersion, table.FormatTiers} {
		r := p.FrameFormat(0, false, "", format)
		require.Equal(t, table.Full, r.Kind)
		f, err := table.Decode(r.Body)
		require.NoError(t, err)
		assert.Equal(t, table.Full, f.Kind, "format %d", format)
	}
}

// fleetUpdate is model m with n replicas; ages are the index's: now minus each replica's
// last scrape, scraped[i].
func fleetUpdate(reset bool, now time.Time, scraped []time.Time, queued []uint64, keys ...uint64) []index.ModelUpdate {
	u := index.ModelUpdate{Name: "m", Reset: reset, Tiers: []string{"CPU"},
		Config: table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}}
	for i := range scraped {
		u.Replicas = append(u.Replicas, table.Replica{Slot: uint32(i), ID: fmt.Sprintf("vllm-%d", i),
			Addr: fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250), Speed: 14025, Queued: queued[i], KVUsage: 0.25,
			StateAgeMs: uint32(now.UnixMilli() - scraped[i].UnixMilli()), Healthy: true})
	}
	for _, k := range keys {
		u.Upserts.Add(k, 0)
	}
	return []index.ModelUpdate{u}
}

// Format-2 deltas, direct or composed, carry only the replicas that changed, and a
// filter following them holds the publisher's replicas exactly; format 1 still carries
// every replica whole.
func TestFormat2DeltasCarryOnlyChangedReplicas(t *testing.T) {
	const n = 200
	p := New(Options{FirstVersion: 1})
	t0 := time.Unix(1_800_000_000, 0)
	scraped := make([]time.Time, n)
	queued := make([]uint64, n)
	for i := range scraped {
		scraped[i] = t0.Add(-time.Duration(i%90) * time.Millisecond)
	}
	now := t0
	_, err := p.Publish(fleetUpdate(true, now, scraped, queued, 1, 2, 3), now)
	require.NoError(t, err)
	filter := table.New()
	_, err = filter.Apply(p.FrameFormat(0, false, "", table.FormatTiers).Body)
	require.NoError(t, err)
	filter1 := table.New()
	_, err = filter1.Apply(p.FrameFormat(0, false, "", table.FormatVersion).Body)
	require.NoError(t, err)
	var sizes, sizes1 []int
	for v := uint64(2); v <= 80; v++ {
		now = now.Add(50 * time.Millisecond)
		scraped[int(v)%n] = now.Add(-3 * time.Millisecond) // one replica scraped again
		queued[int(v*7)%n] += 512                          // one queue grows
		_, err := p.Publish(fleetUpdate(false, now, scraped, queued, 100+v), now)
		require.NoError(t, err)
		have := filter.Version
		if v%5 == 0 {
			continue // the filter misses this one: its next delta is composed
		}
		r := p.FrameFormat(have, true, "", table.FormatTiers)
		require.Equal(t, table.Delta, r.Kind)
		_, err = filter.Apply(r.Body)
		require.NoError(t, err)
		r1 := p.FrameFormat(filter1.Version, true, "", table.FormatVersion)
		_, err = filter1.Apply(r1.Body)
		require.NoError(t, err)
		p.Table(func(pt *table.Table) {
			require.Equal(t, pt.Models["m"].Replicas, filter.Models["m"].Replicas, "v%d", v)
			require.Equal(t, pt.Models["m"].Replicas, filter1.Models["m"].Replicas, "v%d format 1", v)
		})
		sizes, sizes1 = append(sizes, len(r.Body)), append(sizes1, len(r1.Body))
	}
	t.Logf("delta bytes at %d replicas, format 2: %v; format 1: %v", n, sizes[len(sizes)-5:], sizes1[len(sizes1)-5:])
	assert.Less(t, slices.Max(sizes), 200, "format 2 carries two or three replicas, not 200")
	assert.Greater(t, slices.Min(sizes1), n*20, "format 1 carries every replica")

	// A filter further behind than the replica history gets whole lists, and still the
	// publisher's table.
	old := table.New()
	_, err = old.Apply(p.FrameFormat(0, false, "", table.FormatTiers).Body)
	require.NoError(t, err)
	for range replicaHistory + 2 {
		now = now.Add(50 * time.Millisecond)
		_, err := p.Publish(fleetUpdate(false, now, scraped, queued), now)
		require.NoError(t, err)
	}
	r := p.FrameFormat(old.Version, true, "", table.FormatTiers)
	require.Equal(t, table.Delta, r.Kind)
	_, err = old.Apply(r.Body)
	require.NoError(t, err)
	p.Table(func(pt *table.Table) { require.Equal(t, pt.Models["m"].Replicas, old.Models["m"].Replicas) })
	assert.Greater(t, len(r.Body), n*20, "whole lists")
}
