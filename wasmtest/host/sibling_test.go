package host_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/kvroute/kvroute/wasmtest/host"
	"github.com/kvroute/kvroute/wasmtest/host/clock"
)

// versionedControlPlane serves its current table frame to a poll of any other version
// (304 to one at it) and accepts reports.
type versionedControlPlane struct {
	mu      sync.Mutex
	version uint64
	frame   []byte
}

func (c *versionedControlPlane) set(t *table.Table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.version, c.frame = t.Version, table.EncodeFull(t)
}

func (c *versionedControlPlane) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.URL.Path {
	case api.TablePath:
		if r.URL.Query().Get("version") == strconv.FormatUint(c.version, 10) {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("content-type", api.TableContentType)
		w.Write(c.frame)
	case api.ReportsPath:
		w.WriteHeader(http.StatusNoContent)
	default:
		http.NotFound(w, r)
	}
}

// A repeat of a new prompt on the other worker VM, sent right after the first answer,
// goes where the first went even when the table's snapshot of that replica was measured
// while the first request was queued there (between its send and its first byte), so
// that the snapshot still counts its prefill. The VM that placed it corrects such a
// snapshot with the start it recorded (route.Ledger.Started); before the start records
// carried their times, the other VM only ended its copy of the entry (Ledger.Done), took
// the snapshot's queue as it was and sent the repeat to an idle replica with nothing
// cached (this test failed: 127.0.0.1:9002 instead of :9003). With `make run`'s printed
// curl sent three times, the second missed in 9 of 80 runs.
func TestKvrouteSiblingCorrectsASnapshotTakenBeforeTheStart(t *testing.T) {
	cfg := table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4}
	tableOf := func(version uint64, queued map[string]uint64, ageMs uint32) *table.Table {
		var rs []table.Replica
		for i, addr := range []string{"127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003"} {
			rs = append(rs, table.Replica{Slot: uint32(i), ID: addr, Addr: addr, Queued: queued[addr], Healthy: true, StateAgeMs: ageMs})
		}
		m, err := table.NewModel("llama", cfg, rs)
		require.NoError(t, err)
		tb := table.New()
		tb.Version = version
		tb.Models["llama"] = m
		return tb
	}
	cp := &versionedControlPlane{}
	cp.set(tableOf(1, nil, 20)) // three idle replicas, none holding the prompt
	clk := clock.NewVirtual(time.Unix(1_800_000_000, 0))
	h := loadKvroute(t, host.Config{VMs: 2, Clock: clk, Rand: host.SeededRand(5),
		Clusters: map[string]host.Cluster{kvCluster: {Handler: cp}}})
	clk.Advance(300 * time.Millisecond) // the leader polls; both VMs have the table

	body := kvChat(strings.Repeat("A new customer's policy, never sent before. ", 400), "where is my parcel")
	headers := host.Headers{{":method", "POST"}, {":path", "/v1/chat/completions"}, {":authority", "llm"}}
	usage := []byte(`{"usage":{"prompt_tokens":4500,"prompt_tokens_details":{"cached_tokens":0}}}`)

	// The first request, on VM 0: sent now, its first byte 500 ms later.
	rec := host.NewRecorder()
	s := h.VM(0).NewStream(host.StreamInfo{}, rec.Hooks())
	_, err := s.SendRequestHeaders(headers, false)
	require.NoError(t, err)
	_, err = s.SendRequestBody(body, true)
	require.NoError(t, err)
	fwd, sent, _ := rec.Request()
	require.True(t, sent)
	first := strings.Split(endpointOf(fwd), ",")[0]
	require.NotEmpty(t, first)
	s.SetUpstreamAddress(first)
	clk.Advance(500 * time.Millisecond) // VM 1 reads the placement on its ticks
	_, err = s.SendResponseHeaders(host.Headers{{":status", "200"}}, false)
	require.NoError(t, err)
	_, err = s.SendResponseBody(usage, true)
	require.NoError(t, err)
	s.Close()

	// A table whose snapshot of that replica was measured 300 ms before the table was
	// confirmed, 100-200 ms after the send and before the first byte: its queue holds the
	// first request's prefill (about len(body)/4 tokens) and 0.8 of that again of other
	// work. Corrected, the replica's cost is that other work plus the little uncached,
	// below an idle replica's whole prompt plus its spill charge (a third of it, with three
	// replicas); uncorrected it is above.
	cp.set(tableOf(2, map[string]uint64{first: uint64(len(body)) / 4 * 18 / 10}, 300))
	clk.Advance(200 * time.Millisecond) // polled, and read by both VMs

	res, err := h.Do(context.Background(), host.Request{Headers: headers, Body: [][]byte{body}, VM: h.VM(1),
		Upstream: func(host.Message) host.Response {
			return host.Response{Headers: host.Headers{{":status", "200"}}, Body: [][]byte{usage}}
		}})
	require.NoError(t, err)
	require.Equal(t, 1, res.VM)
	got := strings.Split(endpointOf(res.Forwarded), ",")[0]
	require.Equal(t, first, got, "the repeat on the other VM went elsewhere: the snapshot's queue was not corrected by the first request's start")
}
