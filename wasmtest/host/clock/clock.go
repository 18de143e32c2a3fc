// Package clock is the time source of the proxy-wasm host: the wall clock by default, or a
// virtual clock that only moves when the caller advances it, so a simulation can drive the
// real filter (its ticks, its HTTP-call timeouts and its own time.Now) in virtual time.
//
// An API on purpose: meant for reuse outside kvroute and kept compatible within a minor
// version (README, "What is an API").
package clock

import (
	"container/heap"
	"sync"
	"time"
)

// Clock tells the time and runs functions later.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f once d has elapsed on this clock. A wall clock runs f on its own
	// goroutine; a virtual clock runs it inside Advance.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the function from running; it reports whether it did so.
	Stop() bool
}

// Wall is the real clock.
func Wall() Clock { return wall{} }

type wall struct{}

func (wall) Now() time.Time                            { return time.Now() }
func (wall) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
func (wall) String() string                            { return "wall clock" }

// Virtual is a clock that stands still until Advance moves it. Functions scheduled with
// AfterFunc run inside Advance, one at a time, in order of due time and then of
// scheduling, with Now equal to their due time: a run is deterministic when the code it
// drives is.
type Virtual struct {
	mu      sync.Mutex
	now     time.Time
	seq     uint64
	events  eventHeap
	advance sync.Mutex // one Advance at a time
}

// NewVirtual returns a virtual clock that reads start until advanced.
func NewVirtual(start time.Time) *Virtual {
	return &Virtual{now: start}
}

// Now returns the current virtual time.
func (v *Virtual) Now() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.now
}

// AfterFunc schedules f at Now()+d. A non-positive d schedules f at Now(): it runs at the
// next Advance (Advance(0) runs everything that is due).
func (v *Virtual) AfterFunc(d time.Duration, f func()) Timer {
	if d < 0 {
		d = 0
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.seq++
	e := &event{when: v.now.Add(d), seq: v.seq, f: f, clock: v, index: -1}
	heap.Push(&v.events, e)
	return e
}

// Advance moves the clock forward by d, running every function that falls due on the way,
// including functions scheduled by those functions. It must not be called from inside a
// function the clock is running.
func (v *Virtual) Advance(d time.Duration) {
	if d < 0 {
		d = 0
	}
	v.AdvanceTo(v.Now().Add(d))
}

// AdvanceTo moves the clock to t (never backwards), running what falls due on the way.
func (v *Virtual) AdvanceTo(t time.Time) {
	v.advance.Lock()
	defer v.advance.Unlock()
	for {
		v.mu.Lock()
		if len(v.events) == 0 || v.events[0].when.After(t) {
			if t.After(v.now) {
				v.now = t
			}
			v.mu.Unlock()
			return
		}
		e := heap.Pop(&v.events).(*event)
		if e.when.After(v.now) {
			v.now = e.when
		}
		v.mu.Unlock()
		e.f()
	}
}

// Pending returns how many functions are scheduled and not yet run.
func (v *Virtual) Pending() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.events)
}

// Next returns the due time of the earliest scheduled function.
func (v *Virtual) Next() (time.Time, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.events) == 0 {
		return time.Time{}, false
	}
	return v.events[0].when, true
}

func (v *Virtual) String() string { return "virtual clock at " + v.Now().Format(time.RFC3339Nano) }

type event struct {
	when  time.Time
	seq   uint64
	f     func()
	clock *Virtual
	index int // position in the heap, -1 once popped or stopped
}

func (e *event) Stop() bool {
	v := e.clock
	v.mu.Lock()
	defer v.mu.Unlock()
	if e.index < 0 {
		return false
	}
	heap.Remove(&v.events, e.index)
	return true
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].when.Equal(h[j].when) {
		return h[i].when.Before(h[j].when)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *eventHeap) Push(x any) {
	e := x.(*event)
	e.index = len(*h)
	*h = append(*h, e)
}
func (h *eventHeap) Pop() any {
	old := *h
	n := len(old)
	e := old[n-1]
	old[n-1] = nil
	e.index = -1
	*h = old[:n-1]
	return e
}
