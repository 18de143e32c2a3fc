package main

import (
	"encoding/binary"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/admit"
	"github.com/kvroute/kvroute/shared/api"
)

// Tenant shares across the proxies (api.SharesPath). Every VM's admission (shared/admit)
// counts the prefill tokens it admits per tenant; on each tick the VM adds those since its
// last tick into one shared-data entry, and the leader, on its affinity ticks, takes that
// entry, posts it to the control plane and writes the answer (the fleet's totals) where
// every VM reads it into its admission:
//
//	kvroute/shares/pending  an api.SharesContentType body: the tokens not yet posted
//	kvroute/shares/fleet    when the leader got the answer (unix ms, 8 bytes), the answer
//
// Both hold tenant hashes and counts only, at most api.MaxSharePost and
// api.MaxSharesAnswer entries. A control plane without the path (404) is asked again a
// minute later, and meanwhile the VMs' shares are their own (admit.FleetFresh).
const (
	sharesPendingKey = "kvroute/shares/pending"
	sharesFleetKey   = "kvroute/shares/fleet"
	// sharesTries bounds a VM's compare-and-swap attempts at adding to the pending entry.
	sharesTries = 4
)

// vmShares is one VM's side: its admission's tokens into the pending entry, the fleet's
// totals out of the fleet entry.
type vmShares struct {
	c      *admit.Controller
	value  *hostBuf
	seen   uint64 // the stamp of the fleet entry last given to c
	local  []api.ShareEntry
	have   []api.ShareEntry
	sum    map[uint64]float32
	body   []byte
	fleet  []api.ShareEntry
	errors proxywasm.MetricCounter
}

func (v *vmShares) tick() {
	if v.c == nil {
		return
	}
	v.flush()
	b, _, err := v.value.sharedData(sharesFleetKey)
	if err != nil || len(b) < 8 {
		return
	}
	stamp := binary.LittleEndian.Uint64(b)
	if stamp == v.seen {
		return
	}
	v.seen = stamp
	v.fleet, err = api.ParseShares(v.fleet[:0], b[8:], api.MaxSharesAnswer)
	if err != nil {
		v.errors.Increment(1)
		return
	}
	v.c.SetFleet(v.fleet, time.UnixMilli(int64(stamp)))
}

// flush adds the tokens admitted since the last tick to the pending entry; those of
// tenants past api.MaxSharePost, or lost to sharesTries writes that raced, are counted.
func (v *vmShares) flush() {
	v.local = v.c.Pending(v.local[:0])
	if len(v.local) == 0 {
		return
	}
	if v.sum == nil {
		v.sum = make(map[uint64]float32)
	}
	for range sharesTries {
		b, cas, err := v.value.sharedData(sharesPendingKey)
		clear(v.sum)
		if err == nil {
			if v.have, err = api.ParseShares(v.have[:0], b, api.MaxSharePost); err != nil {
				v.errors.Increment(1) // not a pending entry: replaced
			}
		} else {
			v.have = v.have[:0]
		}
		for _, e := range v.have {
			v.sum[e.Key] += e.Tokens
		}
		for _, e := range v.local {
			if _, ok := v.sum[e.Key]; ok || len(v.sum) < api.MaxSharePost {
				v.sum[e.Key] += e.Tokens
			} else {
				v.errors.Increment(1)
			}
		}
		v.have = v.have[:0]
		for k, t := range v.sum {
			v.have = append(v.have, api.ShareEntry{Key: k, Tokens: t})
		}
		v.body = api.AppendShares(v.body[:0], v.have)
		if proxywasm.SetSharedData(sharesPendingKey, v.body, cas) == nil {
			return
		}
	}
	v.errors.Increment(uint64(len(v.local)))
}

// sharesPost is the leader's side: at most one post in flight.
type sharesPost struct {
	callTimer
	on bool // overload is configured
	// stale: the control plane answered 404, and what the VMs added while it was left
	// alone is not this interval's work: the next post leaves it out.
	stale bool
	hdrs  [][2]string
	body  []byte
}

// sharesRetry is how long a control plane without the path is left alone.
const sharesRetry = time.Minute

func (l *leader) tickShares(s *shard) {
	if p := &l.sharesPost; p.on && p.due(s.sched.stuckAfter) {
		l.postShares(s)
	}
}

// postShares takes the pending entry (leaving it empty) and posts it.
func (l *leader) postShares(s *shard) {
	p := &l.sharesPost
	p.wait = s.sched.pollEvery - 1
	b, cas, err := l.value.sharedData(sharesPendingKey)
	if err != nil || len(b) < api.SharesHeadLen {
		b = nil
	}
	p.body = append(p.body[:0], b...)
	if p.stale {
		p.stale = false
		p.body = p.body[:min(len(p.body), api.SharesHeadLen)]
	}
	if len(p.body) == 0 {
		p.body = api.AppendShares(p.body, nil)
	} else if proxywasm.SetSharedData(sharesPendingKey, api.AppendShares(nil, nil), cas) != nil {
		return // a VM is adding to it: the next tick takes it
	}
	if p.hdrs == nil {
		p.hdrs = append(s.callHeaders("POST", api.SharesPath), [2]string{"content-type", api.SharesContentType})
	}
	_, err = proxywasm.DispatchHttpCall(s.sched.target().Cluster, p.hdrs, p.body, nil,
		uint32(s.cp.TimeoutMs), func(_, bodySize, _ int) { l.onShares(bodySize) })
	if err != nil {
		l.metrics.sharesErrors.Increment(1)
		return
	}
	p.busy = 1
}

func (l *leader) onShares(bodySize int) {
	p := &l.sharesPost
	body := l.callAnswer(&p.callTimer, sharesRetry, api.MaxSharesAnswerBytes, bodySize)
	if body == nil {
		l.metrics.sharesErrors.Increment(1)
		p.stale = p.wait > 0
		return
	}
	if _, err := api.ParseShares(nil, body, api.MaxSharesAnswer); err != nil {
		l.metrics.sharesErrors.Increment(1)
		return
	}
	p.body = binary.LittleEndian.AppendUint64(p.body[:0], uint64((*l.clock)().UnixMilli()))
	p.body = append(p.body, body...)
	if proxywasm.SetSharedData(sharesFleetKey, p.body, 0) != nil {
		l.metrics.sharesErrors.Increment(1)
	}
}
