package api

import (
	"testing"
	"time"
)

// A version is dated from when the poll left, plus the time the control plane says it
// held the poll, minus its age: never later than it was built, whatever the answer took
// to come back.
func TestTableBuiltIsTheEarliestItCanHaveBeen(t *testing.T) {
	sent := time.Unix(1_800_000_000, 0)
	now := sent.Add(30 * time.Millisecond) // the answer took 30 ms in all
	for _, c := range []struct {
		name      string
		age, held time.Duration
		want      time.Time
	}{
		{"answered at once", 100 * time.Millisecond, 0, sent.Add(-100 * time.Millisecond)},
		{"held 20 ms", 2 * time.Millisecond, 20 * time.Millisecond, sent.Add(18 * time.Millisecond)},
		{"held longer than the poll took (a clock that ran slow)", 0, time.Second, now},
		{"a control plane that does not say", 100 * time.Millisecond, -1, now.Add(-100 * time.Millisecond)},
	} {
		if got := TableBuilt(sent, now, c.age, c.held); !got.Equal(c.want) {
			t.Errorf("%s: built %v after the poll left, want %v", c.name, got.Sub(sent), c.want.Sub(sent))
		}
	}
	if got := TableBuilt(time.Time{}, now, time.Millisecond, 0); !got.Equal(now.Add(-time.Millisecond)) {
		t.Errorf("no poll on record: built %v", got)
	}
}
