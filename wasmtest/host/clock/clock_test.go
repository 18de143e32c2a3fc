package clock_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

func TestVirtualRunsDueFunctionsInOrderAtTheirTime(t *testing.T) {
	start := time.Unix(1000, 0)
	v := clock.NewVirtual(start)
	var got []string
	at := func(name string) func() {
		return func() { got = append(got, fmt.Sprintf("%s@%v", name, v.Now().Sub(start))) }
	}
	v.AfterFunc(30*time.Millisecond, at("c"))
	v.AfterFunc(10*time.Millisecond, at("a"))
	v.AfterFunc(10*time.Millisecond, at("b")) // same time: scheduling order
	v.AfterFunc(10*time.Millisecond, func() {
		// Scheduled while running: due now, so it runs in this Advance too.
		v.AfterFunc(0, at("nested"))
		v.AfterFunc(25*time.Millisecond, at("late"))
	})
	stopped := v.AfterFunc(20*time.Millisecond, at("stopped"))
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop must succeed once")
	}
	v.Advance(5 * time.Millisecond)
	if len(got) != 0 || v.Now() != start.Add(5*time.Millisecond) {
		t.Fatalf("ran %v early, now %v", got, v.Now())
	}
	v.Advance(25 * time.Millisecond)
	want := "[a@10ms b@10ms nested@10ms c@30ms]"
	if fmt.Sprint(got) != want {
		t.Fatalf("got %v, want %s", got, want)
	}
	if v.Pending() != 1 {
		t.Fatalf("pending %d, want the late one", v.Pending())
	}
	if next, _ := v.Next(); next != start.Add(35*time.Millisecond) {
		t.Fatalf("next %v", next)
	}
	v.Advance(time.Hour)
	if fmt.Sprint(got[len(got)-1]) != "late@35ms" || v.Now() != start.Add(30*time.Millisecond+time.Hour) {
		t.Fatalf("got %v, now %v", got, v.Now())
	}
}

func TestAdvanceZeroRunsWhatIsDue(t *testing.T) {
	v := clock.NewVirtual(time.Unix(0, 0))
	ran := false
	v.AfterFunc(0, func() { ran = true })
	if ran {
		t.Fatal("ran inside AfterFunc")
	}
	v.Advance(0)
	if !ran {
		t.Fatal("Advance(0) did not run a function due now")
	}
}
