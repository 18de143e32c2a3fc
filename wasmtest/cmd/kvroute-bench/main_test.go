package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/wasmtest/fleet"
)

// tiny: a seconds-long GSP run on the fast profile.
var tiny = []string{"--workload", "gsp", "--profile", "fast", "--gsp-groups", "4", "--gsp-prompts-per-group", "8",
	"--gsp-system-prompt-len", "256", "--gsp-question-len", "32", "--gsp-output-len", "16", "--rate", "20", "--replicas", "2"}

func TestCompareTableAndJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--json", path, "--policies", "round-robin,kvroute,oracle"), &out, &errOut), errOut.String())
	s := out.String()
	assert.Contains(t, s, "workload  gsp: 4 groups x 8 prompts")
	assert.Contains(t, s, "replicas  2 (2 GPUs)")
	for _, p := range []string{"round-robin", "kvroute", "oracle"} {
		assert.Contains(t, s, p)
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Workload string `json:"workload"`
		Replicas int    `json:"replicas"`
		Policies []struct {
			Name     string `json:"name"`
			Requests int    `json:"requests"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	assert.Equal(t, "gsp", doc.Workload)
	assert.Equal(t, 2, doc.Replicas)
	require.Len(t, doc.Policies, 3)
	assert.Equal(t, 32, doc.Policies[1].Requests)
	assert.Regexp(t, `reuse ceiling \d+\.\d% over 32 measured requests`, s)
	assert.Contains(t, s, "oracle: kvroute's own rule", "the oracle is said for what it is")
	assert.Contains(t, s, "not an upper bound on routing")
	assert.Contains(t, string(b), `"reuse_ceiling": 0.`)
	assert.Regexp(t, `pooled LRU \d+\.\d% over \d+ KV tokens`, s)
	assert.Contains(t, string(b), `"pooled_lru": 0.`)
	assert.NotContains(t, string(b), `"memory"`, "the fleet's memory only when asked for")
	assert.NotContains(t, s, "lost waiting")
	assert.Regexp(t, `kvroute over the best other policy on each figure[^\n]*\n.*\ncached \d\.\d{3}\*? \(round-robin\), `+
		`TTFT p50 [^,]+ \(round-robin\), .*: \d of 5 off`, s, "the yardstick, against the one peer that ran")
	assert.Contains(t, string(b), `"against_best": [`)
	assert.NotContains(t, string(b), `"policy_seed"`)
}

// TestPolicySeeds: --policy-seeds runs --seed's arrivals once per policy seed, says so,
// and carries both seeds in the JSON (fleet's TestPolicySeedDrawsOnlyTheTies holds what
// a policy seed changes).
func TestPolicySeeds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ties.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--seed", "4", "--policy-seeds", "2:3", "--json", path, "--policies", "random,kvroute"), &out, &errOut), errOut.String())
	s := out.String()
	assert.Contains(t, s, ", seed 4, 32 requests, policy seeds 2:3\n")
	assert.Contains(t, s, "each seed is a policy seed: seed 4's arrivals")
	for _, seed := range []string{"2", "3"} {
		assert.Contains(t, s, "\npolicy seed "+seed+": 32 requests, 2 replicas (2 GPUs)\n")
		assert.Regexp(t, `(?m)^\s+`+seed+`(\s+(\d+\.\d{3,6}\*?|-)){5}\s+\d$`, s)
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Runs []struct {
			Seed       uint64 `json:"seed"`
			PolicySeed uint64 `json:"policy_seed"`
			Policies   []struct {
				Requests int `json:"requests"`
			} `json:"policies"`
		} `json:"runs"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Runs, 2)
	for i, r := range doc.Runs {
		assert.Equal(t, uint64(4), r.Seed, "the arrivals' seed")
		assert.Equal(t, uint64(2+i), r.PolicySeed)
		assert.Equal(t, 32, r.Policies[0].Requests)
	}
}

// TestPolicySeedFlag: --policy-seed is said in the header and the JSON.
func TestPolicySeedFlag(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--policy-seed", "5", "--json", path, "--policies", "random,kvroute"), &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), ", policy seed 5, seed 1, 32 requests\n")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"policy_seed": 5`)
}

// TestSeeds: --seeds runs one comparison per seed, each on its own arrivals, then
// kvroute's yardstick over all of them, in the table and in the JSON.
func TestSeeds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seeds.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--seeds", "4:6", "--json", path, "--policies", "round-robin,kvroute"), &out, &errOut), errOut.String())
	s := out.String()
	for _, seed := range []string{"4", "5", "6"} {
		assert.Contains(t, s, "\nseed "+seed+": 32 requests, 2 replicas (2 GPUs)\n")
		assert.Regexp(t, `(?m)^\s+`+seed+`(\s+(\d+\.\d{3,6}\*?|-)){5}\s+\d$`, s)
	}
	assert.Regexp(t, `(?m)^\s+geomean(\s+\d+\.\d{3}){5}\s+\d+$`, s)
	assert.Regexp(t, `bounds met: \d+ of 15\n`, s)

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Runs []struct {
			Seed        uint64 `json:"seed"`
			AgainstBest []struct {
				Figure string `json:"figure"`
				Off    bool   `json:"off"`
			} `json:"against_best"`
			Policies []struct {
				Name            string  `json:"name"`
				CachedTokenRate float64 `json:"cached_token_rate"`
			} `json:"policies"`
		} `json:"runs"`
		Geomeans       []struct{ Figure string } `json:"geomeans"`
		BoundsMet      int                       `json:"bounds_met"`
		Figures        int                       `json:"figures"`
		PolicyGeomeans []struct {
			Policy          string  `json:"policy"`
			CachedTokenRate float64 `json:"cached_token_rate"`
		} `json:"policy_geomeans"`
		AgainstBestOverSeeds []struct{ Figure string } `json:"against_best_over_seeds"`
		Held                 []struct {
			Policy  string `json:"policy"`
			Off     int    `json:"off"`
			Figures int    `json:"figures"`
		} `json:"held"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Runs, 3)
	off := 0
	for i, r := range doc.Runs {
		assert.Equal(t, uint64(4+i), r.Seed)
		require.Len(t, r.AgainstBest, 5)
		for _, f := range r.AgainstBest {
			if f.Off {
				off++
			}
		}
	}
	assert.Equal(t, 15, doc.Figures)
	assert.Equal(t, 15-off, doc.BoundsMet)
	assert.Regexp(t, fmt.Sprintf(`bounds met: %d of 15`, doc.BoundsMet), s)
	assert.Len(t, doc.Geomeans, 5)
	// over the seeds: each policy's geometric means, kvroute against them, and each
	// held to the per-seed count (kvroute's is the bounds missed)
	require.Len(t, doc.PolicyGeomeans, 2)
	assert.Equal(t, "round-robin", doc.PolicyGeomeans[0].Policy)
	assert.Positive(t, doc.PolicyGeomeans[1].CachedTokenRate)
	assert.Len(t, doc.AgainstBestOverSeeds, 5)
	require.Len(t, doc.Held, 2)
	assert.Equal(t, "kvroute", doc.Held[0].Policy)
	assert.Equal(t, off, doc.Held[0].Off)
	assert.Equal(t, 15, doc.Held[1].Figures)
	assert.Contains(t, s, "kvroute over the best other policy over the seeds: cached ")
	assert.Regexp(t, `figures off: kvroute \d+ of 15, round-robin \d+ of 15\n`, s)
	assert.NotEqual(t, doc.Runs[0].Policies[1].CachedTokenRate, doc.Runs[2].Policies[1].CachedTokenRate,
		"each seed runs its own arrivals")
}

// TestRequestsCSV: --requests-csv writes every request of every policy, and its rows add
// up to the table: the measured requests, their cached rate and the reuse ceiling.
func TestRequestsCSV(t *testing.T) {
	dir := t.TempDir()
	csvPath, jsonPath := filepath.Join(dir, "requests.csv"), filepath.Join(dir, "out.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--requests-csv", csvPath, "--json", jsonPath, "--policies", "round-robin,kvroute"), &out, &errOut), errOut.String())
	f, err := os.Open(csvPath)
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	assert.Equal(t, fleet.OutcomeColumns, rows[0])
	col := map[string]int{}
	for i, c := range rows[0] {
		col[c] = i
	}
	num := func(r []string, c string) float64 {
		v, err := strconv.ParseFloat(r[col[c]], 64)
		require.NoError(t, err, "%s = %q", c, r[col[c]])
		return v
	}

	b, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	var doc struct {
		Ceiling  float64 `json:"reuse_ceiling"`
		Policies []struct {
			Name     string  `json:"name"`
			Requests int     `json:"requests"`
			Cached   float64 `json:"cached_token_rate"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Policies, 2)
	for _, p := range doc.Policies {
		var n, all int
		var prompt, cached, reusable float64
		for _, r := range rows[1:] {
			if r[col["policy"]] != p.Name {
				continue
			}
			all++
			assert.Equal(t, "done", r[col["state"]], "nothing fails on an idle fleet")
			assert.Contains(t, []float64{0, 1}, num(r, "replica"))
			assert.LessOrEqual(t, num(r, "ttft_s"), num(r, "e2e_s"))
			assert.LessOrEqual(t, num(r, "cached_tokens"), num(r, "prompt_tokens")-1)
			if from := num(r, "reuse_from"); num(r, "reusable_tokens") > 0 {
				assert.Less(t, from, num(r, "request"), "a reuse comes from an earlier request")
			} else {
				assert.Equal(t, -1.0, from)
			}
			if r[col["measured"]] == "true" {
				n++
				prompt += num(r, "prompt_tokens")
				cached += num(r, "cached_tokens")
				reusable += num(r, "reusable_tokens")
			}
		}
		assert.Equal(t, 32, all, "%s: every request, the warm-up's too", p.Name)
		assert.Equal(t, p.Requests, n, p.Name)
		assert.InDelta(t, p.Cached, cached/prompt, 1e-6, p.Name)
		assert.InDelta(t, doc.Ceiling, reusable/prompt, 1e-6, p.Name)
	}
}

// TestMemoryTable: --memory adds the replicas' KV memory to the table and the JSON.
func TestMemoryTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--memory", "--json", path, "--policies", "round-robin,kvroute"), &out, &errOut), errOut.String())
	s := out.String()
	assert.Regexp(t, `policy\s+cached\s+KV usage\s+free blocks\s+running\s+waiting\s+lost waiting\s+evicted/s\s+stored again\s+in the fleet\s+preempt`, s)
	// A run shorter than the 5 minutes an eviction waits to count has no share: "-".
	assert.Regexp(t, `kvroute\s+\d+\.\d%\s+\d+\.\d%\s+\d+\.\d%\s+\d+\.\d\s+\d+\.\d\s+\d+\.\d%\s+-\s+-\s+-\s+\d+`, s)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Policies []struct {
			Memory *struct {
				KVUsage     float64  `json:"kv_usage"`
				Free        float64  `json:"free_blocks"`
				StoredAgain *float64 `json:"stored_again"`
			} `json:"memory"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Policies, 2)
	for _, p := range doc.Policies {
		require.NotNil(t, p.Memory)
		assert.Greater(t, p.Memory.KVUsage, 0.0)
		assert.InDelta(t, 1, p.Memory.KVUsage+p.Memory.Free, 0.01)
		assert.Nil(t, p.Memory.StoredAgain, "null: no eviction's window closed within the run")
	}
}

func TestFindRate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rate.json")
	var out bytes.Buffer
	args := append(tiny, "--find-rate", "--slo-ttft-p95", "5ms", "--rate-resolution", "10", "--policies", "round-robin,oracle", "--json", path)
	require.NoError(t, run(args, &out, &out), out.String())
	s := out.String()
	assert.Contains(t, s, "highest rate with TTFT p95 <= 0.005 s at 2 replicas (2 GPUs), from 20 req/s to within 10 req/s")
	assert.Regexp(t, `policy\s+rate held\s+misses at\s+TTFT p95 s\s+cached\s+ceiling`, s)
	assert.Contains(t, s, "ceiling: the reuse ceiling of the arrivals at that rate")
	assert.Contains(t, s, "oracle: kvroute's own rule")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Workload   string  `json:"workload"`
		SLO        float64 `json:"slo_ttft_p95_s"`
		Resolution string  `json:"resolution"`
		Policies   []struct {
			Name     string   `json:"name"`
			RateHeld float64  `json:"rate_held"`
			MissedAt *float64 `json:"missed_at"`
			P95      *float64 `json:"ttft_p95_s"`
			Ceiling  float64  `json:"reuse_ceiling"`
			Tried    []struct {
				Rate float64 `json:"rate"`
			} `json:"tried"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	assert.Equal(t, "gsp", doc.Workload)
	assert.Equal(t, "10 req/s", doc.Resolution)
	require.Len(t, doc.Policies, 2)
	for _, p := range doc.Policies {
		require.NotNil(t, p.MissedAt, "%s: the fast profile misses 5 ms somewhere below the cap", p.Name)
		assert.Positive(t, p.RateHeld, p.Name)
		assert.LessOrEqual(t, *p.MissedAt-p.RateHeld, 10.0, p.Name)
		require.NotNil(t, p.P95)
		assert.LessOrEqual(t, *p.P95, 0.005)
		assert.Positive(t, p.Ceiling)
		assert.Equal(t, 20.0, p.Tried[0].Rate, "%s: the search starts at --rate", p.Name)
	}
}

// TestFindRateOnATrace: a trace's rate is a time compression; the table says which.
func TestFindRateOnATrace(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--trace", "../../../testdata/mooncake/synthetic_trace_head200.jsonl", "--replicas", "8", "--policies", "oracle",
		"--find-rate", "--slo-ttft-p95", "5", "--rate-resolution", "25%"}
	require.NoError(t, run(args, &out, &out), out.String())
	s := out.String()
	assert.Contains(t, s, "the trace's rate: 3.419 req/s at speedup 1")
	assert.Regexp(t, `policy\s+rate held\s+speedup\s+misses at`, s)
	assert.Regexp(t, `oracle\s+\d+(\.\d+)?\s+\d+(\.\d+)?\s+\d`, s, "a rate held and its speedup")
}

func TestSweepRate(t *testing.T) {
	dir := t.TempDir()
	plot, js := filepath.Join(dir, "sweep.svg"), filepath.Join(dir, "sweep.json")
	var out bytes.Buffer
	args := append(tiny, "--sweep-rate", "10:30:10", "--policies", "round-robin,kvroute,oracle", "--plot", plot, "--json", js)
	require.NoError(t, run(args, &out, &out), out.String())
	s := out.String()
	assert.Contains(t, s, "sweep     3 rates from 10 to 30 req/s at 2 replicas (2 GPUs)")
	rows := regexp.MustCompile(`(?m)^\s+(10|20|30)\s+(round-robin|kvroute|oracle)\s+32\s+0\s+[\d.]+%\s+[\d.]+%`).FindAllString(s, -1)
	assert.Len(t, rows, 9, "a row per rate and policy:\n%s", s)
	texts := svgTexts(t, plot)
	for _, p := range []string{"round-robin", "kvroute", "oracle (exact engine state)", "reuse ceiling (infinite cache)"} {
		assert.Contains(t, texts, p)
	}
	b, err := os.ReadFile(js)
	require.NoError(t, err)
	var doc struct {
		Rates []struct {
			Rate     float64 `json:"rate"`
			Ceiling  float64 `json:"reuse_ceiling"`
			Policies []struct {
				Name string `json:"name"`
			} `json:"policies"`
		} `json:"rates"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	require.Len(t, doc.Rates, 3)
	assert.Equal(t, 30.0, doc.Rates[2].Rate)
	assert.Len(t, doc.Rates[2].Policies, 3)
	assert.Positive(t, doc.Rates[0].Ceiling)
}

func TestFindReplicas(t *testing.T) {
	var out bytes.Buffer
	args := append(tiny, "--find-replicas", "--slo-ttft-p95", "0.5", "--policies", "oracle,random")
	require.NoError(t, run(args, &out, &out), out.String())
	assert.Contains(t, out.String(), "fewest replicas with TTFT p95 <= 0.5 s (GPUs = replicas x 1)")
	assert.Regexp(t, `oracle\s+1\s+1\s`, out.String(), "one fast replica is plenty")
}

func TestFaultsAndHotFlags(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--profile", "fast", "--duration", "5s", "--customers", "10", "--prompt-tokens", "400",
		"--shared-fraction", "0.5", "--output-tokens", "20", "--rate", "20", "--replicas", "3", "--hot",
		"--kill-replica", "2s:1", "--restart-replica", "3s", "--routers", "2", "--stale", "200", "--policies", "kvroute"}
	require.NoError(t, run(args, &out, &out), out.String())
	s := out.String()
	assert.Contains(t, s, "customer 0 sends 10%")
	assert.Contains(t, s, "kill replica 1 at 2s, restart replica 0 at 3s")
	assert.Contains(t, s, "2 routers")
	assert.Contains(t, s, "tables 200ms stale")
	assert.Contains(t, s, "hot customer (group 0)")
}

func TestBadFlags(t *testing.T) {
	cases := [][]string{
		{"--policies", "nope"},
		{"--workload", "nope"},
		{"--kill-replica", "soon"},
		{"--shared-fraction", "2"},
		{"--trace", "x.jsonl", "--trace-format", "other"},
		{"extra"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		assert.Error(t, run(c, &out, &out), strings.Join(c, " "))
	}
}

// TestBadLoadFlags: rate searches and sweeps refuse what they cannot run, with a usage
// error that says why, before any simulation.
func TestBadLoadFlags(t *testing.T) {
	trace := "../../../testdata/mooncake/synthetic_trace_head200.jsonl"
	cases := []struct {
		args []string
		says string
	}{
		{[]string{"--find-rate", "--find-replicas"}, "give one"},
		{[]string{"--find-rate", "--sweep-rate", "1:2:1"}, "give one"},
		{[]string{"--find-rate", "--plot", "x.svg"}, "a rate search has no picture"},
		{[]string{"--sweep-rate", "10:20:5", "--requests-csv", "x.csv"}, "writes one comparison's requests"},
		{[]string{"--sweep-rate", "10:5:1"}, "--sweep-rate \"10:5:1\": the last rate B must not be below A"},
		{[]string{"--sweep-rate", "10:20"}, "want A:B:STEP"},
		{[]string{"--find-rate", "--rate-resolution", "0"}, "--rate-resolution \"0\": want a positive number"},
		{[]string{"--rate", "-1"}, "--rate -1 must be positive"},
		{[]string{"--workload", "burst", "--rate", "16", "--burst-rate", "2"}, "--rate and --burst-rate: give one"},
		{[]string{"--trace", trace, "--rate", "2", "--speedup", "2"}, "a trace's rate is its speedup, give one"},
		{[]string{"--trace", trace, "--speedup", "0"}, "--speedup 0 must be positive"},
		{[]string{"--seeds", "3:1"}, "want A <= B"},
		{[]string{"--seeds", "1:500"}, "at most 100 seeds"},
		{[]string{"--seeds", "one"}, "want A:B"},
		{[]string{"--seeds", "1:x"}, "invalid syntax"},
		{[]string{"--seeds", "1:2", "--seed", "3"}, "--seeds and --seed: give one"},
		{[]string{"--seeds", "1:2", "--find-rate"}, "--seeds and --policy-seeds print each seed's table and the yardstick: not with"},
		{[]string{"--seeds", "1:2", "--requests-csv", "x.csv"}, "--seeds and --policy-seeds print each seed's table"},
		{[]string{"--seeds", "1:2", "--memory"}, "--seeds and --policy-seeds print each seed's table"},
		{[]string{"--policy-seeds", "1:2", "--memory"}, "--seeds and --policy-seeds print each seed's table"},
		{[]string{"--policy-seeds", "1:2", "--seeds", "1:2"}, "--seeds and --policy-seeds: give one"},
		{[]string{"--policy-seeds", "1:2", "--policy-seed", "3"}, "--policy-seeds and --policy-seed: give one"},
		{[]string{"--policy-seeds", "2:1"}, "--policy-seeds \"2:1\": want A <= B"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		err := run(c.args, &out, &out)
		var u *cli.UsageError
		require.ErrorAs(t, err, &u, strings.Join(c.args, " "))
		assert.ErrorContains(t, err, c.says)
		assert.NotContains(t, out.String(), "policy", "%s: refused before any run", strings.Join(c.args, " "))
	}
}

// TestBurstRate: a burst's rate in requests per second is its groups per second times
// their size.
func TestBurstRate(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--workload", "burst", "--profile", "fast", "--burst-size", "4", "--burst-prefix-tokens", "64",
		"--burst-question-tokens", "16", "--burst-output-tokens", "4", "--burst-duration", "2", "--rate", "8", "--replicas", "2",
		"--policies", "oracle"}
	require.NoError(t, run(args, &out, &out), out.String())
	assert.Contains(t, out.String(), "2 groups/s for 2s")
}

func TestParseDuration(t *testing.T) {
	d, err := parseDuration("500", time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, d)
	d, err = parseDuration("1.5", time.Second)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, d)
	d, err = parseDuration("2m", time.Second)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Minute, d)
}

// svgTexts checks that path holds a well-formed SVG document and returns its text
// elements' contents.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	var root string
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "not well-formed XML")
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	require.Equal(t, "svg", root)
	return texts
}

// legendHas reports whether some text element starts with the policy's name and a
// space (the legend entry "NAME (...)"), so "kvroute" does not match "kvroute-wasm".
func legendHas(texts []string, policy string) bool {
	for _, s := range texts {
		if strings.HasPrefix(s, policy+" (") {
			return true
		}
	}
	return false
}

func TestPlotTTFT(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ttft.svg")
	var out bytes.Buffer
	require.NoError(t, run(append(tiny, "--plot", path), &out, &out), out.String())
	texts := svgTexts(t, path)
	for _, p := range fleet.Policies {
		assert.True(t, legendHas(texts, p), "no legend entry for %s in %q", p, texts)
	}
	assert.Contains(t, texts, "time to first token (s, log scale)")
	assert.Contains(t, texts, "TTFT per policy at 2 replicas (2 GPUs)")
}

func TestPlotSearch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "replicas.svg")
	var out bytes.Buffer
	args := append(tiny, "--find-replicas", "--slo-ttft-p95", "0.5", "--policies", "oracle,random,kvroute", "--plot", path)
	require.NoError(t, run(args, &out, &out), out.String())
	texts := svgTexts(t, path)
	for _, p := range []string{"oracle", "random", "kvroute"} {
		assert.True(t, legendHas(texts, p), "no legend entry for %s in %q", p, texts)
	}
	assert.Contains(t, texts, "oracle (1 replica)")
	assert.Contains(t, texts, "SLO: p95 ≤ 0.5 s")
}

func TestPlotFormat(t *testing.T) {
	var out bytes.Buffer
	err := run(append(tiny, "--plot", filepath.Join(t.TempDir(), "x.gif")), &out, &out)
	require.ErrorContains(t, err, "want a .svg, .png or .pdf file")
	assert.NotContains(t, out.String(), "policy", "the flag is checked before any simulation runs")
}

func TestClassesPrintsEachClassAndTenant(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(append(tiny, "--classes", "--policies", "kvroute,round-robin"), &out, io.Discard))
	s := out.String()
	assert.Contains(t, s, "senders interactive/critical 15% team/standard 25% noisy/standard 40% batch/sheddable 20%")
	assert.Regexp(t, `(?m)^\s+kvroute\s+critical\s+\d+\s+\d+\s+0\s`, s, "a row per policy and class; critical never shed")
	assert.Regexp(t, `(?m)^\s+round-robin\s+sheddable\s+\d+`, s)
	assert.Regexp(t, `(?m)^\s+kvroute\s+.*noisy \d+\.\d%`, s, "tenants' prefill shares")
}

func TestClassesInASweepPrintEachRate(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(append(tiny, "--classes", "--policies", "kvroute", "--sweep-rate", "10:20:10"), &out, io.Discard))
	s := out.String()
	assert.Contains(t, s, "at 10 req/s, by class")
	assert.Contains(t, s, "at 20 req/s, by class")
}
