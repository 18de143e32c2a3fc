package kvevents

import (
	"math/rand/v2"
	"slices"
	"testing"

	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// checkSame decodes payload with the decoder and the reference and fails when they
// disagree on the result or on whether it is an error.
func checkSame(t *testing.T, d *Decoder, b *Batch, payload []byte) {
	t.Helper()
	err := d.Decode(payload, b)
	want, werr := refDecode(payload)
	if (err == nil) != (werr == nil) {
		t.Fatalf("payload %x: error %v, reference %v", payload, err, werr)
	}
	if err == nil && !sameBatch(b, want) {
		t.Fatalf("payload %x:\n got %+v\nwant %+v", payload, b, want)
	}
}

// The payload decoder agrees with the previous (general msgpack) decoder on every
// layout the engine simulator's independent encoder writes, and on truncated and
// corrupted copies of them.
func TestDecoderMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 1))
	d := NewDecoder()
	var b Batch
	for _, enc := range append(append([]sim.Encoding(nil), sim.Encodings...), sim.SGLang) {
		e := sim.NewEncoder(enc)
		for range 200 {
			var evs []sim.Event
			for range 1 + rng.IntN(4) {
				n := 1 + rng.IntN(4)
				ev := sim.Event{Kind: sim.Kind(1 + rng.IntN(3)), BlockSize: 16, Medium: []string{"", "GPU", "CPU"}[rng.IntN(3)],
					HasParent: rng.IntN(2) == 0, ParentBlockHash: rng.Uint64(), LoraName: []string{"", "ad"}[rng.IntN(2)]}
				if enc == sim.SGLang {
					ev.BlockSize = 1
				}
				if ev.Kind == sim.BlockRemoved {
					n = 1
				}
				for range n {
					ev.BlockHashes = append(ev.BlockHashes, rng.Uint64()>>rng.IntN(64))
				}
				if ev.Kind == sim.BlockStored {
					for range n * ev.BlockSize {
						ev.TokenIDs = append(ev.TokenIDs, uint32(rng.Uint64()>>rng.IntN(64)))
					}
					if rng.IntN(2) == 0 {
						ev.ExtraKeys = make([][]string, n)
						ev.ExtraKeys[0] = []string{"ad", "salt"}
					}
					ev.KVCacheSpecKind = []string{"", sim.SpecFullAttention}[rng.IntN(2)]
				}
				evs = append(evs, ev)
			}
			p, err := e.Encode(sim.Batch{TS: rng.Float64() * 2e9, Events: evs, DataParallelRank: rng.IntN(3)})
			if err != nil {
				t.Fatal(err)
			}
			checkSame(t, d, &b, p)
			for range 20 {
				q := append([]byte(nil), p...)
				switch rng.IntN(3) {
				case 0:
					q = q[:rng.IntN(len(q))]
				case 1:
					q[rng.IntN(len(q))] = byte(rng.Uint32())
				default:
					i := rng.IntN(len(q))
					q[i] = []byte{0xc0, 0xc1, 0xc2, 0xca, 0xcb, 0xcc, 0xcf, 0xd0, 0xd3, 0xd4, 0xd8, 0xc7, 0xc9, 0xd9, 0xdb, 0xc4, 0xc6, 0xdc, 0xdd, 0xde, 0xdf, 0xff, 0x90, 0x80, 0xa0}[rng.IntN(25)]
				}
				checkSame(t, d, &b, q)
			}
		}
	}
}

func FuzzDecoderMatchesReference(f *testing.F) {
	e := sim.NewEncoder(sim.Map)
	p, err := e.Encode(sim.Batch{TS: 1, Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: make([]uint32, 32), BlockSize: 16, Medium: "GPU"}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p)
	f.Add(gb(f, `93 cb41d954fc40200000 91 9c ab"BlockStored" 91 cfda7a5eed00000001 c0 920102 02 c0 a3"GPU" c0 91c0 00 ae"full_attention" c0 00`))
	f.Add(gb(f, `93 cb41d954fc40200000 91 94 ac"BlockRemoved" 91 cfda7a5eed00000001 a3"GPU" 00 00`))
	d := NewDecoder()
	var b Batch
	f.Fuzz(func(t *testing.T, payload []byte) { checkSame(t, d, &b, payload) })
}

// Token ids in runs of each msgpack form (tokens decodes four uint16s at once), of every
// length around four and ending anywhere near the payload's end, agree with the
// reference, whole and truncated at each of its last 64 bytes.
func TestTokenRunsMatchReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 2))
	forms := []func() uint32{
		func() uint32 { return uint32(rng.IntN(128)) },           // fixint
		func() uint32 { return 128 + uint32(rng.IntN(128)) },     // uint8
		func() uint32 { return 256 + uint32(rng.IntN(65280)) },   // uint16
		func() uint32 { return 65536 + uint32(rng.IntN(1<<30)) }, // uint32
	}
	d := NewDecoder()
	var b Batch
	for _, enc := range []sim.Encoding{sim.Map, sim.Array} {
		e := sim.NewEncoder(enc)
		for range 300 {
			var toks []uint32
			for len(toks) < 16 {
				form := forms[rng.IntN(len(forms))]
				if rng.IntN(2) == 0 {
					form = forms[2]
				}
				for range 1 + rng.IntN(9) {
					toks = append(toks, form())
				}
			}
			blocks := len(toks) / 4
			ev := sim.Event{Kind: sim.BlockStored, BlockSize: 4, TokenIDs: toks[:4*blocks], Medium: "GPU"}
			for i := range blocks {
				ev.BlockHashes = append(ev.BlockHashes, uint64(i+1))
			}
			p, err := e.Encode(sim.Batch{TS: 1, Events: []sim.Event{ev}})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Decode(p, &b); err != nil || !slices.Equal(b.Events[0].Tokens, ev.TokenIDs) {
				t.Fatalf("%x: tokens %v, %v; want %v", p, b.Events[0].Tokens, err, ev.TokenIDs)
			}
			for n := len(p); n >= 0 && n > len(p)-64; n-- {
				checkSame(t, d, &b, p[:n])
			}
		}
	}
}
