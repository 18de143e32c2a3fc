package mesh

import (
	"fmt"
	"strings"
	"time"
)

// Summary is a snapshot of what the mesh is doing.
type Summary struct {
	// Requests the proxy has seen.
	Requests int64
	// Outcomes are the outcome reports with usage the filter sent; the rates are over
	// them: cached prompt tokens the filter predicted, and what the engines reported.
	Outcomes                  int64
	PredictedRate, ActualRate float64
	// Queues are the replicas' queued prefill tokens (the engines' own view).
	Queues []int
	// TableVersion and TableAge are the filter's view of the table.
	TableVersion int64
	TableAge     time.Duration
}

// Summary reads the counters now.
func (m *Mesh) Summary() Summary {
	s := Summary{Requests: m.Proxy.Stats().Requests}
	t := m.Reports.Totals()
	s.Outcomes = t.Outcomes
	if t.PromptTokens > 0 {
		s.PredictedRate = float64(t.PredictedCached) / float64(t.PromptTokens)
		s.ActualRate = float64(t.ActualCached) / float64(t.PromptTokens)
	}
	for _, e := range m.Engines {
		s.Queues = append(s.Queues, e.Replica().State().QueuedPrefillTokens)
	}
	if v, ok := m.Host.Metric("kvroute_table_version"); ok {
		s.TableVersion = v.Value
	}
	if v, ok := m.Host.Metric("kvroute_table_age_ms"); ok {
		s.TableAge = time.Duration(v.Value) * time.Millisecond
	}
	return s
}

// String is the one-line form `kvroute-mesh` prints every few seconds.
func (s Summary) String() string {
	q := make([]string, len(s.Queues))
	for i, v := range s.Queues {
		q[i] = fmt.Sprint(v)
	}
	age := "none"
	if s.TableVersion > 0 {
		age = s.TableAge.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("requests %d | cached tokens predicted %.1f%% actual %.1f%% (%d outcomes) | queued prefill tokens [%s] | table age %s",
		s.Requests, 100*s.PredictedRate, 100*s.ActualRate, s.Outcomes, strings.Join(q, " "), age)
}
