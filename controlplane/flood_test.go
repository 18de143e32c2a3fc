package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/rule"
	"github.com/kvroute/kvroute/shared/table"
)

// memSample is the process's memory at one moment: the Go heap in use and the RSS
// the kernel charges (/proc/self/status VmRSS; 0 where there is no /proc).
type memSample struct{ heap, rss uint64 }

func (m memSample) String() string {
	return fmt.Sprintf("heap %d MB, RSS %d MB", m.heap>>20, m.rss>>20)
}

func sampleMem() memSample {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := memSample{heap: ms.HeapInuse}
	if f, err := os.Open("/proc/self/status"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
				kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				s.rss = kb << 10
			}
		}
		f.Close()
	}
	return s
}

func settledMem() memSample {
	runtime.GC()
	debug.FreeOSMemory()
	return sampleMem()
}

// floodPart is n placements of k keys each for one replica.
type floodPart struct {
	replica string
	n, k    int
}

// floodBatch is one POST /v1/reports body: placements of fresh random text-domain keys
// (block 64, stride 4), plus one report naming a replica that does not exist.
func floodBatch(rng *rand.Rand, parts []floodPart) []byte {
	var reps []string
	var ks []int
	for _, p := range parts {
		for range p.n {
			reps, ks = append(reps, p.replica), append(ks, p.k)
		}
	}
	reps, ks = append(reps, "10.9.9.9:8000"), append(ks, 16)
	b := make([]byte, 0, 8<<20)
	b = append(b, `{"proxy":"flood","reports":[`...)
	for i, rep := range reps {
		k := ks[i]
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, `{"kind":"placement","model":"m","replica":%q,"domain":1,"block_size":64,"stride":4,"blocks":%d,"predicted_cached_tokens":0,"at_ms":1,"keys":[`, rep, 4*k)
		for j := 0; j < k; j++ {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, rng.Uint64(), 10)
		}
		b = append(b, "]}"...)
	}
	return append(b, "]}"...)
}

// TestReportFlood is issue 12's report flood against a control plane at its default
// budget: ten report batches of about 7 MB (3.4 M random placement keys in all) for
// eight replicas, four with a scraped KV capacity of 16,000 tokens (they get chains
// longer than that, and many short ones) and four whose capacity is not known yet (the
// default capacity applies; they get 16,384-key chains until the global limit binds). The process must stay under the stated ceiling (300 MB
// RSS), a filter polling the table meanwhile must keep getting 200/304, the dropped
// keys must be counted, and memory must fall back once the speculative entries expired.
//
// Before the budget (commit 45b9077 plus only the Options.Now clock this test needs),
// it measured: before the flood heap 2 MB / RSS 26 MB; the eighth batch took the process
// past the 1 GiB safety stop (peak heap 1053 MB, RSS 1130 MB); 3 of 87 polls timed out
// (1 s); after expiry + GC + FreeOSMemory heap 556 MB / RSS 575 MB (maps never shrink);
// no drop counted anywhere. With the budget: peak heap about 160 MB / RSS 200 MB, no
// poll failed (slowest 0.5-0.7 s), after expiry heap 7 MB / RSS 35 MB.
func TestReportFlood(t *testing.T) {
	if raceDetector {
		// Measured at ecae4e6 under -race: RSS 526-583 MB against the 300 MB ceiling,
		// and versions 4 s old against the 2 s guard; neither says anything about the
		// control plane.
		t.Skip("a memory and freshness test: the race detector multiplies memory (5-10x) and CPU time")
	}
	const (
		ceilingRSS = 300 << 20 // the stated ceiling at the default budget
		safety     = 1 << 30   // stop flooding past this: the test has failed anyway
		batches    = 10
	)
	// The control plane's clock: moved past the speculative TTL (60 s by default)
	// after the flood instead of waiting for it.
	var skew atomic.Int64
	clock := func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }
	var queued atomic.Int64
	metrics := fakeMetrics(t, &queued) // capacity 1000 blocks x 16 = 16,000 tokens
	var engines []discovery.Engine
	var parts []floodPart
	for i := range 8 {
		e := discovery.Engine{ID: fmt.Sprintf("e%d", i), Model: "m", Addr: fmt.Sprintf("10.0.0.%d:8000", i+1)}
		if i < 4 {
			e.Metrics = metrics.URL + "/metrics"
		} else {
			e.Metrics = metrics.URL + "/missing" // capacity unknown: the default applies
		}
		engines = append(engines, e)
		if i < 4 {
			parts = append(parts, floodPart{e.Addr, 1, 16384}, floodPart{e.Addr, 20, 200})
		} else {
			parts = append(parts, floodPart{e.Addr, 4, 16384})
		}
	}
	cp, err := New(Options{Listen: "127.0.0.1:0", Engines: engines, Logger: quiet(), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); cp.Wait() }()
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	base := "http://" + cp.Addr()
	p := &poller{t: t, base: base, tab: table.New()}
	p.until("capacities scraped", func(m *table.Model) bool {
		for _, st := range cp.Index.DebugState(time.Now()) {
			if st.ID == "e0" && st.CapacityTokens == 16000 {
				return len(m.Replicas) == 8
			}
		}
		return false
	})
	before := settledMem()

	// A filter's leader polls the table every 50 ms with a 1 s timeout, following
	// deltas, for the whole flood.
	var (
		pollMu    sync.Mutex
		codes     = map[int]int{}
		pollFails []string
		timeouts  []string // polls past the filter's 1 s timeout: the leader retries
		slowest   time.Duration
		start     time.Time
		lastOK    time.Time
		longest   time.Duration // longest time without a successful poll (logged)
		oldest    time.Duration // oldest version served (X-Kvroute-Age-Ms)
		inARow    int           // consecutive polls past the filter's timeout
		mostInRow int
		peak      memSample
		over      atomic.Bool
	)
	start = time.Now()
	lastOK = start
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		client := &http.Client{Timeout: time.Second}
		tab := table.New()
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			url := base + api.TablePath
			if tab.Version != 0 {
				url += fmt.Sprintf("?version=%d", tab.Version)
			}
			t0 := time.Now()
			resp, err := client.Get(url)
			if err != nil {
				msg := fmt.Sprintf("%v after the flood's start: %v", time.Since(start).Round(time.Millisecond), err)
				pollMu.Lock()
				if errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err) {
					timeouts = append(timeouts, msg)
					inARow++
					mostInRow = max(mostInRow, inARow)
				} else {
					pollFails = append(pollFails, msg)
				}
				pollMu.Unlock()
				continue
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			pollMu.Lock()
			slowest = max(slowest, time.Since(t0))
			codes[resp.StatusCode]++
			inARow = 0
			// Ages only until the clock is moved for the expiry check below.
			if ms, err := strconv.Atoi(resp.Header.Get(api.TableAgeHeader)); err == nil && skew.Load() == 0 {
				oldest = max(oldest, time.Duration(ms)*time.Millisecond)
			}
			if err != nil {
				pollFails = append(pollFails, err.Error())
			} else if resp.StatusCode == http.StatusOK {
				if _, err := tab.Apply(body); err != nil {
					pollFails = append(pollFails, "apply: "+err.Error())
					tab = table.New()
				} else {
					longest, lastOK = max(longest, time.Since(lastOK)), time.Now()
				}
			} else if resp.StatusCode == http.StatusNotModified {
				longest, lastOK = max(longest, time.Since(lastOK)), time.Now()
			} else {
				pollFails = append(pollFails, fmt.Sprintf("status %d", resp.StatusCode))
			}
			pollMu.Unlock()
		}
	})
	wg.Go(func() {
		for {
			s := sampleMem()
			pollMu.Lock()
			peak.heap, peak.rss = max(peak.heap, s.heap), max(peak.rss, s.rss)
			pollMu.Unlock()
			if s.rss > safety || s.heap > safety {
				over.Store(true)
			}
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	})

	rng := rand.New(rand.NewPCG(12, 12))
	answered := map[int]int{}
	sent := 0
	for i := range batches {
		if over.Load() {
			break
		}
		body := floodBatch(rng, parts)
		if i == 0 {
			t.Logf("batch of %.1f MB", float64(len(body))/1e6)
		}
		resp, err := http.Post(base+api.ReportsPath, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered[resp.StatusCode]++
		sent++
	}
	floodTime := time.Since(start)
	pollMu.Lock()
	floodPeak := peak
	pollMu.Unlock()
	t.Logf("flood: %d batches in %v, answers %v; before %v, peak %v", sent, floodTime.Round(time.Millisecond), answered, before, floodPeak)

	// Expiry: every speculative entry is gone from the published table.
	skew.Store(int64(cp.Index.Config().SpecTTL + time.Second))
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.poll()
		if m := p.tab.Models["m"]; m != nil && m.Len() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("entries did not expire: %d keys left", p.tab.Models["m"].Len())
		}
		time.Sleep(50 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	after := settledMem()
	pollMu.Lock()
	t.Logf("polls %v (slowest %v, oldest version served %v, longest without a successful poll %v), failures %d %q, timeouts %d (at most %d in a row) %q; after expiry %v",
		codes, slowest.Round(time.Millisecond), oldest, longest.Round(time.Millisecond), len(pollFails), first(pollFails, 3), len(timeouts), mostInRow, first(timeouts, 3), after)
	pollMu.Unlock()

	if over.Load() || floodPeak.rss > ceilingRSS {
		t.Errorf("peak %v: above the %d MB RSS ceiling", floodPeak, ceilingRSS>>20)
	}
	if sent != batches {
		t.Errorf("only %d of %d batches sent", sent, batches)
	}
	// What routing needs from the polls: every answer valid, the versions served kept
	// fresh (the publisher is not starved by the flood: every answer's age under the
	// rule's state-age guard, rule.DefaultParams, 2 s), and no two polls in a row past
	// the filter's 1 s timeout (one is retried on the next tick). The time between
	// successful polls is logged, not asserted: the flood's batches are built in this
	// process, and on a loaded 2-core CI machine the poller goroutine itself went 2.3
	// and 3.6 s unscheduled while every answer it got was fast and fresh.
	guard := rule.DefaultParams().MaxStateAge
	if len(pollFails) > 0 || codes[http.StatusOK]+codes[http.StatusNotModified] == 0 || oldest > guard || mostInRow > 1 {
		t.Errorf("table polls during the flood: %v, failures %q, timeouts %q (%d in a row), oldest version served %v (guard %v)",
			codes, first(pollFails, 5), first(timeouts, 5), mostInRow, oldest, guard)
	}
	if after.heap > before.heap+32<<20 {
		t.Errorf("memory did not fall back after expiry: before %v, after %v", before, after)
	}
	// The drops are counted in /metrics and /debug/state.
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, reason := range []string{"oversized", "replica_budget", "global_budget"} {
		v := metricValue(string(mb), `kvroute_controlplane_budget_dropped_total{input="report_keys",reason="`+reason+`"}`)
		if v <= 0 {
			t.Errorf("no report keys counted as dropped for %s", reason)
		}
	}
	if v := metricValue(string(mb), `kvroute_controlplane_reports_total{kind="placement",result="unknown_replica"}`); v < float64(sent) {
		t.Errorf("unknown replica reports counted %v, want %d", v, sent)
	}
	resp, err = http.Get(base + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	db, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var st struct {
		Budget struct {
			Keys    int                          `json:"keys"`
			Dropped map[string]map[string]uint64 `json:"dropped"`
		} `json:"budget"`
	}
	json.Unmarshal(db, &st)
	t.Logf("/debug/state budget after expiry: keys %d, dropped %v", st.Budget.Keys, st.Budget.Dropped)
	if st.Budget.Dropped["report_keys"]["global_budget"] == 0 {
		t.Errorf("/debug/state does not show the budget drops")
	}
}

func first(s []string, n int) []string { return s[:min(n, len(s))] }

// metricValue finds one sample's value in Prometheus text; -1 when absent.
func metricValue(text, series string) float64 {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}
