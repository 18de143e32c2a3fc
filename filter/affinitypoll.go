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
	callTimer
	epoch, since uint64
	proxy        string // api.ProxyKey of this proxy's name, in decimal
	hdrs         [][2]string
}

// affinityRetry is how long a control plane without the path is left alone.
const affinityRetry = time.Minute

func (l *leader) tickAffinity(s *shard) {
	if s.sched.aff.due(s.sched.stuckAfter) {
		l.pollAffinity(s)
	}
}

// callTimer schedules one of the leader's periodic calls: at most one in flight (busy:
// the ticks it has waited, given up past stuckAfter), wait ticks before the next.
type callTimer struct{ wait, busy int }

// callAnswer ends t's call and returns its answer's body: nil when the status is not 200
// (404, a control plane without the path: not asked again for retry) or the body is
// longer than max (left unread).
func (l *leader) callAnswer(t *callTimer, retry time.Duration, max, bodySize int) []byte {
	t.busy = 0
	if status, _ := l.callStatus(); status != 200 {
		if status == 404 {
			t.wait = int(retry/time.Millisecond) / l.tickMs
		}
		return nil
	}
	if bodySize > max {
		return nil
	}
	body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
	if err != nil {
		return nil
	}
	return body
}

// due counts a tick and reports whether the call is to be made on it.
func (t *callTimer) due(stuckAfter int) bool {
	switch {
	case t.busy > 0:
		if t.busy++; t.busy > stuckAfter {
			t.busy = 0
		}
	case t.wait > 0:
		t.wait--
	default:
		return true
	}
	return false
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
	body := l.callAnswer(&a.callTimer, affinityRetry, api.MaxAffinityAnswerBytes, bodySize)
	if body == nil {
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
