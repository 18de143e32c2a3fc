package main

import (
	"encoding/binary"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
)

// Reports leave a VM in batches: the request path appends each report as a binary
// record (api.ReportsContentType) to the VM's buffer, with no allocation and no host
// call; the VM's tick hands the buffer's items to the shared queue; the leader's tick
// posts its own items from its buffer (leader.go, postOwn), then dequeues every other
// item (at most maxPostsPerTick in all) and posts each as a binary batch. A
// report waits at most a tick longer than if it were its own queue item, and the leader
// dequeues a few items per VM per tick instead of one per report.
//
// Each shard has its own buffer in each VM and its own queue (keys.queue:
// kvroute/reports/v2 for the control_plane block, kvroute/shard/<name>/reports/v2 for
// a named shard), so the leader posts each shard's
// reports to that shard's control plane.
//
// A queue item is itemMagic, the number of records (uint32, little endian), then a whole
// binary batch (its header with the proxy's name, then the records): the leader posts
// each item's batch as it was dequeued, without copying it. An item holds at most
// maxItemRecords reports (and never more than max_report_batch, the most in one POST), so
// a VM's buffer holds its items back to back and the tick enqueues each: no request pays
// for the host's copy of a full item (280 KB at 256 reports of 8,000-token prompts) or
// allocates the next buffer. The queue is named for its
// format, so VMs of an older filter (a configuration reload runs both for a while) never
// mix JSON items into a binary batch.
//
// A buffer handed to the queue is reused once the leader has taken its items out of the
// queue, never before: a host may keep the bytes it is given until they are dequeued (the
// SDK's emulator does). Each shard counts the VMs' flushes in shared data (keys.flushed,
// incremented after a flush's items are in the queue), and the leader, when it has
// emptied the queue, writes the count it read before it began (keys.drained): every
// flush counted up to there has been dequeued. A buffer retired at a flush counted no
// later than that is free; one whose count is unknown (a failed increment) is left to
// the garbage collector. So the ticks allocate no buffer in steady state, and the
// collector does not run in them (TestKvrouteTicksCollectNoGarbage).
const (
	reportQueue = "reports/v2" // under the shard's key prefix (store.go, newKeys)
	itemMagic   = "KVQ2"
	itemHead    = len(itemMagic) + 4
	// maxItemRecords: the most reports in one item; the leader never posts more than
	// max_report_batch.
	maxItemRecords = 256
	// maxHeldItems: a VM whose tick is late enqueues its items on the request path
	// rather than hold more than this many (4,096 reports, 4.5 MB of 8,000-token ones).
	maxHeldItems = 16
	// maxPostsPerTick bounds the leader's posts (items) on one tick, for each shard:
	// 4,096 reports, 40,960 a second, well above a busy proxy's three reports a request
	// (TestKvrouteLeaderKeepsUpWith3200RequestsASecond); max_report_batch reports a tick
	// would be 5,120 a second, and a busier proxy's queue would grow without bound.
	maxPostsPerTick = 16
)

// reports are one shard's reports on one VM: the buffer the request path appends them to
// and the shard's queue the tick hands them to.
type reports struct {
	queueID  uint32
	ok       bool // the queue is registered (ids start at 0 on some hosts)
	keys     *keys
	maxBatch int      // the shard's max_report_batch
	proxy    string   // the name batches carry (proxyName)
	value    *hostBuf // the VM's buffer for shared-data reads (hostmem.go)
	dropped  proxywasm.MetricCounter
	count    [8]byte // a count being written to shared data

	b     []byte // items back to back; nil until the first report
	items []int  // where each item in b starts
	n     int    // records in the last item
	cap   int    // the last flush's size: a new buffer starts a quarter larger
	// The buffers of the last two flushes, and their flush counts (0: unknown), until
	// the leader has drained them (see above).
	spent [2]spentBuf
}

type spentBuf struct {
	b     []byte
	flush uint64
}

// enqueue appends one report to the VM's batch.
func (rb *reports) enqueue(r *api.Report) {
	if !rb.ok {
		return
	}
	switch {
	case rb.b == nil:
		rb.fresh()
	case rb.n >= min(maxItemRecords, rb.maxBatch):
		if len(rb.items) >= maxHeldItems {
			rb.flush()
		} else {
			rb.startItem()
		}
	}
	rb.b = r.AppendBinary(rb.b)
	rb.n++
}

// flush hands the VM's items to the shard's shared queue, one queue item each, and
// starts the next buffer.
func (rb *reports) flush() {
	if rb.n == 0 {
		return
	}
	rb.closeItem()
	for i := range rb.items {
		item := rb.item(i)
		if err := proxywasm.EnqueueSharedQueue(rb.queueID, item); err != nil {
			rb.dropped.Increment(uint64(itemCount(item)))
		}
	}
	// A quarter more than this tick's (halving back over quiet ticks), so a busier tick
	// seldom grows it on the request path.
	rb.cap = max(len(rb.b)+len(rb.b)/4, rb.cap/2)
	rb.spent[1], rb.spent[0] = rb.spent[0], spentBuf{rb.b, rb.countFlush()}
	rb.fresh() // here, on the tick, rather than on the next request
}

// fresh starts the next buffer with an empty item: a spent one the leader has drained,
// or a new one of rb.cap bytes.
func (rb *reports) fresh() {
	rb.b = nil
	if rb.spent[0].b != nil || rb.spent[1].b != nil {
		drained := readCount(rb.value, rb.keys.drained)
		for i := range rb.spent {
			if sp := &rb.spent[i]; sp.b != nil && sp.flush != 0 && sp.flush <= drained {
				rb.b, *sp = sp.b[:0], spentBuf{}
				break
			}
		}
	}
	if rb.b == nil {
		rb.b = make([]byte, 0, max(rb.cap, 4096))
	}
	rb.items = rb.items[:0]
	rb.startItem()
}

// countFlush adds this flush to the shard's count in shared data and returns the count,
// 0 when it is not known (the key was new, or the CAS kept failing).
func (rb *reports) countFlush() uint64 {
	for try := 0; try < 4; try++ {
		b, cas, err := rb.value.sharedData(rb.keys.flushed)
		if err != nil && err != types.ErrorStatusNotFound {
			return 0
		}
		v := uint64(0)
		if len(b) == 8 {
			v = binary.LittleEndian.Uint64(b)
		}
		binary.LittleEndian.PutUint64(rb.count[:], v+1)
		if err := proxywasm.SetSharedData(rb.keys.flushed, rb.count[:], cas); err == nil {
			if cas == 0 {
				return 0 // created: another VM may have created it too
			}
			return v + 1
		}
	}
	return 0
}

// readCount reads a count kept in shared data into v (0 when there is none).
func readCount(v *hostBuf, key string) uint64 {
	if b, _, err := v.sharedData(key); err == nil && len(b) == 8 {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// startItem closes the last item, if any, and starts another.
func (rb *reports) startItem() {
	if len(rb.items) > 0 {
		rb.closeItem()
	}
	rb.items = append(rb.items, len(rb.b))
	rb.b = append(rb.b, itemMagic...)
	rb.b = append(rb.b, 0, 0, 0, 0)
	rb.b = api.AppendBatchHeader(rb.b, rb.proxy)
	rb.n = 0
}

// item is the VM's item i, its head included.
func (rb *reports) item(i int) []byte {
	end := len(rb.b)
	if i+1 < len(rb.items) {
		end = rb.items[i+1]
	}
	return rb.b[rb.items[i]:end]
}

// itemCount is the count of records an item's head says it holds.
func itemCount(item []byte) int { return int(binary.LittleEndian.Uint32(item[len(itemMagic):])) }

// closeItem writes the last item's count of records.
func (rb *reports) closeItem() {
	at := rb.items[len(rb.items)-1] + len(itemMagic)
	binary.LittleEndian.PutUint32(rb.b[at:], uint32(rb.n))
}

// own readies the VM's items for the leader to post from the buffer itself (leader.go
// postOwn) and returns how many there are (item(i) is each): none when the buffer is
// empty, or when it holds more than most, which go through the queue as any VM's.
// reuse empties the buffer once they are posted.
func (rb *reports) own(most int) int {
	if rb.n == 0 {
		return 0
	}
	if len(rb.items) > most {
		rb.flush()
		return 0
	}
	rb.closeItem()
	return len(rb.items)
}

// reuse empties the buffer for the next reports: the host copied the items posted from it.
func (rb *reports) reuse() {
	rb.b, rb.items = rb.b[:0], rb.items[:0]
	rb.startItem()
}

// next dequeues the shard's next report item into buf (valid until buf's next use) and
// returns it and its report count; false when the queue is empty. Items that are not
// this format's are dropped and counted.
func (rb *reports) next(buf *hostBuf) ([]byte, int, bool) {
	for {
		b, err := buf.dequeue(rb.queueID)
		if err != nil {
			return nil, 0, false
		}
		if len(b) < itemHead || string(b[:len(itemMagic)]) != itemMagic {
			rb.dropped.Increment(1)
			continue
		}
		return b, itemCount(b), true
	}
}
