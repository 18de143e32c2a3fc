package main

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// The root context: the configuration, a leader elected with a CAS lease in shared data,
// the tick that polls a cluster and publishes the answer, and the shared queue of reports.

type root struct {
	types.DefaultPluginContext
	id      uint32
	vm      *vm
	token   string
	cfg     config
	leader  bool
	queueID uint32

	requests, ticks, polls, pollFailures, dequeued, posted, dropped, chunks, casRetries proxywasm.MetricCounter
	inflight, leaders                                                                   proxywasm.MetricGauge
	bodyBytes                                                                           proxywasm.MetricHistogram
}

func (r *root) OnPluginStart(size int) types.OnPluginStartStatus {
	raw, err := proxywasm.GetPluginConfiguration()
	if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
		proxywasm.LogCriticalf("plugin configuration: %v", err)
		return types.OnPluginStartStatusFailed
	}
	if len(raw) != size {
		proxywasm.LogCriticalf("plugin configuration is %d bytes, callback said %d", len(raw), size)
		return types.OnPluginStartStatusFailed
	}
	r.cfg = config{TickMs: 100, LeaseKey: "test/lease", LeaseTTLMs: 1000, Cluster: "control", Queue: "reports",
		RoutingHeader: "x-gateway-destination-endpoint"}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.cfg); err != nil {
			proxywasm.LogCriticalf("plugin configuration: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		proxywasm.LogCriticalf("random: %v", err)
		return types.OnPluginStartStatusFailed
	}
	r.token = hex.EncodeToString(id[:])

	r.requests = proxywasm.DefineCounterMetric("test.requests")
	r.ticks = proxywasm.DefineCounterMetric("test.ticks")
	r.polls = proxywasm.DefineCounterMetric("test.polls")
	r.pollFailures = proxywasm.DefineCounterMetric("test.poll_failures")
	r.dequeued = proxywasm.DefineCounterMetric("test.reports_dequeued")
	r.posted = proxywasm.DefineCounterMetric("test.reports_posted")
	r.dropped = proxywasm.DefineCounterMetric("test.reports_dropped")
	r.chunks = proxywasm.DefineCounterMetric("test.response_chunks")
	r.casRetries = proxywasm.DefineCounterMetric("test.cas_retries")
	r.inflight = proxywasm.DefineGaugeMetric("test.inflight")
	r.leaders = proxywasm.DefineGaugeMetric("test.leaders")
	r.bodyBytes = proxywasm.DefineHistogramMetric("test.request_body_bytes")

	// Every level once, so the host's level mapping is visible in its log.
	proxywasm.LogTracef("level trace %s", r.token)
	proxywasm.LogDebugf("level debug %s", r.token)
	proxywasm.LogInfof("level info %s", r.token)
	proxywasm.LogWarnf("level warn %s", r.token)
	proxywasm.LogErrorf("level error %s", r.token)
	proxywasm.LogCriticalf("level critical %s", r.token)

	// Join the list of VMs with a CAS loop: VMs of one host share this key.
	for {
		val, cas, err := proxywasm.GetSharedData("test/vms")
		if err != nil && !errors.Is(err, types.ErrorStatusNotFound) {
			proxywasm.LogCriticalf("get test/vms: %v", err)
			return types.OnPluginStartStatusFailed
		}
		next := r.token
		if len(val) > 0 {
			next = string(val) + "," + r.token
		}
		err = proxywasm.SetSharedData("test/vms", []byte(next), cas)
		if errors.Is(err, types.ErrorStatusCasMismatch) {
			continue
		}
		if err != nil {
			proxywasm.LogCriticalf("set test/vms: %v", err)
			return types.OnPluginStartStatusFailed
		}
		break
	}
	name, _ := proxywasm.GetProperty([]string{"plugin_name"})
	rootID, _ := proxywasm.GetProperty([]string{"plugin_root_id"})
	node, _ := proxywasm.GetProperty([]string{"node", "id"})
	_ = proxywasm.SetSharedData("test/root_props", []byte(fmt.Sprintf("plugin_name=%s root_id=%s node=%s vm_config=%s",
		name, rootID, node, r.vm.vmConfig)), 0)
	_ = proxywasm.SetSharedData("test/start/"+r.token, []byte(strconv.FormatInt(time.Now().UnixNano(), 10)), 0)

	if r.cfg.TickMs > 0 {
		if err := proxywasm.SetTickPeriodMilliSeconds(r.cfg.TickMs); err != nil {
			proxywasm.LogCriticalf("tick: %v", err)
			return types.OnPluginStartStatusFailed
		}
	}
	proxywasm.LogInfof("vm %s started (root context %d)", r.token, r.id)
	return types.OnPluginStartStatusOK
}

func (r *root) OnTick() {
	r.ticks.Increment(1)
	key := "test/ticks/" + r.token
	val, cas, _ := proxywasm.GetSharedData(key)
	n, _ := strconv.Atoi(string(val))
	if err := proxywasm.SetSharedData(key, []byte(strconv.Itoa(n+1)), cas); err != nil {
		proxywasm.LogErrorf("set %s: %v", key, err)
	}
	r.lease()
	if !r.leader {
		return
	}
	headers := [][2]string{{":method", "GET"}, {":path", "/poll?vm=" + r.token}, {":authority", "control"}}
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, nil, nil, 500, func(numHeaders, bodySize, _ int) {
		if numHeaders == 0 {
			r.pollFailures.Increment(1)
			return
		}
		status := callStatus()
		body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		if status != "200" {
			r.pollFailures.Increment(1)
			_ = proxywasm.SetSharedData("test/poll_status", []byte(status+" "+string(body)), 0)
			return
		}
		if err := proxywasm.SetSharedData("test/table", body, 0); err != nil {
			proxywasm.LogErrorf("publish table: %v", err)
			return
		}
		r.polls.Increment(1)
	})
	if err != nil {
		proxywasm.LogErrorf("poll: %v", err)
	}
}

// lease renews or takes the leader lease: {owner, expiry} under one key, written only with
// the CAS number just read, so of the VMs that read the same version exactly one wins.
func (r *root) lease() {
	now := time.Now().UnixNano()
	val, cas, err := proxywasm.GetSharedData(r.cfg.LeaseKey)
	if errors.Is(err, types.ErrorStatusNotFound) {
		// cas 0 writes unconditionally: bootstrap an expired lease, then read it back.
		_ = proxywasm.SetSharedData(r.cfg.LeaseKey, []byte(":0"), 0)
		val, cas, err = proxywasm.GetSharedData(r.cfg.LeaseKey)
	}
	if err != nil {
		proxywasm.LogErrorf("lease: %v", err)
		return
	}
	owner, expiry, _ := strings.Cut(string(val), ":")
	exp, _ := strconv.ParseInt(expiry, 10, 64)
	mine := owner == r.token
	if !mine && exp > now {
		r.setLeader(false)
		return
	}
	next := fmt.Sprintf("%s:%d", r.token, now+r.cfg.LeaseTTLMs*int64(time.Millisecond))
	err = proxywasm.SetSharedData(r.cfg.LeaseKey, []byte(next), cas)
	r.setLeader(err == nil)
}

func (r *root) setLeader(leader bool) {
	if leader == r.leader {
		return
	}
	r.leader = leader
	if !leader {
		r.leaders.Add(-1)
		proxywasm.LogInfof("vm %s lost the lease", r.token)
		return
	}
	r.leaders.Add(1)
	qid, err := proxywasm.RegisterSharedQueue(r.cfg.Queue)
	if err != nil {
		proxywasm.LogErrorf("register queue: %v", err)
		return
	}
	r.queueID = qid
	_ = proxywasm.SetSharedData("test/leader", []byte(r.token), 0)
	proxywasm.LogInfof("vm %s is the leader (queue %d)", r.token, qid)
}

func (r *root) OnQueueReady(queueID uint32) {
	var batch [][]byte
	for {
		item, err := proxywasm.DequeueSharedQueue(queueID)
		if errors.Is(err, types.ErrorStatusEmpty) {
			break
		}
		if err != nil {
			proxywasm.LogErrorf("dequeue: %v", err)
			return
		}
		batch = append(batch, append([]byte(nil), item...))
	}
	if len(batch) == 0 {
		return
	}
	r.dequeued.Increment(uint64(len(batch)))
	key := "test/dequeued_by/" + r.token
	val, cas, _ := proxywasm.GetSharedData(key)
	n, _ := strconv.Atoi(string(val))
	_ = proxywasm.SetSharedData(key, []byte(strconv.Itoa(n+len(batch))), cas)
	headers := [][2]string{{":method", "POST"}, {":path", "/reports"}, {":authority", "control"}, {"content-type", "text/plain"}}
	n = len(batch)
	_, err := proxywasm.DispatchHttpCall(r.cfg.Cluster, headers, bytes.Join(batch, []byte("\n")), nil, 1000,
		func(numHeaders, _, _ int) {
			if callStatus() == "200" {
				r.posted.Increment(uint64(n))
			}
		})
	if err != nil {
		proxywasm.LogErrorf("post reports: %v", err)
	}
}

func (r *root) NewHttpContext(id uint32) types.HttpContext {
	return &stream{root: r, id: id}
}

// callStatus is the :status of the HTTP call response being delivered, "" on failure.
func callStatus() string {
	hdrs, _ := proxywasm.GetHttpCallResponseHeaders()
	for _, h := range hdrs {
		if h[0] == ":status" {
			return h[1]
		}
	}
	return ""
}
