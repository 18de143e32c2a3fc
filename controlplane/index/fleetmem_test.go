package index

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// Memory at fleet shape. The shape: 1,000 replicas of one model and 10,000
// distinct prefixes, each prefix a chain of 32 checkpoint keys (128 blocks: 2,048
// tokens, or 8 KB of canonical text at 64-byte blocks), held by 4 replicas (prefix p on
// replicas 4p % 1000 .. 4p % 1000 + 3), so each replica holds 40 prefixes (1,280 keys)
// and the fleet 320,000 distinct keys in 1,280,000 holdings. Each path is loaded apart:
//
//   - text/placement: the filters' placements, speculative text keys (replicas without
//     KV events);
//   - text/outcome: confirmed text keys, in the replicas' LRUs;
//   - token/outcome: confirmed token keys of replicas without KV events;
//   - token/events: the engines' BlockStored events (16-token blocks, tokens included),
//     512,000 events of 128 blocks, 5,120,000 engine blocks, the index hashing the
//     tokens into the same 320,000 keys.
type fleetShape struct {
	replicas, prefixes, keys, holders int
}

var fleet = fleetShape{replicas: 1000, prefixes: 10_000, keys: 32, holders: 4}

// fleetPath names one input path of the load.
type fleetPath string

const (
	pathTextPlacement fleetPath = "text/placement"
	pathTextOutcome   fleetPath = "text/outcome"
	pathTokenOutcome  fleetPath = "token/outcome"
	pathTokenEvents   fleetPath = "token/events"
)

var fleetPaths = []fleetPath{pathTextPlacement, pathTextOutcome, pathTokenOutcome, pathTokenEvents}

// prefixesOf lists the prefixes replica r holds.
func (f fleetShape) prefixesOf(r int) []int {
	var out []int
	for p := range f.prefixes {
		first := p * f.holders % f.replicas
		if d := (r - first + f.replicas) % f.replicas; d < f.holders {
			out = append(out, p)
		}
	}
	return out
}

// mix64 is splitmix64's finalizer: reported keys are hashes, so the load's are too.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func fleetSpecs(f fleetShape, events bool) []Spec {
	specs := make([]Spec, f.replicas)
	for i := range specs {
		specs[i] = Spec{ID: fmt.Sprintf("r%04d", i), Model: "m", Addr: fmt.Sprintf("10.%d.%d.1:8000", i>>8, i&255), Events: events}
	}
	return specs
}

// loadFleet offers the index every replica's prefixes on the paths given, replica by
// replica (a replica's paths one after the other). The replicas have KV events when
// token/events is among the paths. On that path each replica stores each of its
// prefixes as one BlockStored event of the chain's blocks (engine block = our block,
// 16 tokens), on its own stream.
func loadFleet(ix *Index, f fleetShape, now time.Time, paths ...fleetPath) {
	specs := fleetSpecs(f, slices.Contains(paths, pathTokenEvents))
	ix.SetReplicas(specs, now)
	cfg := ix.Config()
	keys := make([]uint64, f.prefixes*f.keys) // every prefix's chain, shared by its holders
	for i := range keys {
		keys[i] = mix64(uint64(i) + 1)
	}
	blocks := f.keys * cfg.Stride
	toks := make([]uint32, blocks*cfg.BlockTokens)
	hashes := make([]uint64, blocks)
	sink := ix.Events()
	var b api.ReportBatch
	for r := range f.replicas {
		for _, path := range paths {
			if path == pathTokenEvents {
				id := kvevents.StreamID{Replica: specs[r].ID}
				for n, p := range f.prefixesOf(r) {
					for i := range toks {
						toks[i] = uint32(mix64(uint64(p)<<32|uint64(i))) & 0x3ffff // token ids of prefix p
					}
					for i := range hashes {
						hashes[i] = mix64(uint64(p)<<16 | uint64(i) | 1<<62) // the engine's block hashes
					}
					ev := kvevents.Event{Kind: kvevents.BlockStored, Hashes: hashes, Tokens: toks, BlockSize: cfg.BlockTokens, Medium: "GPU"}
					sink.Batch(id, uint64(n), &kvevents.Batch{Events: []kvevents.Event{ev}})
				}
				continue
			}
			dom, size, kind := prefix.Text, cfg.BlockBytes, api.KindOutcome
			if path == pathTokenOutcome {
				dom, size = prefix.Token, cfg.BlockTokens
			}
			if path == pathTextPlacement {
				kind = api.KindPlacement
			}
			b.Reports = b.Reports[:0]
			for _, p := range f.prefixesOf(r) {
				b.Reports = append(b.Reports, api.Report{Kind: kind, Model: "m", Replica: specs[r].Addr, Domain: dom,
					BlockSize: size, Stride: cfg.Stride, Blocks: f.keys * cfg.Stride, Keys: keys[p*f.keys : (p+1)*f.keys],
					Status: 200, PromptTokens: f.keys * cfg.Stride * cfg.BlockTokens, PromptBytes: f.keys * cfg.Stride * cfg.BlockBytes})
			}
			ix.ApplyReports(&b, now, nil)
		}
	}
}

// BenchmarkMemoryFleet measures the index's live heap at fleet shape, per path: bytes
// per holding (a key on one replica), per distinct key, and per replica with nothing
// held; "est/heap" is the budget's accounting (bytes.go) over the measured heap.
//
//	go test ./controlplane/index -run '^$' -bench MemoryFleet -benchtime 1x
//
// -memfleet.shape replicas,prefixes,keys,holders measures another shape: 1000,2500,4,1
// is keys each held by one replica (each its own model entry).
func BenchmarkMemoryFleet(b *testing.B) {
	shape := fleet
	if *memFleetShape != "" {
		if _, err := fmt.Sscanf(*memFleetShape, "%d,%d,%d,%d", &shape.replicas, &shape.prefixes, &shape.keys, &shape.holders); err != nil ||
			min(shape.replicas, shape.prefixes, shape.keys, shape.holders) < 1 || shape.holders > shape.replicas {
			b.Fatalf("-memfleet.shape %q: want replicas,prefixes,keys,holders (%v)", *memFleetShape, err)
		}
	}
	for _, path := range fleetPaths {
		b.Run(string(path), func(b *testing.B) {
			for range b.N {
				m := measureFleet(b, Config{}, shape, path)
				b.ReportMetric(float64(m.holdings), "holdings")
				b.ReportMetric(float64(m.keys), "keys")
				b.ReportMetric(m.bytes/float64(m.holdings), "B/holding")
				b.ReportMetric(m.bytes/float64(m.keys), "B/key")
				b.ReportMetric(m.perReplica, "B/replica")
				b.ReportMetric(m.bytes/1e6, "MB")
				b.ReportMetric(m.seconds, "s")
				b.ReportMetric(float64(m.estimate)/m.heap, "est/heap")
			}
		})
	}
}

var memFleetShape = flag.String("memfleet.shape", "", "BenchmarkMemoryFleet: replicas,prefixes,keys,holders (default 1000,10000,32,4)")

type fleetMeasure struct {
	holdings, keys int
	bytes          float64 // live heap of the index after the load, less the empty replicas'
	heap           float64 // live heap of the whole index
	perReplica     float64 // live heap per replica with nothing held
	seconds        float64 // load time
	estimate       int64   // the budget's accounting (BudgetState().Bytes)
	index          *Index
}

// measureFleet loads one path into a new index (no budget unless cfg says) and
// measures the live heap after a GC. The first table build happens after the
// measurement (Flush clears the changed-key set, which a flood between two builds
// holds too).
func measureFleet(tb testing.TB, cfg Config, f fleetShape, path fleetPath) fleetMeasure {
	tb.Helper()
	if cfg.Budget.MaxKeys == 0 {
		cfg.Budget.MaxKeys = 1 << 40
	}
	if cfg.Budget.DefaultCapacityTokens == 0 {
		cfg.Budget.DefaultCapacityTokens = 1 << 40
	}
	base := heapLive()
	ix := New(cfg)
	ix.SetReplicas(fleetSpecs(f, path == pathTokenEvents), t0)
	empty := heapLive()
	start := time.Now()
	loadFleet(ix, f, t0, path)
	secs := time.Since(start).Seconds()
	after := heapLive()
	m := fleetMeasure{bytes: float64(after) - float64(empty), heap: float64(after) - float64(base),
		perReplica: (float64(empty) - float64(base)) / float64(f.replicas), seconds: secs, index: ix}
	m.estimate = ix.BudgetState().Bytes
	for _, r := range ix.replicas {
		m.holdings += r.hold.Len()
	}
	m.keys = ix.models["m"].keys.Len()
	return m
}
