package proxy

import (
	"net/http"
	"time"
)

// A stream's own timeouts (the connection's are in server.go; the defaults in edge.go).

// touch records activity for the stream idle timeout.
func (ex *exchange) touch() { ex.lastActive.Store(time.Now().UnixNano()) }

// startTimers arms the stream's timeouts (Envoy's ActiveStream timers in
// source/common/http/conn_manager_impl.cc; the answers are onRequestTimeout's and
// onIdleTimeout's).
func (ex *exchange) startTimers(noBody bool) {
	t := ex.p.timeouts
	if t.request > 0 && !noBody {
		ex.timers = append(ex.timers, time.AfterFunc(t.request, func() {
			if ex.pumpEnded.Load() || ex.respStarted.Load() {
				return // the request arrived, or the response began: disarmed
			}
			ex.p.stats.requestTimeouts.Add(1)
			ex.events.push(event{kind: evEdgeReply, status: http.StatusRequestTimeout, reason: "request timeout"})
		}))
	}
	if t.streamIdle > 0 {
		ex.touch()
		var idle *time.Timer
		idle = time.AfterFunc(t.streamIdle, func() {
			if since := time.Since(time.Unix(0, ex.lastActive.Load())); since < t.streamIdle {
				idle.Reset(t.streamIdle - since)
				return
			}
			ex.p.stats.streamIdleTimeouts.Add(1)
			if ex.respStarted.Load() {
				// A reset; a handler stuck writing to a client that stopped reading
				// must see it too.
				_ = ex.rc.SetWriteDeadline(time.Now())
			}
			ex.events.push(event{kind: evEdgeReply, status: http.StatusRequestTimeout, reason: "stream timeout"})
		})
		ex.timers = append(ex.timers, idle)
	}
}

func (ex *exchange) stopTimers() {
	for _, t := range ex.timers {
		t.Stop()
	}
}
