package affinity

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
)

type got = api.AffinityEntry

func want(key uint64, ageMs uint32, replica string) got {
	return got{Key: key, AgeMs: ageMs, Replica: replica}
}

// answer polls m and decodes what it answers.
func answer(t *testing.T, m *Map, since, epoch uint64, proxy string, now time.Time) (uint64, uint64, []got) {
	t.Helper()
	b, n := m.Answer(nil, since, epoch, api.ProxyKey(proxy), now)
	e, next, out, err := api.ParseAffinityAnswer(b)
	require.NoError(t, err)
	require.Len(t, out, n)
	return e, next, out
}

func outcome(key uint64, replica string) api.Report {
	return api.Report{Kind: api.KindOutcome, Model: "m", Replica: replica, Domain: 1, BlockSize: 1, Stride: 1, Status: 200, Affinity: key}
}

func counts() Counts {
	c := func(n string) prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: n}) }
	return Counts{Added: c("added"), Evicted: c("evicted"), Expired: c("expired"), Refused: c("refused")}
}

// A poll gets the entries after its cursor, never those its own proxy reported; a
// cursor of another epoch (a restart, another replica) or one the map never gave starts
// over from the oldest entry held.
func TestAnswerFollowsTheCursorAndStartsOverInAnotherEpoch(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	m := New(77, 0, 0, counts())
	assert.Equal(t, 2, m.Add(&api.ReportBatch{Proxy: "a", Reports: []api.Report{
		outcome(1, "10.0.0.1:8000"),
		{Kind: api.KindPlacement, Model: "m", Replica: "10.0.0.9:8000", Affinity: 9}, // placements carry none
		outcome(0, "10.0.0.9:8000"),
		func() api.Report { r := outcome(8, "10.0.0.8:8000"); r.Status = 404; return r }(), // the store did not answer
		outcome(2, "10.0.0.2:8000"),
	}}, now))
	m.Add(&api.ReportBatch{Proxy: "b", Reports: []api.Report{outcome(3, "10.0.0.1:8000")}}, now.Add(time.Second))

	epoch, next, es := answer(t, m, 0, 0, "b", now.Add(2*time.Second))
	assert.Equal(t, uint64(77), epoch)
	assert.Equal(t, []got{want(1, 2000, "10.0.0.1:8000"), want(2, 2000, "10.0.0.2:8000")}, es, "b's own entry left out")
	_, next2, es := answer(t, m, next, epoch, "b", now.Add(2*time.Second))
	assert.Empty(t, es)
	assert.Equal(t, next, next2)

	m.Add(&api.ReportBatch{Proxy: "a", Reports: []api.Report{outcome(4, "10.0.0.4:8000")}}, now.Add(3*time.Second))
	_, _, es = answer(t, m, next, epoch, "b", now.Add(3*time.Second))
	assert.Equal(t, []got{want(4, 0, "10.0.0.4:8000")}, es, "only what is new")

	for name, c := range map[string]struct{ since, epoch uint64 }{
		"another epoch":   {next, 12},
		"a future cursor": {1000, epoch},
	} {
		_, _, es = answer(t, m, c.since, c.epoch, "a", now.Add(3*time.Second))
		assert.Equal(t, []uint64{3}, keys(es), name+": everything held, but a's")
	}
}

// The map holds at most MaxEntries entries and none older than MaxAge, and counts what
// it dropped; an answer holds at most api.MaxAffinityAnswer entries, the rest on the next.
func TestMapIsBoundedInEntriesAndAge(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := counts()
	m := New(1, 5, time.Minute, c)
	for i := range 8 {
		m.Add(&api.ReportBatch{Proxy: "a", Reports: []api.Report{outcome(uint64(i+1), "10.0.0.1:8000")}}, now.Add(time.Duration(i)*time.Second))
	}
	assert.Equal(t, 5, m.Len())
	assert.Equal(t, 3.0, value(c.Evicted))
	_, _, es := answer(t, m, 0, 1, "b", now.Add(8*time.Second))
	assert.Equal(t, []uint64{4, 5, 6, 7, 8}, keys(es), "the newest five")

	// Past a minute: the first three of them (4, 5, 6 arrived at 3 s, 4 s, 5 s) are gone.
	_, _, es = answer(t, m, 0, 1, "b", now.Add(65*time.Second+time.Millisecond))
	assert.Equal(t, []uint64{7, 8}, keys(es))
	assert.Equal(t, 3.0, value(c.Expired))
	assert.Equal(t, 2, m.Len())

	big := New(1, 0, 0, Counts{})
	var rs []api.Report
	for i := range api.MaxAffinityAnswer + 10 {
		rs = append(rs, outcome(uint64(i+1), "10.0.0.1:8000"))
	}
	big.Add(&api.ReportBatch{Proxy: "a", Reports: rs}, now)
	_, next, es := answer(t, big, 0, 1, "b", now)
	assert.Len(t, es, api.MaxAffinityAnswer)
	_, _, es = answer(t, big, next, 1, "b", now)
	assert.Equal(t, []uint64{api.MaxAffinityAnswer + 1, api.MaxAffinityAnswer + 10}, []uint64{es[0].Key, es[len(es)-1].Key})
}

// Addresses are interned and bounded: once maxAddrs distinct ones are named by live
// entries, an entry naming another is refused and counted.
func TestMapBoundsTheAddressesItHolds(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	c := counts()
	m := New(1, 2*maxAddrs, 0, c)
	var rs []api.Report
	for i := range maxAddrs + 3 {
		rs = append(rs, outcome(uint64(i+1), fmt.Sprintf("10.%d.%d.1:8000", i/256, i%256)))
	}
	assert.Equal(t, maxAddrs, m.Add(&api.ReportBatch{Proxy: "a", Reports: rs}, now))
	assert.Equal(t, 3.0, value(c.Refused))
	assert.Equal(t, 1, m.Add(&api.ReportBatch{Proxy: "a", Reports: []api.Report{outcome(1<<40, "10.0.0.1:8000")}}, now), "a known address still goes in")
}

func keys(es []got) []uint64 {
	var ks []uint64
	for _, e := range es {
		ks = append(ks, e.Key)
	}
	return ks
}

func value(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
