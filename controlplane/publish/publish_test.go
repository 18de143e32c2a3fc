package publish

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/table"
)

func update(reset bool, keys ...uint64) []index.ModelUpdate {
	u := index.ModelUpdate{Name: "m", Reset: reset,
		Config:   table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4},
		Replicas: []table.Replica{{Slot: 0, ID: "a", Addr: "10.0.0.1:8000", Healthy: true}}}
	for _, k := range keys {
		u.Upserts.Add(k, 0)
	}
	return []index.ModelUpdate{u}
}

// Polls are answered while a version is being applied: Publish builds the next table
// aside and only swaps it in under the lock. Before, Publish applied the delta under
// the lock every poll needs, and in TestReportFlood (controlplane) polls waited 340-680 ms
// for one large delta on a loaded machine, up to the filter's 1 s timeout.
func TestPollsAreAnsweredWhileAVersionIsApplied(t *testing.T) {
	p := New(Options{FirstVersion: 1})
	now := time.Unix(1_800_000_000, 0)
	if _, err := p.Publish(update(true, 1, 2, 3), now); err != nil {
		t.Fatal(err)
	}
	inApply, release := make(chan struct{}), make(chan struct{})
	p.beforeSwap = func() { close(inApply); <-release }
	done := make(chan error, 1)
	go func() {
		_, err := p.Publish(update(false, 4, 5), now.Add(time.Second))
		done <- err
	}()
	<-inApply // version 2 is built and waiting to be swapped in

	answered := make(chan Result, 2)
	go func() {
		answered <- p.Frame(0, false, "") // a full frame
		answered <- p.Frame(1, true, "")  // a filter at the current version
	}()
	for i := 0; i < 2; i++ {
		select {
		case r := <-answered:
			if r.Version != 1 {
				t.Fatalf("answer %d is version %d, want 1 until version 2 is swapped in", i, r.Version)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a poll waited for the version being applied")
		}
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r := p.Frame(1, true, ""); r.Version != 2 || r.Kind != table.Delta {
		t.Fatalf("after the swap: version %d kind %v, want a delta to 2", r.Version, r.Kind)
	}
}
