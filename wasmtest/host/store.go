package host

import (
	"sort"
	"sync"
)

// store is the shared data and the shared queues of one host, the equivalent of
// cpp-host's process-wide maps for one vm_id: a key holds a value and a CAS number, a
// queue is named and delivers proxy_on_queue_ready to the context that registered it last.
type store struct {
	mu        sync.Mutex
	data      map[string]sharedValue
	cas       uint32
	queueIDs  map[string]uint32
	queues    map[uint32]*queue
	nextQueue uint32
}

type sharedValue struct {
	value []byte
	cas   uint32
}

type queue struct {
	name      string
	items     [][]byte
	vm        *VM    // the VM that registered it last
	contextID uint32 // its root context
}

func newStore() *store {
	return &store{data: map[string]sharedValue{}, queueIDs: map[string]uint32{}, queues: map[uint32]*queue{}}
}

func (s *store) get(key string) ([]byte, uint32, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.data[key]
	if !ok {
		return nil, 0, false
	}
	return append([]byte(nil), v.value...), v.cas, true
}

// set follows cpp-host SharedData::set: cas 0 writes unconditionally, a non-zero cas must
// match the current one, and a key that does not exist yet is written whatever the cas.
// Every write gets a new non-zero CAS number.
func (s *store) set(key string, value []byte, cas uint32) status {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.data[key]; ok && cas != 0 && cas != cur.cas {
		return statusCasMismatch
	}
	s.cas++
	if s.cas == 0 {
		s.cas++
	}
	s.data[key] = sharedValue{value: append([]byte(nil), value...), cas: s.cas}
	return statusOK
}

func (s *store) keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.data))
	for k := range s.data {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// register returns the queue's token, creating the queue on first use; the caller becomes
// the context that proxy_on_queue_ready goes to (last registration wins, as in cpp-host).
func (s *store) register(name string, vm *VM, contextID uint32) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.queueIDs[name]
	if !ok {
		s.nextQueue++
		id = s.nextQueue
		s.queueIDs[name] = id
		s.queues[id] = &queue{name: name}
	}
	q := s.queues[id]
	q.vm, q.contextID = vm, contextID
	return id
}

func (s *store) resolve(name string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queueIDs[name]
}

// enqueue appends an item and returns where proxy_on_queue_ready must go.
func (s *store) enqueue(id uint32, item []byte) (*VM, uint32, status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[id]
	if !ok {
		return nil, 0, statusNotFound
	}
	q.items = append(q.items, append([]byte(nil), item...))
	return q.vm, q.contextID, statusOK
}

func (s *store) dequeue(id uint32) ([]byte, status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q, ok := s.queues[id]
	if !ok {
		return nil, statusNotFound
	}
	if len(q.items) == 0 {
		return nil, statusEmpty
	}
	item := q.items[0]
	q.items[0] = nil
	q.items = q.items[1:]
	return item, statusOK
}

func (s *store) queueLen(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.queueIDs[name]
	if !ok {
		return -1
	}
	return len(s.queues[id].items)
}
