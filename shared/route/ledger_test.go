package route

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The Ledger answers as the walk over every entry did (refLedger), under a random mix of
// sends, other VMs' sends up to a tick late, starts (a few dated before their sends),
// ends, replaced ids, expiry and snapshots of any age up to 3 s (Sums' cursors move both
// ways), and
// its lists stay within a few times the most entries it held (a push compacts a list
// more than half dead, and moves down one whose consumed head is longer than the rest;
// without pushes a list does not grow).
func TestLedgerMatchesReference(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		l, ref := NewLedger(), newRefLedger()
		now := time.Unix(1_800_000_000, 0)
		addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}
		most := 0 // the most entries held so far
		for step := range 10000 {
			// Whole milliseconds: sends and starts at a snapshot's instant (ties); ids reused:
			// replaced entries.
			now = now.Add(time.Duration(rng.IntN(3)) * time.Millisecond)
			id := uint64(rng.IntN(3000))
			addr := addrs[rng.IntN(len(addrs))]
			tokens := float64(rng.IntN(5000))
			switch op := rng.IntN(100); {
			case op < 30:
				l.Add(id, addr, tokens, now)
				ref.Add(id, addr, tokens, now)
			case op < 40:
				at := now.Add(-time.Duration(rng.IntN(100)) * time.Millisecond)
				l.AddPeer(1<<63|id, addr, tokens, at)
				ref.AddPeer(1<<63|id, addr, tokens, at)
			case op < 65:
				at := now
				if rng.IntN(10) == 0 { // a host clock stepped back: a start before its send
					at = now.Add(-time.Duration(rng.IntN(50)) * time.Millisecond)
				}
				if rng.IntN(3) == 0 { // another VM's placement, its start told by a record
					id |= 1 << 63
				}
				l.Started(id, at)
				ref.Started(id, at)
			case op < 80:
				l.Done(id)
				ref.Done(id)
			case op < 83:
				cut := now.Add(-2 * time.Second)
				l.DropStarts(cut)
				ref.DropStarts(cut)
			case op < 85:
				cut := now.Add(-3 * time.Second)
				require.Equal(t, ref.Expire(cut), l.Expire(cut))
			case op < 87:
				cut := now.Add(-time.Second)
				require.Equal(t, ref.ExpirePeers(cut), l.ExpirePeers(cut))
			default:
				since := now.Add(-time.Duration(rng.IntN(3000)) * time.Millisecond)
				c, p := l.Sums(addr, since)
				rc, rp := ref.Sums(addr, since)
				require.Equal(t, rc, c, "seed %d step %d: correction of %s since %v", seed, step, addr, since)
				require.Equal(t, rp, p, "seed %d step %d: pending of %s", seed, step, addr)
				require.Equal(t, ref.PendingSince(addr, since), l.PendingSince(addr, since))
			}
			if ref.Len() != l.Len() {
				t.Fatalf("seed %d step %d: Len %d, want %d", seed, step, l.Len(), ref.Len())
			}
			most = max(most, l.entries.Len())
			requireBounded(t, l, most)
		}
	}
}

// A decision's Sums read the entries sent or started after the snapshot, not the
// thousands of starts a busy proxy keeps for 2 s: the walk over every entry for every
// replica cost 7.7 ms a decision in the wasm guest at 2,560 requests/s
// (BenchmarkLedgerSums, impl=reference).
func TestLedgerSumsReadOnlyWhatIsNewerThanTheSnapshot(t *testing.T) {
	l := NewLedger()
	now := time.Unix(1_800_000_000, 0)
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000"}
	for i := range 5000 { // 2 s at 2,500 requests/s, each started 100 ms after its send
		l.Add(uint64(i), addrs[i%2], 100, now)
		if i >= 250 {
			l.Started(uint64(i-250), now)
		}
		now = now.Add(400 * time.Microsecond)
	}
	since := now.Add(-20 * time.Millisecond) // 49 sends and 49 starts after it
	l.visits = 0
	c, p := l.Sums(addrs[0], since)
	const sentAfter, startedAfter = 24 * 100.0, 24 * 100.0
	assert.Equal(t, sentAfter-startedAfter, c, "24 sent after the snapshot, 24 sent by it and started after it")
	assert.Equal(t, 125*100.0, p, "250 not started, half of them to this replica")
	assert.LessOrEqual(t, l.visits, 49+2, "references read (the ledger holds 5,000)")
}

// A snapshot that advances moves Sums' cursors by the entries between its old and its
// new time, however many are newer than it: with 1 s old snapshots at 2,500
// requests/s, the walk over everything newer read 2,500 references a replica (a
// decision at 22 replicas: 39 us natively, 170 us under wazero; BenchmarkLedgerSums).
func TestLedgerSumsReadWhatTheSnapshotPassed(t *testing.T) {
	l, ref := NewLedger(), newRefLedger()
	now := time.Unix(1_800_000_000, 0)
	addrs := []string{"10.0.0.1:8000", "10.0.0.2:8000"}
	for i := range 5000 { // 2 s at 2,500 requests/s, each started 100 ms after its send
		for _, x := range []interface {
			Add(uint64, string, float64, time.Time)
			Started(uint64, time.Time)
		}{l, ref} {
			x.Add(uint64(i), addrs[i%2], float64(1+i%7), now)
			if i >= 250 {
				x.Started(uint64(i-250), now)
			}
		}
		now = now.Add(400 * time.Microsecond)
	}
	since := now.Add(-time.Second)
	l.Sums(addrs[0], since) // the cursors' first place
	for step := range 5 {
		since = since.Add(10 * time.Millisecond) // 25 sends and 25 starts, half to addrs[0]
		l.visits = 0
		c, p := l.Sums(addrs[0], since)
		rc, rp := ref.Sums(addrs[0], since)
		require.Equal(t, rc, c, "step %d: correction", step)
		require.Equal(t, rp, p, "step %d: pending", step)
		assert.LessOrEqual(t, l.visits, 2*13, "step %d: references read (1,250 sent and 1,250 started after the snapshot)", step)
	}
}

// The pending sum is kept running, so one entry of NaN or infinite tokens (another VM's
// record read torn) would poison it for as long as the address has entries: such an
// entry counts 0.
func TestLedgerIgnoresTokensThatAreNotANumber(t *testing.T) {
	l := NewLedger()
	now := time.Unix(1000, 0)
	l.Add(1, "a", 100, now)
	l.AddPeer(2, "a", math.NaN(), now)
	l.AddPeer(3, "a", math.Inf(1), now)
	l.Add(4, "a", -5, now)
	c, p := l.Sums("a", now.Add(-time.Second))
	assert.Equal(t, 100.0, c)
	assert.Equal(t, 100.0, p)
}

// A ledger holds at most MaxLedgerEntries, the earliest sent dropped first, even when no
// expiry can drop anything (the entries are dated after every cutoff: a clock stepped
// back).
func TestLedgerIsBounded(t *testing.T) {
	l := NewLedger()
	future := time.Unix(2_000_000_000, 0)
	for i := range MaxLedgerEntries + 1000 {
		l.Add(uint64(i), "a", 1, future.Add(time.Duration(i)*time.Millisecond))
	}
	l.Expire(time.Unix(1_800_000_000, 0))
	assert.Equal(t, MaxLedgerEntries, l.Len())
	_, p := l.Sums("a", future)
	assert.Equal(t, float64(MaxLedgerEntries), p)
	_, ok := l.entries.Get(999)
	assert.False(t, ok, "the earliest sent are the ones dropped")
	requireBounded(t, l, MaxLedgerEntries+1) // a slot is taken before the earliest entry leaves
}

func requireBounded(t *testing.T, l *Ledger, most int) {
	t.Helper()
	bound := func(q *refList, what string) {
		if len(q.r) > 2*(2*most+65)+64 {
			t.Fatalf("%s holds %d references; the ledger never held more than %d entries", what, len(q.r), most)
		}
	}
	bound(&l.byAt, "byAt")
	bound(&l.byPeer, "byPeer")
	bound(&l.byStart, "byStart")
	for addr, a := range l.addrs {
		bound(&a.sent, addr+" sent")
		bound(&a.starts, addr+" starts")
	}
	if len(l.slots) > most {
		t.Fatalf("%d slots for at most %d entries", len(l.slots), most)
	}
}

// BenchmarkLedgerSums: what one decision asks of a proxy's ledger at 2,560 requests/s,
// each started 300 ms after its send and kept 2 s as a start: Sums of each of 22
// replicas against a snapshot that a table version renews every 100 ms and that is
// then age old (so between age and age+100 ms old), with the decision's own send and
// the start of one sent 300 ms before. impl=reference walks every entry for each
// replica, the cost the Ledger's cursors avoid.
//
//	go test ./shared/route -run '^$' -bench LedgerSums
func BenchmarkLedgerSums(b *testing.B) {
	type ledger interface {
		Add(id uint64, addr string, tokens float64, at time.Time)
		Started(id uint64, at time.Time)
		DropStarts(cutoff time.Time)
		Sums(addr string, since time.Time) (float64, float64)
	}
	addrs := make([]string, 22)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i)
	}
	const gap, startAfter, period = time.Second / 2560, 770, 100 * time.Millisecond
	for _, impl := range []string{"reference", "ledger"} {
		for _, age := range []time.Duration{50 * time.Millisecond, time.Second} {
			b.Run(fmt.Sprintf("impl=%s/age=%v", impl, age), func(b *testing.B) {
				var l ledger = NewLedger()
				if impl == "reference" {
					l = newRefLedger()
				}
				now := time.Unix(1_800_000_000, 0)
				id := uint64(0)
				step := func() {
					l.Add(id, addrs[id%uint64(len(addrs))], 1000, now)
					if id >= startAfter {
						l.Started(id-startAfter, now)
					}
					id++
					now = now.Add(gap)
				}
				for range 2 * 2560 {
					step()
				}
				b.ReportAllocs()
				for b.Loop() {
					step()
					if id%256 == 0 {
						l.DropStarts(now.Add(-2 * time.Second))
					}
					since := now.Truncate(period).Add(-age)
					for _, a := range addrs {
						l.Sums(a, since)
					}
				}
			})
		}
	}
}
