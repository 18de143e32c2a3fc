package proxy

import (
	"sync"

	"github.com/kvroute/kvroute/wasmtest/host"
)

// What the filter's stream hooks tell the handler goroutine, and the queue that carries it.

type eventKind int

const (
	evRequestHeaders eventKind = iota
	evResponseHeaders
	evResponseData
	evResponseTrailers
	evLocalReply
	evReset
	evEdgeReply // a timeout or a framing error: the proxy answers (or resets) itself
)

type event struct {
	kind    eventKind
	headers host.Headers
	data    []byte
	eos     bool
	status  int
	reason  string
}

// eventQueue carries hook events to the handler goroutine without ever blocking a hook.
type eventQueue struct {
	mu     sync.Mutex
	items  []event
	signal chan struct{}
}

func newEventQueue() *eventQueue { return &eventQueue{signal: make(chan struct{}, 1)} }

func (q *eventQueue) push(e event) {
	q.mu.Lock()
	q.items = append(q.items, e)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

func (q *eventQueue) take() []event {
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	return items
}
