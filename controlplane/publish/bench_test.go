package publish

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
)

// The scale: 100 replicas, 10,000 prefixes of 125 checkpoint keys (1.25 M keys;
// 500 blocks of 16 tokens = 8,000-token prompts at stride 4), each prefix confirmed on
// 1-3 replicas.
const (
	benchReplicas = 100
	benchPrefixes = 10_000
	benchKeys     = 125
)

func addr(i int) string { return fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250) }

func benchIndex(b *testing.B) (*index.Index, time.Time) {
	b.Helper()
	ix := index.New(index.Config{})
	specs := make([]index.Spec, benchReplicas)
	for i := range specs {
		specs[i] = index.Spec{ID: fmt.Sprintf("r%03d", i), Model: "m", Addr: addr(i)}
	}
	now := time.Unix(1_800_000_000, 0)
	ix.SetReplicas(specs, now)
	rng := rand.New(rand.NewPCG(1, 2))
	keys := make([]uint64, benchKeys)
	for p := 0; p < benchPrefixes; p++ {
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		owners := 1 + rng.IntN(3)
		rs := make([]api.Report, owners)
		for o := range rs {
			rs[o] = api.Report{Kind: api.KindOutcome, Model: "m", Replica: addr((p + o*37) % benchReplicas), Domain: prefix.Text,
				BlockSize: 64, Stride: 4, Blocks: 4 * benchKeys, Keys: keys, Status: 200, PromptTokens: 8000, PromptBytes: 32000}
		}
		ix.ApplyReports(&api.ReportBatch{Reports: rs}, now, nil)
	}
	return ix, now
}

func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// First version from a populated index: collect 1.25 M keys, apply them to the
// published table, and encode the full frame a new filter downloads.
func BenchmarkBuildFullTable(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		ix, now := benchIndex(b)
		p := New(Options{FirstVersion: 1})
		b.StartTimer()
		ups := ix.Flush(now, true)
		if _, err := p.Publish(ups, now); err != nil {
			b.Fatal(err)
		}
		res := p.Frame(0, false, "")
		b.StopTimer()
		var n int
		p.Table(func(t *table.Table) { n = t.Models["m"].Len() })
		if n != benchPrefixes*benchKeys {
			b.Fatalf("%d keys", n)
		}
		b.ReportMetric(float64(len(res.Body))/(1<<20), "MB/frame")
		b.ReportMetric(heapMB(), "heapMB")
		runtime.KeepAlive(ix)
		runtime.KeepAlive(p)
		b.StartTimer()
	}
}

// Steady state at that scale: per version, 100 placements (12,500 keys) and 100
// confirmations land (not timed: they arrive over the interval), then one version is
// built, applied and encoded (the delta most pollers get), and a delta from 20 versions
// back is composed and encoded.
func BenchmarkIncrementalVersion(b *testing.B) {
	// 100+100 reports per 50 ms is 2,000 requests/s of 8,000-token prompts with new
	// prefixes: more prefill than 100 replicas can do. 10+10 is a busy fleet.
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("reports=%dx2", n), func(b *testing.B) { benchIncremental(b, n) })
	}
}

func benchIncremental(b *testing.B, perVersion int) {
	ix, now := benchIndex(b)
	p := New(Options{FirstVersion: 1})
	if _, err := p.Publish(ix.Flush(now, true), now); err != nil {
		b.Fatal(err)
	}
	p.Frame(0, false, "")
	rng := rand.New(rand.NewPCG(3, 4))
	mk := func(kind string, status int) api.Report {
		keys := make([]uint64, benchKeys)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		return api.Report{Kind: kind, Model: "m", Replica: addr(rng.IntN(benchReplicas)), Domain: prefix.Text, BlockSize: 64, Stride: 4,
			Blocks: 4 * benchKeys, Keys: keys, Status: status, PromptTokens: 8000, PromptBytes: 32000}
	}
	batches := make([]api.ReportBatch, 64)
	for i := range batches {
		for j := 0; j < perVersion; j++ {
			batches[i].Reports = append(batches[i].Reports, mk(api.KindPlacement, 0), mk(api.KindOutcome, 200))
		}
	}
	var deltaBytes, composedBytes, composed int
	var tVersion, tCompose time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		now = now.Add(50 * time.Millisecond)
		ix.ApplyReports(&batches[i%len(batches)], now, nil)
		i++
		b.StartTimer()
		t0 := time.Now()
		ups := ix.Flush(now, false)
		v, err := p.Publish(ups, now)
		if err != nil {
			b.Fatal(err)
		}
		r := p.Frame(v-1, true, "")
		deltaBytes = len(r.Body)
		tVersion += time.Since(t0)
		if v > 21 {
			t1 := time.Now()
			c := p.Frame(v-20, true, "")
			tCompose += time.Since(t1)
			composed++
			if c.Kind != table.Delta {
				b.Fatalf("composed frame kind %d", c.Kind)
			}
			composedBytes = len(c.Body)
		}
	}
	b.ReportMetric(float64(tVersion.Milliseconds())/float64(i), "ms/version")
	if composed > 0 {
		b.ReportMetric(float64(tCompose.Milliseconds())/float64(composed), "ms/delta20")
	}
	b.ReportMetric(float64(deltaBytes)/1024, "KB/delta")
	b.ReportMetric(float64(composedBytes)/1024, "KB/delta20")
}
