package index

import (
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/kvevents"
)

// deferredCommits is what /debug/state says of replica id's batch ends that found the
// model's lock busy.
func deferredCommits(ix *Index, id string) uint64 {
	for _, st := range ix.DebugState(t0) {
		if st.ID == id {
			return st.KVEvents.DeferredCommits
		}
	}
	return 0
}

// whileLocked runs f on a goroutine of its own while mu is held, and fails the test if f
// has not returned within a generous deadline (one blocked on mu never would); mu is
// released either way.
func whileLocked(t *testing.T, mu *sync.Mutex, what string, f func()) {
	t.Helper()
	mu.Lock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		mu.Unlock()
	case <-time.After(10 * time.Second):
		mu.Unlock()
		t.Fatal(what)
	}
}

// A KV-event batch's end does not wait for its model's lock: while another replica of
// the model commits, or a table build runs, the batch's slot changes stay pending,
// whole and in order, and the replica's next batch or the next Flush commits them.
// Before unlockStream every batch's end waited for the lock (here the first Batch did
// not return while the test held it), and the streams of a one-model fleet queued on it:
// IngestEndToEnd's goroutines on 2 cores spent 5 s blocked there in 4 s of running.
func TestBatchEndDoesNotWaitForTheModelLock(t *testing.T) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	m, a := ix.models["m"], ix.replicas["a"]
	// Replica b's first batch makes the model's first byte measurement, which waits for
	// the lock (meterModelSoon); later ones do not.
	ix.Events().Batch(kvevents.StreamID{Replica: "b"}, 0, batch(storedEv(seqHashes(4, 1001), nil, tokens(4*16, 9000), 16)))
	toks := tokens(8*16, 7)
	want := expectedKeys("m", "", "", toks, 4) // checkpoints 3 and 7

	// m.mu held: a build, or another replica committing.
	whileLocked(t, &m.mu, "the batch's end waited for the model's lock", func() {
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 0, batch(storedEv(seqHashes(8, 1), nil, toks, 16)))
	})
	if !a.pending.Load() {
		t.Fatal("the batch's changes were not left pending")
	}
	if got := deferredCommits(ix, "a"); got != 1 {
		t.Fatalf("/debug/state counts %d deferred commits, want 1", got)
	}

	// A build while the replica is inside a batch does not wait for it either, and
	// leaves its pending changes to it.
	var ups []ModelUpdate
	whileLocked(t, &a.mu, "Flush waited for a replica inside a batch", func() { ups = ix.Flush(t0, false) })
	w.apply(t, ups, t0)
	if got := w.held("m", 0, want); !none(got) {
		t.Fatalf("a build published changes a replica holds pending: %v", got)
	}

	// The replica idle, the next build commits them.
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, want); !all(got) || a.pending.Load() {
		t.Fatalf("after the next build: held %v, pending %v", got, a.pending.Load())
	}

	// Pending changes go before the next batch's: the model's lock busy again at the
	// store of a second chain, then its block 8 removed in a batch that commits both.
	toks2 := tokens(8*16, 5000)
	want2 := expectedKeys("m", "", "", toks2, 4)
	whileLocked(t, &m.mu, "the batch's end waited for the model's lock", func() {
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 1, batch(storedEv(seqHashes(8, 101), nil, toks2, 16)))
	})
	ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 2, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: []uint64{108}, Medium: "GPU"}))
	if a.pending.Load() || len(a.flips) != 0 {
		t.Fatalf("a batch with the lock free left changes pending (%d)", len(a.flips))
	}
	w.apply(t, ix.Flush(t0, false), t0)
	if got := w.held("m", 0, want2); !got[0] || got[1] {
		t.Fatalf("second chain after the removal of its last block: %v, want [true false]", got)
	}

	// A replica removed with changes pending: they are committed before its keys are
	// dropped, so none is left behind in the model under its freed slot.
	toks3 := tokens(8*16, 9000)
	want3 := expectedKeys("m", "", "", toks3, 4)
	whileLocked(t, &m.mu, "the batch's end waited for the model's lock", func() {
		ix.Events().Batch(kvevents.StreamID{Replica: "a"}, 3, batch(storedEv(seqHashes(8, 201), nil, toks3, 16)))
	})
	if !a.pending.Load() {
		t.Fatal("the batch's changes were not left pending")
	}
	ix.SetReplicas([]Spec{{ID: "b", Model: "m", Addr: "10.0.0.2:8000", Events: true}}, t0)
	w.apply(t, ix.Flush(t0, false), t0)
	for _, keys := range [][]uint64{want, want2, want3} {
		if got := w.held("m", 0, keys); !none(got) {
			t.Fatalf("the removed replica's slot still holds keys: %v", got)
		}
	}
	m.mu.Lock()
	left := m.keys.Len()
	m.mu.Unlock()
	if left != 1 { // replica b's chain: 4 blocks, checkpoint 3
		t.Fatalf("%d keys left in the model, want b's 1", left)
	}
}

// Two replicas of one model ingest while something else keeps taking the model's lock:
// batch ends find it busy and leave their changes pending, yet after the streams stop
// and a build runs, every chain stored and not removed is held where it was stored, every
// removed one is gone, nothing is left pending, and no replica ever kept much more than
// maxPendingFlips slot changes. With Flush's collectPending disabled it failed: 4,400-4,900
// slot changes still pending after the build.
func TestBatchesUnderModelLockContentionLoseNothing(t *testing.T) {
	contendedIngest(t, func(ix *Index) []ModelUpdate {
		m := ix.models["m"]
		m.mu.Lock()
		for range 2000 { // hold it a while, as a commit does
			_ = m.keys.Len()
		}
		m.mu.Unlock()
		return nil
	})
}

// The same with table builds running all the while, as the control plane's publisher
// runs them: every version's delta applied in turn gives, after the last, the same end
// state (a build collects what idle replicas left pending; one inside a batch keeps it).
func TestIngestWhileBuildingPublishesEverything(t *testing.T) {
	contendedIngest(t, func(ix *Index) []ModelUpdate { return ix.Flush(t0, false) })
}

// contendedIngest runs two replicas' streams of contendedChains chains (every other one
// removed again) while contend runs in a loop on its own goroutine, then applies the
// versions it built, in order, builds once more and checks the view and what the
// replicas still hold.
func contendedIngest(t *testing.T, contend func(ix *Index) []ModelUpdate) {
	ix := fixture(t, Config{})
	w := newView()
	w.apply(t, ix.Flush(t0, true), t0)
	stop := make(chan struct{})
	stopped := make(chan struct{})
	var built [][]ModelUpdate // contend's versions, applied once it has stopped
	go func() {
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
				if ups := contend(ix); ups != nil {
					built = append(built, ups)
				}
			}
		}
	}()
	chain := func(replica, c int) ([]uint32, []uint64) {
		toks := tokens(64*16, uint32(replica*1_000_000+c*10_000))
		return toks, seqHashes(64, uint64(replica*1_000_000+c*100+1))
	}
	ingest := func(replica int, id string) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			seq := uint64(0)
			for c := range contendedChains {
				toks, hs := chain(replica, c)
				ix.Events().Batch(kvevents.StreamID{Replica: id}, seq, batch(storedEv(hs, nil, toks, 16)))
				seq++
				if c%2 == 1 { // every other chain removed again, all its blocks
					ix.Events().Batch(kvevents.StreamID{Replica: id}, seq, batch(kvevents.Event{Kind: kvevents.BlockRemoved, Hashes: hs, Medium: "GPU"}))
					seq++
				}
			}
		}()
		return done
	}
	da, db := ingest(0, "a"), ingest(1, "b")
	<-da
	<-db
	close(stop)
	<-stopped
	for _, ups := range built {
		w.apply(t, ups, t0)
	}
	w.apply(t, ix.Flush(t0, false), t0)
	for slot, id := range []string{"a", "b"} {
		r := ix.replicas[id]
		r.mu.Lock()
		pending, left, kept := r.pending.Load(), len(r.flips), cap(r.flips)
		r.mu.Unlock()
		if pending || left != 0 {
			t.Fatalf("%s: %d slot changes still pending after a build", id, left)
		}
		if kept > 2*(maxPendingFlips+64) {
			t.Fatalf("%s kept room for %d pending slot changes, bound %d", id, kept, maxPendingFlips)
		}
		for c := range contendedChains {
			toks, _ := chain(slot, c)
			got := w.held("m", uint32(slot), expectedKeys("m", "", "", toks, 4))
			if c%2 == 0 && !all(got) || c%2 == 1 && !none(got) {
				t.Fatalf("%s chain %d (removed: %v): held %v", id, c, c%2 == 1, got)
			}
		}
	}
}

const contendedChains = 300
