package main

import (
	"encoding/binary"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/api"
)

// Reports leave a VM in batches: the request path appends each report as a binary
// record (api.ReportsContentType) to the VM's buffer, with no allocation and no host
// call; the VM's tick (or a full buffer) hands the buffer to the shared queue as one
// item; the leader's tick drains at most max_report_batch reports' worth of items and
// posts each as a binary batch. A report waits at most a tick longer than when every
// report was its own queue item, and the leader dequeues one item per VM per tick
// instead of one per report.
//
// Each shard has its own buffer in each VM and its own queue (keys.queue: the report
// queue below for the control_plane block, kvroute/shard/<name>/reports/v2 for a named
// shard), so the leader posts each shard's reports to that shard's control plane.
//
// A queue item is itemMagic, the number of records (uint32, little endian), then a whole
// binary batch (its header with the proxy's name, then the records): the leader posts
// each item's batch as it was dequeued, without copying it. The queue is named for its format, so VMs of an older filter (a configuration
// reload runs both for a while) never mix JSON items into a binary batch.
const (
	reportQueue = "kvroute/reports/v2"
	itemMagic   = "KVQ2"
	itemHead    = len(itemMagic) + 4
	// maxItemRecords: a VM flushes at this many reports even before its tick, and the
	// leader never posts more than max_report_batch.
	maxItemRecords = 256
)

type reportBuf struct {
	b   []byte // itemHead, then n records; nil after a flush
	n   int
	cap int // the last flush's size: the next buffer starts that large
}

// enqueue appends one report to the VM's batch for shard s.
func (p *plugin) enqueue(s *shard, r *api.Report) {
	if !s.queueOK {
		return
	}
	rb := &s.reports
	if rb.b == nil {
		p.freshReports(s)
	}
	rb.b = r.AppendBinary(rb.b)
	rb.n++
	if rb.n >= min(maxItemRecords, s.cp.MaxReportBatch) {
		p.flushReports(s)
	}
}

// flushAllReports hands every shard's batch to its queue (each VM, each tick).
func (p *plugin) flushAllReports() {
	for _, s := range p.shards {
		p.flushReports(s)
	}
}

// flushReports hands the VM's batch for s to s's shared queue. The buffer is not
// reused: a host may keep the bytes it is given (the SDK's emulator does).
func (p *plugin) flushReports(s *shard) {
	rb := &s.reports
	if rb.n == 0 {
		return
	}
	binary.LittleEndian.PutUint32(rb.b[len(itemMagic):], uint32(rb.n))
	if err := proxywasm.EnqueueSharedQueue(s.queueID, rb.b); err != nil {
		p.metrics.reportsDropped.Increment(uint64(rb.n))
	}
	// Twice the last batch (halving back over quiet ticks), so a busier tick seldom
	// grows it on the request path.
	rb.cap = max(2*len(rb.b), rb.cap/2)
	p.freshReports(s) // here, on the tick, rather than on the next request
}

// fresh starts a new buffer of rb.cap bytes.
func (p *plugin) freshReports(s *shard) {
	rb := &s.reports
	rb.b = append(make([]byte, 0, max(rb.cap, 4096)), itemMagic...)
	rb.b = append(rb.b, 0, 0, 0, 0)
	rb.b = api.AppendBatchHeader(rb.b, p.proxyName())
	rb.n = 0
}

// drainReports dequeues items until the next one might take the batch past limit
// reports, and returns them and their report count. Items that are not this format's
// are dropped and counted.
func (p *plugin) drainReports(s *shard, items [][]byte, limit int) ([][]byte, int) {
	n := 0
	step := min(maxItemRecords, limit)
	for n == 0 || n+step <= limit {
		b, err := proxywasm.DequeueSharedQueue(s.queueID)
		if err != nil {
			break
		}
		if len(b) < itemHead || string(b[:len(itemMagic)]) != itemMagic {
			p.metrics.reportsDropped.Increment(1)
			continue
		}
		items = append(items, b)
		n += int(binary.LittleEndian.Uint32(b[len(itemMagic):]))
	}
	return items, n
}
