package main

import (
	"strconv"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/kvroute/kvroute/shared/api"
)

// The leader fetches, every poll interval, the affinity entries the other proxies
// learned (api.AffinityPath) from the control-plane replica it polls, and writes each
// into the VMs' map (affinity.go learn) unless the map has the key already with that
// replica or a newer entry. The cursor (since, in the answer's epoch) starts over when
// the answer names another epoch: a restarted control plane, or another replica after
// a failover, answers everything it holds. A control plane that does not serve the
// path (404: older than it) is asked again a minute later.
type affinityPoll struct {
	wait, busy   int // ticks before the next fetch; ticks the one in flight has waited
	epoch, since uint64
	proxy        string // api.ProxyKey of this proxy's name, in decimal
	hdrs         [][2]string
}

// affinityRetry is how long a control plane without the path is left alone.
const affinityRetry = time.Minute

func (l *leader) tickAffinity(s *shard) {
	a := &s.sched.aff
	switch {
	case a.busy > 0:
		if a.busy++; a.busy > s.sched.stuckAfter {
			a.busy = 0
		}
	case a.wait > 0:
		a.wait--
	default:
		l.pollAffinity(s)
	}
}

func (l *leader) pollAffinity(s *shard) {
	sc := &s.sched
	a := &sc.aff
	a.wait = sc.pollEvery - 1
	if a.proxy == "" {
		a.proxy = strconv.FormatUint(api.ProxyKey(s.reports.proxy), 10)
	}
	if a.hdrs == nil {
		a.hdrs = s.callHeaders("GET", "")
	}
	a.hdrs[1][1] = api.AffinityPath + "?since=" + strconv.FormatUint(a.since, 10) +
		"&epoch=" + strconv.FormatUint(a.epoch, 10) + "&proxy=" + a.proxy
	_, err := proxywasm.DispatchHttpCall(sc.target().Cluster, a.hdrs, nil, nil,
		uint32(s.cp.TimeoutMs), func(_, bodySize, _ int) { l.onAffinity(s, bodySize) })
	if err != nil {
		l.metrics.affinityPollErrors.Increment(1)
		return
	}
	a.busy = 1
}

func (l *leader) onAffinity(s *shard, bodySize int) {
	a := &s.sched.aff
	a.busy = 0
	status, _ := l.callStatus()
	if status != 200 {
		l.metrics.affinityPollErrors.Increment(1)
		if status == 404 {
			a.wait = int(affinityRetry/time.Millisecond) / l.tickMs
		}
		return
	}
	if bodySize > api.MaxAffinityAnswerBytes {
		l.metrics.affinityPollErrors.Increment(1) // not an answer: left unread
		return
	}
	body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
	if err != nil {
		l.metrics.affinityPollErrors.Increment(1)
		return
	}
	epoch, next, entries, err := api.ParseAffinityHead(body)
	if err != nil {
		l.metrics.affinityPollErrors.Increment(1)
		return
	}
	a.epoch, a.since = epoch, next
	now := (*l.clock)()
	for {
		key, ageMs, addr, rest, ok := api.NextAffinityEntry(entries)
		if !ok {
			break
		}
		entries = rest
		if l.affinity.learn(key, string(addr), now.Add(-time.Duration(ageMs)*time.Millisecond)) {
			l.metrics.affinityLearned.Increment(1)
		}
	}
}
