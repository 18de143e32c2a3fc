package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

// leader is the part of a VM that may talk to the control plane. Envoy ticks every
// worker VM; without a lease N workers would poll N times. The lease is a CAS-written
// (owner, expiry) pair in shared data: whoever holds it renews it on every tick, and
// when its VM stops ticking the lease expires and another VM takes over. Holding it, the
// VM polls each shard's control plane, shares the tables it gets with the other VMs
// (store.go) and posts the reports they queued (reports.go).
//
// The lease is one for all shards; each shard has a schedule of its own (its polls and
// report posts), and the VM holding the lease runs them all, each independently: one
// shard's control plane failing backs off that shard's polls alone.
type leader struct {
	vmID     uint64
	tickMs   int
	held     bool     // this VM holds the lease
	lease    [16]byte // the lease being written to shared data
	shards   *shardSet
	clock    *func() time.Time // the plugin's (tests set their own after start)
	value    *hostBuf          // the VM's buffer for shared data and call headers (hostmem.go)
	metrics  *metrics
	affinity *affinity // the map the entries other proxies learned go into (affinitypoll.go)
	// sharesPost posts the VMs' tenant shares to the first shard's control plane (shares.go).
	sharesPost sharesPost
}

// schedule is a shard's polls and report posts on the leader.
type schedule struct {
	// The leader's work is scheduled in ticks, the host's own clock: Envoy ticks every
	// tickMs, so pollEvery ticks is the poll interval.
	pollEvery, reportEvery int
	pollWait, reportWait   int // ticks left before the next poll / post
	pollBusy, reportBusy   int // ticks a call has been outstanding; 0 when none
	stuckAfter             int // a call outstanding this long is given up
	// waitMs is the long poll's wait_ms (0: off). pollSent is when the poll in flight
	// left; pollMs is the tick-scheduled poll interval.
	waitMs, pollMs int
	pollSent       time.Time
	failedPolls    int
	item           hostBuf // the report queue item being posted (reports.go next)
	// The calls' headers, made once (a poll changes its :path): the ticks make no garbage.
	pollHdrs, reportHdrs [][2]string
	reportCalls          int     // report posts outstanding
	count                [8]byte // the drained count being written to shared data
	// targets are the control plane's replicas (api.ControlPlane.Targets); the leader
	// polls and posts to targets[current] and moves to the next when a poll fails.
	targets []api.Endpoint
	current int
	// epoch is the epoch of the leader's table (api.TableEpochHeader; 0: the control
	// plane named none), sent back on each poll as the poll's epoch parameter.
	epoch uint64
	// Every replica builds its own table from the reports, so each batch is also posted
	// to the other replicas (copies): copyCalls are the copies outstanding per target,
	// copyHdrs their headers.
	copyCalls []int
	copyHdrs  [][][2]string
	aff       affinityPoll
}

func newSchedule(cfg *api.ControlPlane, tickMs int) schedule {
	return schedule{
		pollEvery:   max(1, cfg.PollMs/tickMs),
		reportEvery: max(1, cfg.ReportMs/tickMs),
		// Envoy always answers (the timeout, which exceeds wait_ms, ends the call); this
		// only guards a host that loses a callback, so the leader is never wedged.
		stuckAfter: cfg.TimeoutMs/tickMs + 10,
		waitMs:     max(cfg.WaitMs, 0),
		pollMs:     max(1, cfg.PollMs/tickMs) * tickMs,
		item:       hostBuf{keep: 4 << 20},
		targets:    cfg.Targets(),
		copyCalls:  make([]int, len(cfg.Targets())),
		copyHdrs:   make([][][2]string, len(cfg.Targets())),
	}
}

// target is the control-plane replica the leader talks to now.
func (sc *schedule) target() api.Endpoint { return sc.targets[sc.current] }

// failOver moves to the next replica; the calls' headers name its authority.
func (sc *schedule) failOver() {
	sc.current = (sc.current + 1) % len(sc.targets)
	sc.pollHdrs, sc.reportHdrs, sc.aff.hdrs = nil, nil, nil
}

// backoff is the ticks to wait after that many failed polls in a row (with replicas:
// rounds of them all): doubling, up to about 2 s, so a dead control plane is not hammered.
func (sc *schedule) backoff(failures, tickMs int) int {
	return min(sc.pollEvery<<min(failures, 5), max(1, 2000/tickMs)) - 1
}

// leaseTTL: three missed renewals, and at least a second, before another VM takes over.
func (l *leader) leaseTTL() time.Duration {
	return max(time.Second, 3*time.Duration(l.tickMs)*time.Millisecond)
}

// tick takes or renews the lease and, holding it, runs every shard's schedule.
func (l *leader) tick(now time.Time) {
	l.held = l.tryLease(now, l.leaseTTL())
	if !l.held {
		return
	}
	for _, s := range l.shards.list {
		l.tickShard(s)
	}
	l.tickShares(l.shards.list[0])
}

func (l *leader) tickShard(s *shard) {
	sc := &s.sched
	switch {
	case sc.pollBusy > 0:
		if sc.pollBusy++; sc.pollBusy > sc.stuckAfter {
			sc.pollBusy = 0
			l.pollFailed(s, errors.New("no answer to the poll"))
		}
	case sc.pollWait > 0:
		sc.pollWait--
	default:
		l.poll(s)
	}
	switch {
	case sc.reportBusy > 0:
		if sc.reportBusy++; sc.reportBusy > sc.stuckAfter {
			sc.reportBusy, sc.reportCalls = 0, 0
			clear(sc.copyCalls)
		}
	case sc.reportWait > 0:
		sc.reportWait--
	default:
		l.postReports(s)
	}
	l.tickAffinity(s)
}

func (l *leader) tryLease(now time.Time, ttl time.Duration) bool {
	b, cas, err := l.value.sharedData(leaseKey)
	if err != nil && err != types.ErrorStatusNotFound {
		return false
	}
	if err == nil && len(b) == 16 {
		owner := binary.LittleEndian.Uint64(b)
		expires := int64(binary.LittleEndian.Uint64(b[8:]))
		if owner != l.vmID && now.UnixMilli() < expires {
			return false
		}
	}
	binary.LittleEndian.PutUint64(l.lease[:8], l.vmID)
	binary.LittleEndian.PutUint64(l.lease[8:], uint64(now.Add(ttl).UnixMilli()))
	return proxywasm.SetSharedData(leaseKey, l.lease[:], cas) == nil
}

// callHeaders are the headers of a call to the replica the leader talks to now.
func (s *shard) callHeaders(method, path string) [][2]string {
	return s.callHeadersTo(s.sched.target(), method, path)
}

func (s *shard) callHeadersTo(e api.Endpoint, method, path string) [][2]string {
	h := [][2]string{{":method", method}, {":path", path}, {":authority", e.Authority}}
	if s.cp.Token != "" {
		h = append(h, [2]string{"authorization", "Bearer " + s.cp.Token})
	}
	return h
}

// poll asks the control plane for what changed since the leader's version. With
// wait_ms it is a long poll: the control plane holds it until a newer version exists
// (or wait_ms passes, then 304), and onTable asks again at once, so a version reaches
// this proxy when it is published rather than on the next poll tick.
func (l *leader) poll(s *shard) {
	sc := &s.sched
	have := uint64(0)
	if s.view.loaded {
		have = s.view.t.Version
	}
	path := api.TablePath + "?version=" + strconv.FormatUint(have, 10)
	if have != 0 && sc.epoch != 0 {
		path += "&epoch=" + strconv.FormatUint(sc.epoch, 10)
	}
	if sc.waitMs > 0 {
		path += "&wait_ms=" + strconv.Itoa(sc.waitMs)
	}
	if sc.pollHdrs == nil {
		// The formats header asks for the slower KV tiers (table format 2); a control
		// plane that does not know it answers format 1, which this build reads too.
		sc.pollHdrs = append(s.callHeaders("GET", ""), [2]string{"accept", api.TableContentType},
			[2]string{api.TableFormatsHeader, api.TableFormats})
	}
	sc.pollHdrs[1][1] = path // callHeaders' :path
	sc.pollSent = (*l.clock)()
	cluster := sc.target().Cluster
	_, err := proxywasm.DispatchHttpCall(cluster, sc.pollHdrs, nil, nil,
		uint32(s.cp.TimeoutMs), func(_, bodySize, _ int) { l.onTable(s, have, bodySize) })
	l.metrics.polls.Increment(1)
	if err != nil {
		l.pollFailed(s, fmt.Errorf("dispatch to cluster %q: %w", cluster, err))
		return
	}
	sc.pollBusy = 1
}

func (l *leader) pollFailed(s *shard, err error) {
	sc := &s.sched
	l.metrics.pollErrors.Increment(1)
	if s.gauges != nil {
		s.gauges.pollErrors.Increment(1)
	}
	sc.failedPolls++
	if n := len(sc.targets); n > 1 {
		// Another replica serves the same table: ask it on the next tick, and back off
		// only once every replica failed in turn.
		from := sc.target().Cluster
		sc.failOver()
		l.metrics.failovers.Increment(1)
		sc.pollWait = 0
		if sc.failedPolls%n == 0 {
			sc.pollWait = sc.backoff(sc.failedPolls/n, l.tickMs)
		}
		if sc.failedPolls <= n || sc.failedPolls%50 == 0 {
			proxywasm.LogWarnf("kvroute: %stable poll to %s failed (%d in a row), asking %s next: %v",
				shardPrefix(s), from, sc.failedPolls, sc.target().Cluster, err)
		}
		return
	}
	sc.pollWait = sc.backoff(sc.failedPolls, l.tickMs)
	// Log the first failure and then every 50th, not every tick.
	if sc.failedPolls == 1 || sc.failedPolls%50 == 0 {
		if s.name != "" {
			proxywasm.LogWarnf("kvroute: shard %s: table poll failed (%d in a row), routing its models on its last table: %v", s.name, sc.failedPolls, err)
		} else {
			proxywasm.LogWarnf("kvroute: table poll failed (%d in a row), routing on the last table: %v", sc.failedPolls, err)
		}
	}
}

// shardPrefix names s in a log line ("" for the control_plane block).
func shardPrefix(s *shard) string {
	if s.name == "" {
		return ""
	}
	return "shard " + s.name + ": "
}

func (l *leader) onTable(s *shard, asked uint64, bodySize int) {
	sc := &s.sched
	sc.pollBusy = 0
	now := (*l.clock)()
	status, age := l.callStatus()
	// The version's queue numbers are as old as the version: date the table from when
	// the control plane built it, at the earliest, so the ledger counts every send the
	// snapshot missed and takes off every start it counted (route.Ledger).
	built := api.TableBuilt(sc.pollSent, now, age, l.callHeld(sc.waitMs > 0))
	switch {
	case status == 304:
		s.keys.confirm(built)
	case status == 200:
		body, err := proxywasm.GetHttpCallResponseBody(0, bodySize)
		if err == nil {
			err = l.publish(s, body, asked, l.callEpoch(), built)
		}
		if err != nil {
			l.pollFailed(s, err)
			return
		}
	default:
		l.pollFailed(s, fmt.Errorf("control plane answered status %d", status))
		return
	}
	sc.failedPolls = 0
	sc.pollWait = sc.pollEvery - 1
	// Long poll: ask again now (from the response callback: proxy-wasm hosts allow a
	// dispatch there; Envoy makes it from the root context, Context::httpCall in
	// source/extensions/common/wasm/context.cc) when the answer brought a newer
	// version, or when it took a poll interval anyway (a wait that ran out). A quick
	// 304 (a control plane that does not hold the call) keeps the tick schedule, so
	// there is never more than one poll per interval without a new version, and at
	// most one in flight. Failures return above and wait out the backoff on the tick.
	newer := s.view.loaded && s.view.t.Version != asked
	if sc.waitMs > 0 && l.held && (newer || now.Sub(sc.pollSent) >= time.Duration(sc.pollMs)*time.Millisecond) {
		sc.pollWait = 0
		l.poll(s)
	}
}

// publish verifies a frame by applying it to the leader's own copy, then writes it to
// shared data for the other VMs. A full table starts over in the epoch its answer named.
func (l *leader) publish(s *shard, body []byte, asked, epoch uint64, now time.Time) error {
	f, err := table.Decode(body)
	if err != nil {
		return err
	}
	if f.Kind == table.Delta && (!s.view.loaded || f.Base != asked || s.view.t.Version != asked) {
		return fmt.Errorf("delta %d->%d does not apply to v%d", f.Base, f.Version, s.view.t.Version)
	}
	t := s.view.t
	if f.Kind == table.Full {
		t = table.New()
		s.sched.epoch = epoch
	}
	if err := t.ApplyFrame(f); err != nil {
		if errors.Is(err, table.ErrBaseMismatch) {
			s.view.loaded = false // ask for a full table next time
		}
		return err
	}
	s.view.t, s.view.loaded, s.view.confirmed, s.view.epoch = t, true, now, s.sched.epoch
	l.shards.versionLoaded(s, l.metrics)
	if f.Kind == table.Delta {
		err = s.keys.publishDelta(body, f, now)
		if err == nil {
			return nil
		}
		// Ring full, or the head moved under us: start a new base from our copy.
	}
	frame := body
	if f.Kind == table.Delta {
		frame = table.EncodeFullFormat(t, t.Format) // the chain's deltas are in t's format
	}
	return s.keys.publishFull(frame, t.Version, s.sched.epoch, now)
}

// postReports sends what the VMs queued for s since the last post to s's control plane:
// the leader's own items straight from its buffer (postOwn), then every queued item (at
// most maxPostsPerTick in all), each posted as it is dequeued (the host copies a call's
// body when it dispatches it), so one buffer holds them all in turn. When it empties the
// queue it tells the VMs (keys.drained) that their flushes up to the count it read first
// are out of the queue, and their buffers free (reports.go).
func (l *leader) postReports(s *shard) {
	sc := &s.sched
	sc.reportWait = sc.reportEvery - 1
	if !s.reports.ok {
		return
	}
	flushed := readCount(l.value, s.keys.flushed)
	if sc.reportHdrs == nil {
		sc.reportHdrs = append(s.callHeaders("POST", api.ReportsPath), [2]string{"content-type", api.ReportsContentType})
	}
	hdrs := sc.reportHdrs
	for posts := l.postOwn(s, hdrs); ; posts++ {
		if posts >= maxPostsPerTick {
			return // the rest on the next tick
		}
		it, count, ok := s.reports.next(&sc.item)
		if !ok {
			break
		}
		l.post(s, hdrs, it[itemHead:], count)
	}
	if flushed != 0 && flushed > readCount(l.value, s.keys.drained) {
		binary.LittleEndian.PutUint64(sc.count[:], flushed)
		_ = put(s.keys.drained, sc.count[:])
	}
}

// postOwn posts the leader's own report items from its buffer and empties it for reuse:
// they skip the shared queue, whose enqueue and dequeue each copied them (in the leader
// tick benchmark, a VM alone at 2,560 requests/s, 560 KB a tick). A buffer holding more
// items than half a tick's posts goes through the queue as any VM's. It returns the posts.
func (l *leader) postOwn(s *shard, hdrs [][2]string) int {
	rb := &s.reports
	posts := rb.own(maxPostsPerTick / 2)
	if posts == 0 {
		return 0
	}
	for i := range posts {
		item := rb.item(i)
		l.post(s, hdrs, item[itemHead:], itemCount(item))
	}
	rb.reuse()
	return posts
}

// post dispatches one batch of count reports to s's control plane.
func (l *leader) post(s *shard, hdrs [][2]string, batch []byte, count int) {
	sc := &s.sched
	n := uint64(count)
	_, err := proxywasm.DispatchHttpCall(sc.target().Cluster, hdrs, batch, nil,
		uint32(s.cp.TimeoutMs), func(int, int, int) {
			sc.reportCalls = max(sc.reportCalls-1, 0)
			if sc.reportCalls == 0 {
				sc.reportBusy = 0
			}
			if s, _ := l.callStatus(); s >= 200 && s < 300 {
				l.metrics.reportsSent.Increment(n)
			} else {
				// Reports are hints; a lost batch costs prediction quality, not requests.
				l.metrics.reportsDropped.Increment(n)
			}
		})
	if err != nil {
		l.metrics.reportsDropped.Increment(n)
	} else {
		sc.reportCalls++
		sc.reportBusy = 1
	}
	for i, e := range sc.targets {
		if i != sc.current {
			l.postCopy(s, i, e, batch, n)
		}
	}
}

// postCopy posts a copy of a batch of n reports to replica i of s's control plane. A
// replica that has a tick's worth of copies outstanding (gone, or slow) misses it: the
// copies never hold up the posts to the replica the leader polls.
func (l *leader) postCopy(s *shard, i int, e api.Endpoint, batch []byte, n uint64) {
	sc := &s.sched
	if sc.copyCalls[i] >= maxPostsPerTick {
		l.metrics.copiesDropped.Increment(n)
		return
	}
	if sc.copyHdrs[i] == nil {
		sc.copyHdrs[i] = append(s.callHeadersTo(e, "POST", api.ReportsPath), [2]string{"content-type", api.ReportsContentType})
	}
	_, err := proxywasm.DispatchHttpCall(e.Cluster, sc.copyHdrs[i], batch, nil,
		uint32(s.cp.TimeoutMs), func(int, int, int) {
			sc.copyCalls[i] = max(sc.copyCalls[i]-1, 0)
			if s, _ := l.callStatus(); s >= 200 && s < 300 {
				l.metrics.copiesSent.Increment(n)
			} else {
				l.metrics.copiesDropped.Increment(n)
			}
		})
	if err != nil {
		l.metrics.copiesDropped.Increment(n)
		return
	}
	sc.copyCalls[i]++
}

// callStatus is the :status of the current http-call response (0 when the call failed:
// Envoy delivers no headers then) and the table age header, if any (0 otherwise, and at
// most a minute: an absurd value must not make every table look stale forever). It reads
// the two headers into the VM's value buffer: the SDK's map of every header was four
// allocations a call, garbage on the leader's tick.
func (l *leader) callStatus() (status int, age time.Duration) {
	v, err := l.value.callResponseHeader(":status")
	if err != nil {
		return 0, 0
	}
	status, _ = strconv.Atoi(v)
	age, _ = l.callHeaderMs(tableAgeHeader)
	return status, age
}

// callHeaderMs reads the current http-call response's header name as milliseconds, at
// most a minute; false when it is absent or not a count of milliseconds.
func (l *leader) callHeaderMs(name string) (time.Duration, bool) {
	v, err := l.value.callResponseHeader(name)
	if err != nil {
		return 0, false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 {
		return 0, false
	}
	return min(time.Duration(ms)*time.Millisecond, time.Minute), true
}

// callHeld is how long the control plane held the current http-call response's poll:
// 0 for a poll without wait_ms, the held header's value for a long poll, -1 for a long
// poll answered without one (a control plane that does not send it).
func (l *leader) callHeld(long bool) time.Duration {
	if !long {
		return 0
	}
	if held, ok := l.callHeaderMs(tableHeldHeader); ok {
		return held
	}
	return -1
}

// callEpoch is the current http-call response's epoch header (0 without one).
func (l *leader) callEpoch() uint64 {
	v, err := l.value.callResponseHeader(tableEpochHeader)
	if err != nil {
		return 0
	}
	e, _ := strconv.ParseUint(v, 10, 64)
	return e
}

// tableAgeHeader, tableEpochHeader and tableHeldHeader are api's names as hosts keep
// header names: lower case.
var (
	tableAgeHeader   = strings.ToLower(api.TableAgeHeader)
	tableEpochHeader = strings.ToLower(api.TableEpochHeader)
	tableHeldHeader  = strings.ToLower(api.TableHeldHeader)
)
