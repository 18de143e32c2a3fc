package index

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// Memory per key: R replicas x P prefixes, each prefix one confirmed
// outcome whose chain holds K checkpoint keys (text or token domain, replicas without
// KV events, so the keys live in the replicas' LRUs), then a table build. B/key is the
// live heap after a GC over the keys held (model key map, replica holdings, LRU). The
// budget's default --max-keys is checked at the same load: the entries stay at the cap.
//
//	go test ./controlplane/index -run '^$' -bench MemoryPerKey -benchtime 1x
//
// 1,000 x 10,000 x 4 keys is 40 M keys (several GB at the measured size), more than
// this machine's tests should take; the default run is 1,000 x 250 x 4 (1 M keys) and
// the size per key is flat in the key count (maps and slabs, no per-prefix overhead).
// BenchmarkMemoryFleet (fleetmem_test.go) has the whole 1,000 x 10,000 shape with
// prefixes shared by replicas, per input path, and the byte budget's price beside it.
func BenchmarkMemoryPerKey(b *testing.B) {
	const replicas, prefixes, keysPer = 1000, 250, 4
	for _, dom := range []prefix.Domain{prefix.Token, prefix.Text} {
		for _, maxKeys := range []int{1 << 30, 0} {
			b.Run(fmt.Sprintf("domain=%v/max_keys=%d", dom, maxKeys), func(b *testing.B) {
				for range b.N {
					keys, bytes := memoryLoad(b, dom, replicas, prefixes, keysPer, maxKeys)
					b.ReportMetric(float64(keys), "keys")
					b.ReportMetric(bytes/float64(keys), "B/key")
				}
			})
		}
	}
}

func heapLive() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func memoryLoad(b *testing.B, dom prefix.Domain, replicas, prefixes, keysPer, maxKeys int) (int, float64) {
	b.StopTimer()
	before := heapLive()
	ix := New(Config{MaxKeysPerReplica: 1 << 30, Budget: Budget{MaxKeys: maxKeys, DefaultCapacityTokens: 1 << 30}})
	specs := make([]Spec, replicas)
	for i := range specs {
		specs[i] = Spec{ID: fmt.Sprintf("r%d", i), Model: "m", Addr: fmt.Sprintf("10.%d.%d.1:8000", i>>8, i&255)}
	}
	ix.SetReplicas(specs, t0)
	size := ix.cfg.BlockBytes
	if dom == prefix.Token {
		size = ix.cfg.BlockTokens
	}
	b.StartTimer()
	batch := api.ReportBatch{Reports: make([]api.Report, 0, prefixes)}
	for r := range replicas {
		batch.Reports = batch.Reports[:0]
		for p := range prefixes {
			keys := make([]uint64, keysPer)
			for k := range keys {
				keys[k] = uint64(r)<<40 | uint64(p)<<8 | uint64(k) // distinct per replica: the worst case
			}
			batch.Reports = append(batch.Reports, api.Report{Kind: api.KindOutcome, Model: "m", Replica: specs[r].Addr, Domain: dom,
				BlockSize: size, Stride: ix.cfg.Stride, Blocks: keysPer * ix.cfg.Stride, Keys: keys, Status: 200, PromptTokens: 100, CachedTokens: 0})
		}
		ix.ApplyReports(&batch, t0, nil)
	}
	ix.Flush(t0.Add(time.Second), true)
	ix.Reclaim(t0.Add(time.Second))
	b.StopTimer()
	batch = api.ReportBatch{}
	after := heapLive()
	st := ix.BudgetState()
	if maxKeys == 0 && st.Bytes > DefaultMaxBytes {
		b.Fatalf("budget: %d bytes held, cap %d", st.Bytes, DefaultMaxBytes)
	}
	runtime.KeepAlive(ix)
	return st.Keys, float64(after - before)
}
