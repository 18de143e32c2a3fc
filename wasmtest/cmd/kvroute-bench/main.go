// Command kvroute-bench simulates a fleet of LLM replicas (the engine simulator's
// scheduler, prefix cache and timing model, in virtual time) under a workload, routes it
// with every policy on the same arrivals, and prints the comparison: requests,
// cached-token rate, TTFT p50/p95/p99, end-to-end p50, max/mean queued tokens, spill
// rate and preemptions. kvroute's policy is the real routing code (shared/route) with
// the control plane's index in-process.
//
//	kvroute-bench                                   # docs/rule.md's example: 40 req/s, 200 customers, 22 replicas
//	kvroute-bench --hot                             # one customer sends 10% of the traffic
//	kvroute-bench --find-replicas --slo-ttft-p95 1  # fewest replicas (and GPUs) per policy
//	kvroute-bench --plot ttft.svg                   # also draw each policy's TTFT distribution
//	kvroute-bench --find-replicas --plot r.svg      # also draw TTFT p95 against replicas per policy
//	kvroute-bench --find-rate --slo-ttft-p95 1      # highest rate (req/s) the replicas hold, per policy
//	kvroute-bench --sweep-rate 30:60:5 --plot l.svg # every policy at each rate; TTFT and cached rate against it
//	kvroute-bench --shared-fraction 0.1             # the reversal condition
//	kvroute-bench --routers 8 --stale 500           # 8 proxies, tables 500 ms late
//	kvroute-bench --workload gsp --rate 8 --replicas 4
//	kvroute-bench --workload burst --burst-size 8 --burst-rate 2   # agent fan-out: new prefix per group
//	kvroute-bench --cp-outage 300:60                # the control plane unreachable for 60 s at 5 min
//	kvroute-bench --cp-failover 300                 # the polled control-plane replica SIGKILLed at 5 min
//	kvroute-bench --cpu-tier-tokens 2000000 --customers 600  # replicas offload KV to CPU memory
//	kvroute-bench --trace trace.jsonl --trace-format mooncake --speedup 2
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/internal/cli"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
	"github.com/kvroute/kvroute/wasmtest/fleet"
	"github.com/kvroute/kvroute/wasmtest/fleet/kvroute"
	"github.com/kvroute/kvroute/wasmtest/fleet/sim"
	"github.com/kvroute/kvroute/wasmtest/fleet/workload"
)

const command = "kvroute-bench"

var help = cli.Help{
	Intro: `simulates a fleet of LLM replicas (the engine simulator's scheduler,
prefix cache and timing model, in virtual time) under a workload, routes the same arrivals
with every policy, and prints the comparison: requests, cached-token rate, TTFT
p50/p95/p99, end-to-end p50, max/mean queued tokens, spill rate and preemptions.
kvroute's policy is the real routing code (shared/route) with the control plane's index
in-process.`,
	Usage: []string{"[flags]"},
	Details: `Examples:
  kvroute-bench                                   # 40 req/s, 200 customers, 22 replicas, 10 minutes
  kvroute-bench --hot                             # one customer sends 10% of the traffic
  kvroute-bench --find-replicas --slo-ttft-p95 1  # fewest replicas (and GPUs) per policy
  kvroute-bench --find-rate --slo-ttft-p95 1      # highest rate 22 replicas hold, per policy
  kvroute-bench --sweep-rate 30:60:5 --plot load.svg  # every policy at 30, 35, ... 60 req/s
  kvroute-bench --trace t.jsonl --find-rate       # a trace's rate is a time compression (--speedup)
  kvroute-bench --trace t.jsonl --replicas 4 --seeds 1:8  # one run per seed, then kvroute
                                                  # against the best other policy over them
  kvroute-bench --routers 8 --stale 500           # 8 proxies, tables 500 ms late
  kvroute-bench --workload gsp --rate 8 --replicas 4
  kvroute-bench --cp-outage 300:60                # the control plane unreachable for 60 s at 5 min
  kvroute-bench --cp-failover 300                 # the polled control-plane replica SIGKILLed at 5 min
  kvroute-bench --cpu-tier-tokens 2000000 --customers 600  # replicas offload KV to CPU memory;
                                                  # adds kvroute-gpu-only, which ignores that tier

Every table is printed with the workload's reuse ceiling: the cached rate of one
infinite prefix cache every request reaches (each prompt's longest block-aligned prefix
that an earlier request sent, up to prompt-1 tokens), whatever the routing. A
comparison also prints the pooled LRU: the cached rate of one LRU prefix cache as large
as the fleet's KV memory (GPU pools and CPU tiers), every request reaching it in arrival
order. Where the cache binds it is what perfect affinity keeps, and a policy far below
it copies prefixes or evicts the ones that come back; it is not a bound (engines also
cache outputs and keep what running requests hold).

oracle is kvroute's own rule fed every engine's exact GPU prefix cache, queued
prefill tokens and load (busy fraction, running requests) at the moment of each decision. kvroute's distance from it measures
kvroute's information pipeline (reports, KV events, scrapes, table polls), not the rule;
it is not an upper bound on routing: another rule can beat it.

Every comparison ends with kvroute's yardstick: each figure (cached rate, TTFT p50,
p95, p99, end-to-end p50) over the best other policy's on that figure, the oracle and
kvroute's variants not counted, starred where it is off the bound docs/performance.md
holds kvroute to (cached at least 0.97x, TTFT p50 and end-to-end at most 1.05x, p95
1.0x, p99 1.1x). --seeds A:B runs the comparison once per seed and adds each figure's
geometric mean over the seeds and how many figures are within their bounds.

A trace (--trace) has the rate it was recorded at; other rates replay it with its
timestamps divided by a speedup (--speedup, or rate / the trace's rate).

Durations take Go's form (500ms, 2m) or a bare number in the unit the flag names.`,
}

func main() { os.Exit(cli.Exit(command, run(os.Args[1:], os.Stdout, os.Stderr), os.Stderr)) }

// faultFlag collects AT[:REPLICA] values.
type faultFlag struct {
	kind   sim.FaultKind
	faults *[]sim.Fault
}

func (f faultFlag) String() string { return "" }

func (f faultFlag) Set(v string) error {
	at, rep, hasRep := strings.Cut(v, ":")
	d, err := parseDuration(at, time.Second)
	if err != nil {
		return err
	}
	r := 0
	if hasRep {
		if r, err = strconv.Atoi(rep); err != nil || r < 0 {
			return fmt.Errorf("replica %q: want a replica index", rep)
		}
	}
	*f.faults = append(*f.faults, sim.Fault{At: d, Kind: f.kind, Replica: r})
	return nil
}

// parseDuration accepts Go durations ("500ms", "2m") or bare numbers in unit.
func parseDuration(s string, unit time.Duration) (time.Duration, error) {
	if v, err := strconv.ParseFloat(s, 64); err == nil {
		return time.Duration(v * float64(unit)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q: want a duration (e.g. 500ms, 2m) or a number", s)
	}
	return d, nil
}

// outageFlag parses AT:DURATION.
type outageFlag struct{ o *kvroute.Outage }

func (f outageFlag) String() string { return "" }

func (f outageFlag) Set(v string) error {
	at, dur, ok := strings.Cut(v, ":")
	if !ok {
		return fmt.Errorf("%q: want AT:DURATION", v)
	}
	a, err := parseDuration(at, time.Second)
	if err != nil {
		return err
	}
	d, err := parseDuration(dur, time.Second)
	if err != nil {
		return err
	}
	if a < 0 || d <= 0 {
		return fmt.Errorf("%q: AT must not be negative and DURATION must be positive", v)
	}
	*f.o = kvroute.Outage{At: a, Duration: d}
	return nil
}

type durFlag struct {
	d    *time.Duration
	unit time.Duration
}

func (f durFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f durFlag) Set(s string) error {
	d, err := parseDuration(s, f.unit)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(command, help, stdout)
	o := fleet.DefaultOptions()
	if o.KVRoute.Index.SpecTTL == 0 {
		o.KVRoute.Index.SpecTTL = 60 * time.Second // the control plane's default, shown in --help
	}
	seed := workload.DefaultSeed()
	gsp := workload.DefaultGSP()
	mt := workload.DefaultMultiturn()
	agent := workload.DefaultAgent()
	burst := workload.DefaultBurst()
	var outage kvroute.Outage
	var failoverAt time.Duration
	var noLocal bool
	cpuLoad := 3280 * time.Nanosecond

	var (
		wl          = fs.String("workload", "seed", "workload: seed, gsp, multiturn, agent or burst (see --trace for Mooncake)")
		trace       = fs.String("trace", "", "replay a trace file instead of a generated workload")
		traceFormat = fs.String("trace-format", "mooncake", "trace format (mooncake: JSONL with timestamp ms, input_length, output_length, hash_ids of 512-token blocks)")
		speedup     = fs.Float64("speedup", 1, "--trace: divide the trace's timestamps by this (a trace's rate is a time compression; --rate, --find-rate and --sweep-rate set it from requests per second)")
		profile     = fs.String("profile", "seed000", "replica timing profile: seed000 (Llama 3.3 70B FP8, TP=2 H200) or fast")
		policies    = fs.String("policies", "all", "comma-separated policies: "+strings.Join(fleet.Policies, ",")+" (all), and kvroute-wasm (the compiled filter; also with --wasm)")
		rate        = fs.Float64("rate", 0, "requests per second, where --find-rate starts (unset: the workload's: seed 40, gsp 8, multiturn and agent 10, burst --burst-rate x --burst-size; with --trace, the trace's timestamps are divided to give this rate, instead of --speedup)")
		duration    = seed.Duration
		hot         = fs.Bool("hot", false, "seed: one customer sends --hot-share of the traffic")
		memory      = fs.Bool("memory", false, "also print how each policy leaves the replicas' KV memory: usage, free blocks, running and waiting requests, the cached prefixes evicted while their requests waited, and the evicted blocks stored again within 5 minutes (docs/performance.md)")
		hotShare    = fs.Float64("hot-share", 0.10, "seed: the hot customer's share with --hot")
		shared      = fs.Float64("shared-fraction", 0.75, "seed: the customer prefix's share of each prompt (docs/rule.md: 6,000 of 8,000 tokens)")
		jsonPath    = fs.String("json", "", "also write the results as JSON to this file")
		outcomes    = fs.String("requests-csv", "", "also write every request of every policy to this CSV file: arrival, replica, prompt and cached tokens (at routing and at admission), the tokens an earlier request could have given it and which one, TTFT, end-to-end, spill, preemptions (sizes and times only; docs/performance.md)")
		plotPath    = fs.String("plot", "", "also draw the results to this .svg (or .png, .pdf): each policy's TTFT distribution (an empirical CDF, log time axis); with --find-replicas, TTFT p95 against replicas per policy; with --sweep-rate, TTFT p50, p95 and cached rate against the rate")
		find        = fs.Bool("find-replicas", false, "search, per policy, the fewest replicas that hold --slo-ttft-p95")
		findRate    = fs.Bool("find-rate", false, "search, per policy, the highest rate (req/s) that --replicas hold at --slo-ttft-p95: from --rate, doubling or halving, then bisecting to --rate-resolution")
		rateRes     = fs.String("rate-resolution", "2%", "with --find-rate: stop when the rate held and the lowest rate missed are this close: requests per second (0.5) or a percentage of the rate held (2%)")
		seeds       = fs.String("seeds", "", "A:B: run the comparison once for each seed from A to B, print each table, then kvroute's yardstick per seed, each figure's geometric mean and the bounds met (not with --seed)")
		policySeeds = fs.String("policy-seeds", "", "A:B: as --seeds, but on --seed's arrivals, once for each --policy-seed from A to B: the figures over draws of the ties")
		sweepRate   = fs.String("sweep-rate", "", "A:B:STEP: run every policy at each rate from A to B requests per second (with --trace, by compressing time); with --plot, draw TTFT p50, p95 and cached rate against the rate")
		slo         = 1 * time.Second
		stale       time.Duration
		stride      = fs.Int("stride", 4, "kvroute: table checkpoint stride (blocks per key)")
		tieEps      = fs.Float64("tie-epsilon", o.KVRoute.Rule.TieEpsilon, "kvroute and oracle: near-tie fraction broken at random")
		wasm        = fs.Bool("wasm", false, "also run kvroute through the compiled filter (bin/kvroute.wasm's code, built from this checkout) on the wasm host: policy kvroute-wasm")
		cpuprofile  = fs.String("cpuprofile", "", "write a CPU profile here")
		classes     = fs.Bool("classes", false, "mixed senders with priority classes (docs/overload.md): interactive (critical), team and a noisy tenant (standard), batch (sheddable); results by class and tenant")
		shed        = fs.Bool("shed", true, "with --classes: kvroute's filter has the classes and sheds past capacity (false: it admits everything, as without classes)")
	)
	fs.IntVar(&o.Replicas, "replicas", o.Replicas, "replicas (the starting point with --find-replicas)")
	fs.Var(durFlag{&duration, time.Second}, "duration", "seed, multiturn and agent: arrivals span (seconds or a duration)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "random seed: arrivals, texts, tie breaks")
	fs.Uint64Var(&o.PolicySeed, "policy-seed", 0, "when not 0, seeds the policies' tie breaks (and kvroute's timer phases) instead of --seed: the same arrivals routed with another draw of the ties")
	fs.IntVar(&seed.Customers, "customers", seed.Customers, "seed: distinct customer prefixes")
	fs.IntVar(&seed.PromptTokens, "prompt-tokens", seed.PromptTokens, "seed: prompt length in tokens")
	fs.IntVar(&seed.OutputTokens, "output-tokens", seed.OutputTokens, "seed: output tokens")
	fs.IntVar(&gsp.Groups, "gsp-groups", gsp.Groups, "gsp: groups")
	fs.IntVar(&gsp.PromptsPerGroup, "gsp-prompts-per-group", gsp.PromptsPerGroup, "gsp: prompts per group")
	fs.IntVar(&gsp.SystemTokens, "gsp-system-prompt-len", gsp.SystemTokens, "gsp: system prompt tokens")
	fs.IntVar(&gsp.QuestionTokens, "gsp-question-len", gsp.QuestionTokens, "gsp: question tokens")
	fs.IntVar(&gsp.OutputTokens, "gsp-output-len", gsp.OutputTokens, "gsp: output tokens")
	fs.IntVar(&burst.Size, "burst-size", burst.Size, "burst: requests per group (N)")
	fs.Float64Var(&burst.GroupRate, "burst-rate", burst.GroupRate, "burst: groups per second")
	fs.Var(durFlag{&burst.Spread, time.Millisecond}, "burst-spread", "burst: a group's requests arrive within this of its start (ms or a duration)")
	fs.IntVar(&burst.PrefixTokens, "burst-prefix-tokens", burst.PrefixTokens, "burst: each group's new shared prefix, in tokens")
	fs.IntVar(&burst.QuestionTokens, "burst-question-tokens", burst.QuestionTokens, "burst: each request's own part, in tokens")
	fs.IntVar(&burst.OutputTokens, "burst-output-tokens", burst.OutputTokens, "burst: output tokens")
	var fairHold time.Duration
	fs.Var(durFlag{&fairHold, time.Millisecond}, "fairness-hold", "with --classes: overload.fairness_hold_ms, how long tenants are held to their shares after the fleet was last saturated (ms or a duration; 0: only while it is)")
	fs.Var(durFlag{&burst.Duration, time.Second}, "burst-duration", "burst: groups start within this (seconds or a duration)")
	fs.Var(durFlag{&failoverAt, time.Second}, "cp-failover", "AT (seconds or a duration): the control-plane replica kvroute's proxies poll is SIGKILLed at AT and another replica takes over (docs/controlplane.md, \"Replicas\"): no table for one poll interval, no report lost; results are also split before/during/after")
	fs.Var(outageFlag{&outage}, "cp-outage", "AT:DURATION (seconds or durations): kvroute's proxies receive no table and lose every report from AT for DURATION; results are also split before/during/after")
	fs.IntVar(&mt.Turns, "turns", mt.Turns, "multiturn and agent: turns per session (agent: 8)")
	fs.Var(durFlag{&mt.Think, time.Second}, "think", "multiturn and agent: time between a session's turns (agent: 15 s)")
	fs.IntVar(&mt.Apps, "apps", mt.Apps, "multiturn and agent: distinct system prompts")
	fs.Float64Var(&agent.MessagesShare, "messages-share", agent.MessagesShare, "agent: share of sessions on the Messages API (resending the history); the rest are Responses follow-ups by previous_response_id")
	fs.IntVar(&o.Routers, "routers", o.Routers, "independent proxies, each with its own ledger and table (requests spread uniformly); the other policies get as many routers, each with its own state, except weighted-scorers, whose endpoint picker is one service")
	fs.Var(durFlag{&stale, time.Millisecond}, "stale", "kvroute: the table each proxy receives is this old (ms or a duration)")
	fs.Var(faultFlag{sim.Kill, &o.Faults}, "kill-replica", "AT[:REPLICA]: the replica (default 0) dies at AT (seconds or a duration); repeatable")
	fs.Var(faultFlag{sim.Restart, &o.Faults}, "restart-replica", "AT[:REPLICA]: the replica restarts with an empty cache at AT; repeatable")
	fs.Var(durFlag{&slo, time.Second}, "slo-ttft-p95", "with --find-replicas or --find-rate: the TTFT p95 bound (seconds or a duration)")
	fs.Var(durFlag{&o.Warmup, time.Second}, "warmup", "requests arriving before this are not measured")
	fs.BoolVar(&o.Stream, "stream", o.Stream, "clients stream (response headers reach the proxy when the engine accepts the request)")
	fs.Float64Var(&o.OracleUncachedWeight, "oracle-uncached-weight", 1, "oracle only, an experiment: score queued + w x uncached tokens (w > 1 spills later)")
	fs.StringVar(&o.WasmPath, "wasm-path", "", "with --wasm: the filter module to load (default: built from filter/)")
	fs.IntVar(&o.Parallel, "parallel", runtime.GOMAXPROCS(0), "simulations run at once")
	fs.BoolVar(&o.KVRoute.AgeFromGeneration, "age-from-generation", true, "kvroute: date the table from its version's generation, as the filter does (false: from the poll's return, the filter's earlier behaviour)")
	fs.Var(durFlag{&o.KVRoute.PublishInterval, time.Millisecond}, "publish-interval", "kvroute: control plane table publish interval")
	fs.Var(durFlag{&o.KVRoute.ScrapeInterval, time.Millisecond}, "scrape-interval", "kvroute: control plane scrape interval")
	fs.BoolVar(&o.KVRoute.StockMetrics, "stock-metrics", false, "kvroute: the engines export vLLM's metrics only, without kvroute:queued_prefill_tokens; the control plane counts queued prefill from the proxies' placement and start reports")
	fs.Var(durFlag{&o.KVRoute.ScrapeLatency, time.Millisecond}, "scrape-latency", "kvroute: the engines take their numbers this long after the control plane sends a scrape, which dates their queue by the stamp on their queued-tokens gauge and the rest (and, with --stock-metrics, the queue) at the send (ms or a duration)")
	fs.Var(durFlag{&o.KVRoute.PollInterval, time.Millisecond}, "poll-interval", "kvroute: proxy table poll interval")
	fs.Var(durFlag{&o.KVRoute.Wait, time.Millisecond}, "poll-wait", "kvroute: the leader's long poll, the filter's control_plane.wait_ms: each version reaches the proxies when it is published (--stale later), a 304 after this long without one (0: a poll every --poll-interval)")
	fs.Var(durFlag{&o.KVRoute.ReportInterval, time.Millisecond}, "report-interval", "kvroute: proxy report post interval (the control plane dates queues counted from start reports twice this far back: --report-lag)")
	fs.Var(durFlag{&o.KVRoute.Index.SpecTTL, time.Second}, "spec-ttl", "kvroute: speculative placement entries' TTL, as the control plane's --spec-ttl (seconds or a duration)")
	fs.Float64Var(&o.KVRoute.Rule.MaxKVUsage, "max-kv-usage", o.KVRoute.Rule.MaxKVUsage, "kvroute and oracle: exclude replicas above this KV usage (1 disables the guard)")
	fs.Var(durFlag{&o.KVRoute.Rule.MaxStateAge, time.Millisecond}, "max-state-age", "kvroute and oracle: exclude replicas whose state is older")
	fs.Var(durFlag{&o.KVRoute.Rule.MaxCacheAge, time.Second}, "max-cache-age", "kvroute: past --max-state-age, route on cached prefixes and the proxy's own load until the state is this old (0: cache-blind least-queued at once)")
	fs.IntVar(&o.CPUTierTokens, "cpu-tier-tokens", 0, "every replica keeps this many tokens of KV in CPU memory (vLLM's OffloadingConnector, LRU) and loads hits from there; adds policy "+fleet.GPUOnlyName+" (kvroute reading GPU holders only) and a GPU/CPU hit split")
	fs.Var(durFlag{&cpuLoad, time.Microsecond}, "cpu-load-per-token", "with --cpu-tier-tokens: what loading a token back costs (us or a duration; 3.28 us: docs/rule.md)")
	fs.BoolVar(&o.KVRoute.LedgerStarts, "ledger-starts", true, "kvroute: the proxy records each request's first response byte as its start and takes its tokens off a queue snapshot measured before it (false: drops the ledger entry there)")
	fs.BoolVar(&noLocal, "no-local-placements", false, "kvroute: do not match the proxy's own recent placements")
	fs.BoolVar(&o.KVRoute.NoHomes, "no-homes", false, "kvroute: do not credit a prefix's home, the replica that held it last, where the table lists none of it (table format 4)")
	fs.BoolVar(&o.PinTenants, "pin-tenants", false, "with --routers: each tenant's requests reach one proxy (its own ingress) instead of any")
	fs.BoolVar(&o.KVRoute.SharesPerProxy, "shares-per-proxy", false, "kvroute with --classes: each proxy holds tenants to their shares of its own admitted prefill (no shares exchanged through the control plane)")
	fs.BoolVar(&o.KVRoute.AffinityPerProxy, "affinity-per-proxy", false, "kvroute: each proxy follows only the Responses answers it forwarded itself (no affinity shared through the control plane)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	names, err := fleet.ParsePolicies(*policies)
	if err != nil {
		return &cli.UsageError{Err: err}
	}
	var plotFormat string
	if *plotPath != "" {
		if plotFormat, err = fleet.PlotFormat(*plotPath); err != nil {
			return &cli.UsageError{Err: fmt.Errorf("--plot %w", err)}
		}
	}
	if *wasm && !slices.Contains(names, kvroute.WasmName) {
		names = append(names, kvroute.WasmName)
	}
	if o.CPUTierTokens < 0 || cpuLoad < 0 {
		return &cli.UsageError{Err: fmt.Errorf("--cpu-tier-tokens %d and --cpu-load-per-token %v must not be negative", o.CPUTierTokens, cpuLoad)}
	}
	o.CPULoadPerToken = cpuLoad
	if o.CPUTierTokens > 0 && slices.Contains(names, "kvroute") && !slices.Contains(names, fleet.GPUOnlyName) {
		i := slices.Index(names, "kvroute")
		names = slices.Insert(slices.Clone(names), i+1, fleet.GPUOnlyName)
	}
	if o.Profile, err = timing.ByName(*profile); err != nil {
		return &cli.UsageError{Err: err}
	}
	o.KVRoute.Stale = stale
	o.KVRoute.NoLocal = noLocal
	o.KVRoute.Index.Stride = *stride
	o.KVRoute.Rule.TieEpsilon = *tieEps

	wf := workloadFlags{name: *wl, trace: *trace, format: *traceFormat, rate: *rate, speedup: *speedup, duration: duration,
		hot: *hot, hotShare: *hotShare, shared: *shared, seed: seed, gsp: gsp, mt: mt, agent: agent, burst: burst}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) {
		set[f.Name] = true
		switch f.Name {
		case "rate":
			wf.rateSet = *rate != 0 // 0 stands for the workload's own
		case "speedup":
			wf.speedupSet = true
		case "burst-rate":
			wf.burstRateSet = true
		case "turns":
			wf.agent.Turns = mt.Turns
		case "think":
			wf.agent.Think = mt.Think
		case "apps":
			wf.agent.Apps = mt.Apps
		}
	})
	if *classes {
		ov := fleet.MixedOverload(o.Profile.PrefillSecondsPerToken())
		ov.FairnessHoldMs = int(fairHold / time.Millisecond)
		o.ClassBudgets = fleet.Budgets(&ov)
		if *shed {
			o.KVRoute.Filter.Overload = ov
		}
	}
	// build is the workload of o.Seed (--seeds builds one per seed).
	build := func(o fleet.Options) (fleet.Load, string, workload.Workload, error) {
		load, label, err := wf.load(o)
		if err != nil {
			return load, label, nil, err
		}
		if *classes {
			at, seed := load.At, o.Seed
			load.At = func(rate float64) (workload.Workload, error) {
				w, err := at(rate)
				if err != nil {
					return nil, err
				}
				return workload.NewMixed(w, workload.DefaultParts(), seed)
			}
		}
		w, err := load.At(load.Rate)
		if err != nil {
			return load, label, nil, &cli.UsageError{Err: err}
		}
		return load, label, w, nil
	}
	var seedList []uint64
	drawTies := *policySeeds != "" // --policy-seeds: seedList are policy seeds
	switch {
	case *seeds != "" && drawTies:
		return cli.Usagef("--seeds and --policy-seeds: give one")
	case drawTies:
		if seedList, err = parseSeeds(*policySeeds); err != nil {
			return cli.Usagef("--policy-seeds %w", err)
		}
		if set["policy-seed"] {
			return cli.Usagef("--policy-seeds and --policy-seed: give one")
		}
	case *seeds != "":
		if seedList, err = parseSeeds(*seeds); err != nil {
			return cli.Usagef("--seeds %w", err)
		}
		if set["seed"] {
			return cli.Usagef("--seeds and --seed: give one")
		}
		o.Seed = seedList[0]
	}
	load, label, w, err := build(o)
	if err != nil {
		return err
	}
	if err := checkModes(*find, *findRate, *sweepRate != "", *plotPath != "", *outcomes != ""); err != nil {
		return err
	}
	if seedList != nil && (*find || *findRate || *sweepRate != "" || *plotPath != "" || *outcomes != "" || *memory) {
		return cli.Usagef("--seeds and --policy-seeds print each seed's table and the yardstick: not with --find-replicas, --find-rate, --sweep-rate, --plot, --requests-csv or --memory")
	}
	o.Outcomes = *outcomes != ""
	o.Evictions = *memory // the "stored again" column
	var rates []float64
	if *sweepRate != "" {
		if rates, err = fleet.ParseSweep(*sweepRate); err != nil {
			return cli.Usagef("--sweep-rate %w", err)
		}
	}
	resolution, err := fleet.ParseResolution(*rateRes)
	if err != nil {
		return cli.Usagef("--rate-resolution %w", err)
	}
	if failoverAt > 0 {
		if outage.Duration > 0 {
			return cli.Usagef("--cp-failover and --cp-outage: one control-plane fault at a time")
		}
		outage = kvroute.FailoverOutage(failoverAt, o.KVRoute)
	}
	if outage.Duration > 0 {
		o.KVRoute.Outages = append(o.KVRoute.Outages, outage)
		end := outage.At + outage.Duration
		name := "outage"
		if outage.Failover {
			name = "failover"
		}
		o.Phases = []sim.Phase{{Name: "before", From: o.Warmup, To: outage.At}, {Name: name, From: outage.At, To: end},
			{Name: "next 60s", From: end, To: end + time.Minute}, {Name: "later", From: end + time.Minute, To: time.Duration(math.MaxInt64)}}
	}
	if *hot && w.Name() == "seed" {
		o.HotGroup = 0
	}

	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	fmt.Fprintf(stdout, "workload  %s\n", w.Describe())
	if load.TraceRate > 0 {
		fmt.Fprintf(stdout, "          the trace's rate: %.4g req/s at speedup 1; a rate R replays it at speedup R / %.4g\n", load.TraceRate, load.TraceRate)
	}
	fmt.Fprintf(stdout, "fleet     %s profile (TP=%d), %d routers, stream %v", o.Profile.Name, o.Profile.GPUs, o.Routers, o.Stream)
	if stale > 0 {
		fmt.Fprintf(stdout, ", tables %v stale", stale)
	}
	for _, f := range o.Faults {
		fmt.Fprintf(stdout, ", %s replica %d at %v", f.Kind, f.Replica, f.At)
	}
	switch {
	case outage.Failover:
		fmt.Fprintf(stdout, ", kvroute's control-plane replica killed at %v (the other takes over in %v)", outage.At, outage.Duration)
	case outage.Duration > 0:
		fmt.Fprintf(stdout, ", control plane unreachable for kvroute from %v for %v", outage.At, outage.Duration)
	}
	if o.CPUTierTokens > 0 {
		fmt.Fprintf(stdout, ", CPU tier %d tokens a replica (%v a token to load)", o.CPUTierTokens, o.CPULoadPerToken)
	}
	if o.PolicySeed != 0 {
		fmt.Fprintf(stdout, ", policy seed %d", o.PolicySeed)
	}
	switch {
	case drawTies:
		fmt.Fprintf(stdout, ", seed %d, %d requests, policy seeds %s\n", o.Seed, w.Len(), *policySeeds)
	case seedList != nil:
		fmt.Fprintf(stdout, ", seeds %s\n", *seeds)
	default:
		fmt.Fprintf(stdout, ", seed %d, %d requests\n", o.Seed, w.Len())
	}
	b := &bench{stdout: stdout, o: o, names: names, load: load, w: w, label: label,
		plotPath: *plotPath, plotFormat: plotFormat, jsonPath: *jsonPath, outcomesPath: *outcomes, memory: *memory, start: time.Now()}
	switch {
	case seedList != nil:
		if drawTies {
			return b.seeds(seedList, nil)
		}
		return b.seeds(seedList, func(o fleet.Options) (workload.Workload, error) {
			_, _, w, err := build(o)
			return w, err
		})
	case *find:
		return b.findReplicas(slo)
	case *findRate:
		return b.findRate(slo, resolution)
	case rates != nil:
		return b.sweep(rates)
	}
	return b.compare(outage.Duration > 0)
}

// checkModes refuses a command line that asks for two kinds of run, or a picture of
// one that has none, before anything runs.
func checkModes(findReplicas, findRate, sweep, plot, outcomes bool) error {
	n := 0
	for _, on := range []bool{findReplicas, findRate, sweep} {
		if on {
			n++
		}
	}
	switch {
	case n > 1:
		return cli.Usagef("--find-replicas, --find-rate and --sweep-rate are different runs: give one")
	case findRate && plot:
		return cli.Usagef("--plot with --find-rate: a rate search has no picture; --sweep-rate --plot draws TTFT and cached rate against the rate")
	case n > 0 && outcomes:
		return cli.Usagef("--requests-csv writes one comparison's requests: not with --find-replicas, --find-rate or --sweep-rate")
	}
	return nil
}

// bench is one command line's run: what every kind of run prints and writes.
type bench struct {
	stdout                         io.Writer
	o                              fleet.Options
	names                          []string
	load                           fleet.Load
	w                              workload.Workload // at load.Rate
	label                          string            // the workload's name in JSON
	plotPath, plotFormat, jsonPath string
	outcomesPath                   string // --requests-csv
	memory                         bool   // --memory: print fleet.WriteMemory's table
	start                          time.Time
}

func (b *bench) ceiling() workload.Ceiling {
	return workload.ReuseCeiling(b.w, b.o.Profile.BlockSize, b.o.Warmup)
}

// ceilings is the reuse ceiling and the pooled LRU over the fleet's KV memory (every
// replica's GPU pool and, with --cpu-tier-tokens, its CPU tier), in one walk of the
// arrivals; kvTokens is that memory in tokens.
func (b *bench) ceilings() (reuse, pooled workload.Ceiling, kvTokens int64) {
	p := b.o.Profile
	blocks := b.o.Replicas * (p.NumGPUBlocks() + b.o.CPUTierTokens/p.BlockSize)
	reuse, pooled = workload.Ceilings(b.w, p.BlockSize, b.o.Warmup, blocks)
	return reuse, pooled, int64(blocks) * int64(p.BlockSize)
}

func (b *bench) compare(phases bool) error {
	o, stdout := b.o, b.stdout
	fmt.Fprintf(stdout, "replicas  %d (%d GPUs)\n\n", o.Replicas, o.Replicas*o.Profile.GPUs)
	results, err := fleet.Compare(b.w, b.names, o)
	if err != nil {
		return err
	}
	if err := fleet.WriteTable(stdout, results); err != nil {
		return err
	}
	if a, ok := fleet.AgainstBest(results, "kvroute"); ok {
		fmt.Fprintln(stdout)
		if err := fleet.WriteAgainst(stdout, &a); err != nil {
			return err
		}
	}
	if phases {
		fmt.Fprintf(stdout, "\nby arrival time (the outage affects kvroute only: the other policies have no separate control plane)\n")
		if err := fleet.WritePhases(stdout, results); err != nil {
			return err
		}
	}
	if o.CPUTierTokens > 0 {
		fmt.Fprintf(stdout, "\ncached prompt tokens by where the engine found them (GPU prefix cache, or loaded from CPU memory)\n")
		if err := fleet.WriteTiers(stdout, results); err != nil {
			return err
		}
	}
	if b.memory {
		fmt.Fprintf(stdout, "\nKV memory per replica, time-averaged (free blocks: held by no request, where prefixes stay cached;\n"+
			"lost waiting: prompt tokens cached on the chosen replica at the decision and evicted before admission)\n")
		if err := fleet.WriteMemory(stdout, results); err != nil {
			return err
		}
	}
	if o.ClassBudgets != nil {
		fmt.Fprintf(stdout, "\nby class (goodput: completed within the budget per second; shed: 429 from kvroute's filter)\n")
		if err := fleet.WriteClasses(stdout, results); err != nil {
			return err
		}
	}
	if err := fleet.WriteFollowUps(stdout, results); err != nil {
		return err
	}
	if o.HotGroup >= 0 {
		fmt.Fprintf(stdout, "\nhot customer (group %d) vs the others\n", o.HotGroup)
		if err := fleet.WriteHot(stdout, results); err != nil {
			return err
		}
	}
	ceiling, pooled, kvTokens := b.ceilings()
	fmt.Fprintf(stdout, "\ncached: cached prompt tokens / prompt tokens; max/mean Q: time-averaged max over mean queued prefill tokens;\n")
	fmt.Fprintf(stdout, "spill: requests not sent to a replica holding the longest cached prefix (engines' real caches).\n")
	if err := fleet.WriteNotes(stdout, b.names, &ceiling); err != nil {
		return err
	}
	if err := fleet.WritePooled(stdout, pooled, kvTokens); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wall %.1f s (%d simulations, %d at a time)\n", time.Since(b.start).Seconds(), len(results), o.Parallel)
	if b.plotPath != "" {
		title := fmt.Sprintf("TTFT per policy at %d replicas (%d GPUs)\n%s", o.Replicas, o.Replicas*o.Profile.GPUs, b.w.Describe())
		if err := writeFile(b.plotPath, func(f io.Writer) error { return fleet.PlotTTFT(f, b.plotFormat, title, results) }); err != nil {
			return err
		}
	}
	if b.outcomesPath != "" {
		reuses := workload.Reuses(b.w, b.o.Profile.BlockSize)
		if err := writeFile(b.outcomesPath, func(f io.Writer) error { return fleet.WriteOutcomes(f, results, reuses) }); err != nil {
			return err
		}
	}
	if b.jsonPath != "" {
		rep := fleet.NewJSONReport(b.label, o.Replicas, results)
		rep.PolicySeed = o.PolicySeed
		v := math.Round(ceiling.Rate*1e6) / 1e6
		rep.ReuseCeiling = &v
		p := math.Round(pooled.Rate*1e6) / 1e6
		rep.PooledLRU = &p
		if b.memory {
			fleet.AddMemory(&rep, results)
		}
		return writeFile(b.jsonPath, func(f io.Writer) error { return fleet.WriteReportJSON(f, rep) })
	}
	return nil
}

// seeds runs the comparison once per seed, each on its own workload (b.w for the first,
// which run built; build for the others), printing each table and kvroute's yardstick,
// then the yardstick over all of them. Without build (--policy-seeds) the seeds are
// policy seeds, each run on b.w, the arrivals of b.o.Seed.
func (b *bench) seeds(seeds []uint64, build func(fleet.Options) (workload.Workload, error)) error {
	o, stdout := b.o, b.stdout
	var runs []fleet.SeedRun
	var reports []fleet.JSONReport
	label, ties := "seed", ""
	if build == nil {
		label = "policy seed"
		ties = fmt.Sprintf("each seed is a policy seed: seed %d's arrivals, routed with that draw of the ties\n", o.Seed)
		fmt.Fprintf(stdout, "\n%s", ties)
	}
	for i, s := range seeds {
		w := b.w
		if build == nil {
			o.PolicySeed = s
		} else {
			o.Seed = s
			if i > 0 {
				var err error
				if w, err = build(o); err != nil {
					return err
				}
			}
		}
		fmt.Fprintf(stdout, "\n%s %d: %d requests, %d replicas (%d GPUs)\n", label, s, w.Len(), o.Replicas, o.Replicas*o.Profile.GPUs)
		results, err := fleet.Compare(w, b.names, o)
		if err != nil {
			return err
		}
		if err := fleet.WriteTable(stdout, results); err != nil {
			return err
		}
		rep := fleet.NewJSONReport(b.label, o.Replicas, results)
		rep.Seed, rep.PolicySeed = o.Seed, o.PolicySeed
		reports = append(reports, rep)
		if a, ok := fleet.AgainstBest(results, "kvroute"); ok {
			runs = append(runs, fleet.SeedRun{Seed: s, Against: a, Policies: fleet.AllFigures(results)})
		}
	}
	if len(runs) > 0 {
		fmt.Fprintf(stdout, "\n%s\n%s", fleet.YardstickNote(), ties)
		if err := fleet.WriteSeeds(stdout, runs); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "wall %.1f s\n", time.Since(b.start).Seconds())
	if b.jsonPath != "" {
		return writeFile(b.jsonPath, func(f io.Writer) error { return fleet.WriteSeedsJSON(f, reports, runs) })
	}
	return nil
}

// parseSeeds parses --seeds A:B, the seeds from A to B.
func parseSeeds(v string) ([]uint64, error) {
	a, b, ok := strings.Cut(v, ":")
	if !ok {
		return nil, fmt.Errorf("%q: want A:B, the first and last seed", v)
	}
	from, err1 := strconv.ParseUint(a, 10, 64)
	to, err2 := strconv.ParseUint(b, 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("%q: %w", v, err)
	}
	if to < from || to-from >= maxSeeds {
		return nil, fmt.Errorf("%q: want A <= B and at most %d seeds", v, maxSeeds)
	}
	var out []uint64
	for s := from; ; s++ {
		out = append(out, s)
		if s == to {
			return out, nil
		}
	}
}

// maxSeeds bounds --seeds: each seed is a whole comparison.
const maxSeeds = 100

func (b *bench) findReplicas(slo time.Duration) error {
	o, stdout := b.o, b.stdout
	fmt.Fprintf(stdout, "search    fewest replicas with TTFT p95 <= %.3g s (GPUs = replicas x %d)\n\n", slo.Seconds(), o.Profile.GPUs)
	searches, err := fleet.FindReplicas(b.w, b.names, o, slo, 0.95)
	if err != nil {
		return err
	}
	if err := fleet.WriteSearch(stdout, searches, slo); err != nil {
		return err
	}
	ceiling := b.ceiling()
	fmt.Fprintln(stdout)
	if err := fleet.WriteNotes(stdout, b.names, &ceiling); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wall %.1f s\n", time.Since(b.start).Seconds())
	if b.plotPath != "" {
		title := fmt.Sprintf("Fewest replicas for TTFT p95 ≤ %s s (GPUs = replicas x %d)\n%s", strconv.FormatFloat(slo.Seconds(), 'g', 4, 64), o.Profile.GPUs, b.w.Describe())
		if err := writeFile(b.plotPath, func(f io.Writer) error {
			return fleet.PlotSearch(f, b.plotFormat, title, searches, slo, "p95")
		}); err != nil {
			return err
		}
	}
	if b.jsonPath != "" {
		return writeFile(b.jsonPath, func(f io.Writer) error { return fleet.WriteSearchJSON(f, b.label, slo, ceiling, searches) })
	}
	return nil
}

func (b *bench) findRate(slo time.Duration, res fleet.Resolution) error {
	o, stdout := b.o, b.stdout
	fmt.Fprintf(stdout, "search    highest rate with TTFT p95 <= %.3g s at %d replicas (%d GPUs), from %.4g req/s to within %s",
		slo.Seconds(), o.Replicas, o.Replicas*o.Profile.GPUs, b.load.Rate, res)
	if b.load.TraceRate > 0 {
		fmt.Fprintf(stdout, " (the trace's timestamps divided by rate / %.4g)", b.load.TraceRate)
	}
	fmt.Fprintf(stdout, "\n\n")
	searches, err := fleet.FindRate(b.load, b.names, o, slo, 0.95, res)
	if err != nil {
		return err
	}
	if err := fleet.WriteRateSearch(stdout, b.load, searches); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "\nrate held: the highest rate run that held the SLO (>=: still held at the search's cap); misses at: the\n"+
		"lowest that did not; TTFT p95, cached and ceiling: at the rate held.\n")
	if err := fleet.WriteNotes(stdout, b.names, nil); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wall %.1f s\n", time.Since(b.start).Seconds())
	if b.jsonPath != "" {
		return writeFile(b.jsonPath, func(f io.Writer) error {
			return fleet.WriteRateSearchJSON(f, b.label, o.Replicas, slo, res, b.load, searches)
		})
	}
	return nil
}

func (b *bench) sweep(rates []float64) error {
	o, stdout := b.o, b.stdout
	fmt.Fprintf(stdout, "sweep     %d rates from %.4g to %.4g req/s at %d replicas (%d GPUs), every policy at each\n\n",
		len(rates), rates[0], rates[len(rates)-1], o.Replicas, o.Replicas*o.Profile.GPUs)
	points, err := fleet.Sweep(b.load, b.names, o, rates)
	if err != nil {
		return err
	}
	if err := fleet.WriteSweep(stdout, b.load, points); err != nil {
		return err
	}
	for _, p := range points {
		if o.ClassBudgets == nil {
			break
		}
		fmt.Fprintf(stdout, "\nat %.4g req/s, by class (goodput: completed within the budget per second; shed: 429 from kvroute's filter)\n", p.Rate)
		if err := fleet.WriteClasses(stdout, p.Results); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\ncached: cached prompt tokens / prompt tokens.\n")
	if err := fleet.WriteNotes(stdout, b.names, nil); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wall %.1f s (%d simulations, %d at a time)\n", time.Since(b.start).Seconds(), len(rates)*len(b.names), o.Parallel)
	if b.plotPath != "" {
		title := fmt.Sprintf("TTFT and cached rate against offered load at %d replicas (%d GPUs)\n%s\nthe x axis replaces the rate above", o.Replicas, o.Replicas*o.Profile.GPUs, b.w.Describe())
		if b.load.TraceRate > 0 {
			title += fmt.Sprintf(": the trace's timestamps divided by rate / %.4g req/s", b.load.TraceRate)
		}
		if err := writeFile(b.plotPath, func(f io.Writer) error { return fleet.PlotSweep(f, b.plotFormat, title, points) }); err != nil {
			return err
		}
	}
	if b.jsonPath != "" {
		return writeFile(b.jsonPath, func(f io.Writer) error { return fleet.WriteSweepJSON(f, b.label, o.Replicas, b.load, points) })
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// workloadFlags are the flags that choose and shape the workload.
type workloadFlags struct {
	name, trace, format string
	// rate and speedup are --rate and --speedup; rateSet, speedupSet and burstRateSet
	// say whether the command line gave them.
	rate, speedup                     float64
	rateSet, speedupSet, burstRateSet bool
	duration                          time.Duration
	hot                               bool
	hotShare, shared                  float64
	seed                              workload.SeedConfig
	gsp                               workload.GSPConfig
	mt                                workload.MultiturnConfig
	agent                             workload.AgentConfig
	burst                             workload.BurstConfig
}

// load returns the workload as a function of its rate, that rate as the flags set it,
// and the workload's label for JSON. A bad flag is a *cli.UsageError; a trace that
// cannot be read is not.
func (f workloadFlags) load(o fleet.Options) (fleet.Load, string, error) {
	bs := o.Profile.BlockSize
	if f.trace != "" {
		if f.format != "mooncake" {
			return fleet.Load{}, "", cli.Usagef("--trace-format %q: only mooncake is supported", f.format)
		}
		if f.rateSet && f.speedupSet {
			return fleet.Load{}, "", cli.Usagef("--rate %g and --speedup %g: a trace's rate is its speedup, give one", f.rate, f.speedup)
		}
		m, err := workload.LoadMooncake(workload.MooncakeConfig{Path: f.trace, Speedup: 1, Seed: o.Seed, BlockSize: bs})
		if err != nil {
			return fleet.Load{}, "", err
		}
		l := fleet.Load{TraceRate: m.Rate(), Rate: f.rate}
		if l.TraceRate <= 0 {
			return fleet.Load{}, "", fmt.Errorf("%s: every request arrives at once: the trace has no rate to compress", f.trace)
		}
		if !f.rateSet {
			if f.speedup <= 0 {
				return fleet.Load{}, "", cli.Usagef("--speedup %g must be positive", f.speedup)
			}
			l.Rate = f.speedup * l.TraceRate
		}
		l.At = func(rate float64) (workload.Workload, error) { return m.WithSpeedup(l.Speedup(rate)) }
		return l, "mooncake", nil
	}
	if f.rateSet && f.rate <= 0 {
		return fleet.Load{}, "", cli.Usagef("--rate %g must be positive", f.rate)
	}
	var l fleet.Load
	label := f.name
	switch f.name {
	case "seed":
		c := f.seed
		c.Seed, c.BlockSize, c.Duration = o.Seed, bs, f.duration
		if f.shared < 0 || f.shared > 1 {
			return l, "", cli.Usagef("--shared-fraction %g outside [0, 1]", f.shared)
		}
		c.PrefixTokens = int(f.shared*float64(c.PromptTokens) + 0.5)
		if f.hot {
			c.Hot = f.hotShare
			label = "seed --hot"
		}
		l.Rate = c.Rate
		l.At = func(rate float64) (workload.Workload, error) { at := c; at.Rate = rate; return workload.NewSeed(at) }
	case "gsp":
		c := f.gsp
		c.Seed, c.BlockSize = o.Seed, bs
		l.Rate = c.Rate
		l.At = func(rate float64) (workload.Workload, error) { at := c; at.Rate = rate; return workload.NewGSP(at) }
	case "multiturn":
		c := f.mt
		c.Seed, c.BlockSize, c.Duration = o.Seed, bs, f.duration
		l.Rate = c.Rate
		l.At = func(rate float64) (workload.Workload, error) {
			at := c
			at.Rate = rate
			return workload.NewMultiturn(at)
		}
	case "agent":
		c := f.agent
		c.Seed, c.BlockSize, c.Duration, l.Rate = o.Seed, bs, f.duration, c.Rate
		l.At = func(rate float64) (workload.Workload, error) { at := c; at.Rate = rate; return workload.NewAgent(at) }
	case "burst":
		if f.rateSet && f.burstRateSet {
			return l, "", cli.Usagef("--rate and --burst-rate: give one (burst requests per second are groups per second x --burst-size)")
		}
		c := f.burst
		c.Seed, c.BlockSize = o.Seed, bs
		size := float64(max(c.Size, 1))
		l.Rate = c.GroupRate * size
		l.At = func(rate float64) (workload.Workload, error) {
			at := c
			at.GroupRate = rate / size
			return workload.NewBurst(at)
		}
	default:
		return l, "", cli.Usagef("--workload %q: want seed, gsp, multiturn, agent or burst", f.name)
	}
	if f.rateSet {
		l.Rate = f.rate
	}
	return l, label, nil
}
