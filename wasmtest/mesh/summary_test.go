package mesh_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/mesh"
)

func summaryAt(requests int64, hits ...int64) mesh.Summary {
	s := mesh.Summary{Requests: requests, Outcomes: requests - 1, PredictedRate: 0.582, ActualRate: 0.629,
		TableVersion: 7, TableAge: 3 * time.Millisecond,
		Filter: mesh.FilterCounts{Decisions: requests - 1, Spills: 1, Unrouted: 1}}
	for i, h := range hits {
		r := mesh.ReplicaSummary{Name: fmt.Sprintf("vllm-%d", i), Running: i, Waiting: 2 * i,
			QueuedPrefillTokens: 1000 * i, KVUsage: 0.125 * float64(i), PrefixQueries: 1000 * requests, PrefixHits: h}
		if h < 0 {
			r.PrefixQueries, r.PrefixHits = 0, 0
		}
		s.Queues = append(s.Queues, r.QueuedPrefillTokens)
		s.Replicas = append(s.Replicas, r)
	}
	return s
}

// Not a terminal: one line per summary, as before, with no escape code.
func TestSummaryLinesWhenNotATerminal(t *testing.T) {
	var out bytes.Buffer
	p := &mesh.SummaryPrinter{W: &out}
	t0 := time.Date(2026, 1, 2, 10, 0, 0, 0, time.Local)
	require.NoError(t, p.Print(t0, summaryAt(3, 1500, -1)))
	require.NoError(t, p.Print(t0.Add(5*time.Second), summaryAt(4, 2000, 1000)))
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	require.Len(t, lines, 2)
	assert.Equal(t, "10:00:00 requests 3 | cached tokens predicted 58.2% actual 62.9% (2 outcomes)"+
		" | filter decisions 2 spills 1 fallbacks 0 unrouted 1 oversized 0 | queued prefill tokens [0 1000] | table age 3ms"+
		" | KV usage [0.0% 12.5%] | prefix hit rate [50.0% -]", lines[0])
	assert.True(t, strings.HasPrefix(lines[1], "10:00:05 requests 4 |"), lines[1])
	assert.NotContains(t, out.String(), "\x1b")
}

// A terminal: a table, redrawn over the previous one.
func TestSummaryTableRedrawsOnATerminal(t *testing.T) {
	var out bytes.Buffer
	p := &mesh.SummaryPrinter{W: &out, Terminal: true}
	t0 := time.Date(2026, 1, 2, 10, 0, 0, 0, time.Local)
	require.NoError(t, p.Print(t0, summaryAt(3, 1500, -1, 0)))
	first := out.String()
	assert.NotContains(t, first, "\x1b", "nothing to move over the first time")
	want := []string{
		"10:00:00  requests 3  table age 3ms",
		"cached tokens: predicted 58.2%, actual 62.9% (2 outcomes)",
		"filter   decisions     spills  fallbacks   unrouted  oversized",
		"                 2          1          0          1          0",
		"replica  running  waiting  queued prefill  KV usage  hit rate    last",
		"vllm-0         0        0               0      0.0%     50.0%       -",
		"vllm-1         1        2            1000     12.5%         -       -",
		"vllm-2         2        4            2000     25.0%      0.0%       -",
		"hit rate: prompt tokens the engines found cached, since they started",
	}
	assert.Equal(t, strings.Join(want, "\n")+"\n", first)

	out.Reset()
	next := summaryAt(4, 2400, 1000, 0)
	next.Filter.WithoutUsage = 7
	require.NoError(t, p.Print(t0.Add(5*time.Second), next))
	second := out.String()
	require.True(t, strings.HasPrefix(second, "\x1b[9A\r\x1b[J"), "up over the 9 lines drawn, erase below: %q", second)
	table := strings.TrimPrefix(second, "\x1b[9A\r\x1b[J")
	assert.NotContains(t, table, "\x1b")
	rows := strings.Split(table, "\n")
	assert.Equal(t, "cached tokens: predicted 58.2%, actual 62.9% (3 outcomes, 7 without usage)", rows[1])
	assert.Equal(t, "replica  running  waiting  queued prefill  KV usage  hit rate  last 5s", rows[4])
	// vllm-0: 2400 of 4000 since the start, 900 of the last 1000 queried tokens.
	assert.Equal(t, "vllm-0         0        0               0      0.0%     60.0%    90.0%", rows[5])
	// vllm-1: first queries in the interval.
	assert.Equal(t, "vllm-1         1        2            1000     12.5%     25.0%    25.0%", rows[6])
	assert.Equal(t, "hit rate: prompt tokens found cached, since start and in the last 5s", rows[8])
	for _, r := range rows {
		assert.Less(t, len(r), 80, "a line that wraps breaks the redraw: %q", r)
	}

	// A message printed in between is not drawn over.
	p.Forget()
	out.Reset()
	require.NoError(t, p.Print(t0.Add(10*time.Second), summaryAt(5, 2400, 1000, 0)))
	assert.NotContains(t, out.String(), "\x1b")
}

// chatEngine sends a non-streamed chat completion straight to an engine (no proxy, no
// routing) and returns its usage.
func chatEngine(t *testing.T, url, system, user string) mesh.Usage {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"model": "llama", "max_tokens": 4,
		"messages": []map[string]string{{"role": "system", "content": system}, {"role": "user", "content": user}},
	})
	require.NoError(t, err)
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	var out struct {
		Usage mesh.Usage `json:"usage"`
	}
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	require.NotNil(t, out.Usage.Details)
	out.Usage.CachedTokens = out.Usage.Details.CachedTokens
	return out.Usage
}

// The summary reads every replica's own numbers: the replica sent a prompt twice shows
// its prefix-cache hits, the others nothing, and the table names every replica.
func TestSummaryReadsEachReplica(t *testing.T) {
	m := start(t, mesh.Options{})
	const served = 2
	system := mesh.SystemPrompt(3, 600)
	first := chatEngine(t, m.Engines[served].URL(), system, "Where is my order 42?")
	second := chatEngine(t, m.Engines[served].URL(), system, "Where is my order 42?")
	require.Positive(t, second.CachedTokens)

	s := m.Summary()
	require.Len(t, s.Replicas, 4)
	for i, r := range s.Replicas {
		assert.Equal(t, fmt.Sprintf("vllm-%d", i), r.Name)
		assert.Equal(t, s.Queues[i], r.QueuedPrefillTokens)
		assert.GreaterOrEqual(t, r.KVUsage, 0.0)
		assert.LessOrEqual(t, r.KVUsage, 1.0)
		if i != served {
			assert.Zero(t, r.PrefixQueries, "vllm-%d served nothing", i)
			assert.True(t, math.IsNaN(r.HitRate()))
		}
	}
	r := s.Replicas[served]
	assert.Equal(t, int64(first.CachedTokens+second.CachedTokens), r.PrefixHits)
	assert.Equal(t, int64(first.PromptTokens+second.PromptTokens), r.PrefixQueries)

	table := s.Table(time.Now(), nil, 0)
	for i := range 4 {
		assert.Contains(t, table, fmt.Sprintf("\nvllm-%d ", i))
	}
	assert.Contains(t, table, percent1(r.HitRate()))
}

func percent1(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) }
