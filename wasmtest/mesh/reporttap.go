// The report tap between the filters and the control plane: predicted against actual
// cached tokens.

package mesh

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute/shared/api"
)

// ReportTap passes the filters' calls to a control plane and keeps totals of the
// outcome reports on the way: predicted against actual cached tokens. A sharded mesh
// has one per control plane, adding up into the same totals.
type ReportTap struct {
	rp  *httputil.ReverseProxy
	sum *tapTotals
	// killed: the control plane behind is gone (Mesh.KillControlPlaneReplica), and the
	// calls in flight to it are cancelled.
	mu       sync.Mutex
	killed   bool
	inflight map[*context.CancelFunc]struct{}
	// gated: the cluster has the control plane as an endpoint only while ready holds,
	// as a Kubernetes Service lists only ready pods (replicas of the control plane).
	gated bool
	ready atomic.Bool
}

type tapTotals struct {
	mu sync.Mutex
	t  ReportTotals
}

// ReportTotals add up outcome reports with usage.
type ReportTotals struct {
	Outcomes, PromptTokens, PredictedCached, ActualCached int64
}

func newReportTap(cpAddr string, sum *tapTotals) *ReportTap {
	u := &url.URL{Scheme: "http", Host: cpAddr}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
		http.Error(w, "control plane unreachable", http.StatusBadGateway)
	}
	return &ReportTap{rp: rp, sum: sum, inflight: map[*context.CancelFunc]struct{}{}}
}

// kill fails every call in flight and every later one until revive.
func (t *ReportTap) kill() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.killed = true
	for cancel := range t.inflight {
		(*cancel)()
	}
}

func (t *ReportTap) revive() {
	t.mu.Lock()
	t.killed = false
	t.mu.Unlock()
}

func (t *ReportTap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	t.mu.Lock()
	if t.killed {
		t.mu.Unlock()
		http.Error(w, "control plane unreachable", http.StatusBadGateway)
		return
	}
	if t.gated && !t.ready.Load() {
		t.mu.Unlock()
		http.Error(w, "no healthy upstream", http.StatusServiceUnavailable) // Envoy's answer
		return
	}
	t.inflight[&cancel] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.inflight, &cancel)
		t.mu.Unlock()
	}()
	r = r.WithContext(ctx)
	if r.URL.Path == api.ReportsPath && r.Body != nil {
		b, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
		r.Body.Close()
		if err == nil {
			if rb, _, err := api.ParseReportBatch(b); err == nil {
				t.add(rb.Reports)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
	}
	t.rp.ServeHTTP(w, r)
}

func (t *ReportTap) add(rs []api.Report) {
	t.sum.mu.Lock()
	defer t.sum.mu.Unlock()
	for _, r := range rs {
		if r.Kind != api.KindOutcome || r.PromptTokens <= 0 || r.CachedTokens < 0 {
			continue
		}
		s := &t.sum.t
		s.Outcomes++
		s.PromptTokens += int64(r.PromptTokens)
		s.PredictedCached += int64(min(r.PredictedCachedTokens, r.PromptTokens))
		s.ActualCached += int64(r.CachedTokens)
	}
}

// Totals returns the sums so far (of every control plane's reports).
func (t *ReportTap) Totals() ReportTotals {
	t.sum.mu.Lock()
	defer t.sum.mu.Unlock()
	return t.sum.t
}
