package index

import (
	"bufio"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/kvroute/kvroute/controlplane/kvevents"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
)

// End-to-end KV-event ingest: engines' PUB sockets over loopback, the real
// kvevents.Subscribe per engine (go-zeromq SUB, decode, sequence tracking) and the
// index. The engines are go-zeromq publishers in a child process (this test binary
// re-run as TestIngestPublisherProcess), so the control plane's process has only the
// subscriber's work and its GOMAXPROCS (-cpu 1,2) bounds that; the publisher's own
// CPU is on the same 2 cores, so wall-clock rates on 2 cores are a lower bound.
//
// Each message is one scheduler step of vLLM's EventBatch (encoded by the engine
// simulator's independent encoder, -layout map = vLLM >= 0.24, array = 0.23): 8
// requests, each storing 32 new 16-token blocks after a 96-block chain stored earlier
// and evicting 32 blocks, so the index stays at steady state. Reported: blocks stored
// per second of wall clock, and per second of the control plane process's CPU
// (getrusage: the per-core cost, less sensitive to the shared machine's noise); the
// cores the control plane and the publisher process used, and the machine's idle cores
// (/proc/stat): on 2 cores the publisher's sends over loopback take about 0.3 cores and
// the machine is idle about 0.05, so the control plane gets what is left, about 1.6.
// -ingest.steps makes a run longer (400 steps, about 870,000 blocks: 0.2 s on 2 cores).
//
//	go test ./controlplane/index -run '^$' -bench IngestEndToEnd -cpu 1,2 -benchtime 1x [-args -ingest.steps 2400]
func BenchmarkIngestEndToEnd(b *testing.B) { benchIngestEndToEnd(b, false) }

var ingestSteps = flag.Int("ingest.steps", 400, "BenchmarkIngestEndToEnd/IngestBind: scheduler steps per engine in a run (256 blocks each)")

// The same with the control plane's socket bound (--kv-bind) and the engines
// connecting to it: one SUB socket for every engine, each stream applied by its own
// goroutine (kvevents.Listen).
//
//	go test ./controlplane/index -run '^$' -bench IngestBind -cpu 1,2 -benchtime 1x
func BenchmarkIngestBind(b *testing.B) { benchIngestEndToEnd(b, true) }

func benchIngestEndToEnd(b *testing.B, bind bool) {
	for _, layout := range []sim.Encoding{sim.Map, sim.Array} {
		for _, engines := range []int{8} {
			b.Run(fmt.Sprintf("layout=%s/engines=%d", layout, engines), func(b *testing.B) {
				var blocks, wall, cpu, pub, idle float64
				for range b.N {
					bl, w, c, p, i := ingestEndToEnd(b, layout, engines, *ingestSteps, bind)
					blocks, wall, cpu, pub, idle = blocks+bl, wall+w, cpu+c, pub+p, idle+i
				}
				b.ReportMetric(blocks/wall, "blocks/s")
				b.ReportMetric(blocks/cpu, "blocks/cpu-s")
				b.ReportMetric(cpu/wall, "cores")
				b.ReportMetric(pub/wall, "publisher-cores")
				if idle >= 0 {
					b.ReportMetric(idle/wall, "idle-cores")
				}
			})
		}
	}
}

const (
	e2eReqs    = 8  // requests per scheduler step
	e2ePerReq  = 32 // blocks each stores (and evicts)
	e2eChains  = 64 // distinct chains per engine
	e2eRootLen = 96
	pubEnv     = "KVROUTE_INGEST_PUB" // "layout,engines,steps[,endpoint to dial]" in the child
)

// e2ePayloads are one engine's messages: the chains' roots, then the steps (repeated).
func e2ePayloads(tb testing.TB, layout sim.Encoding, engine int) (roots, steps [][]byte, rootBlocks, stepBlocks int) {
	e := sim.NewEncoder(layout)
	var h uint64 = uint64(engine)<<40 + 1
	parents := make([]uint64, e2eChains)
	for c := range e2eChains {
		base := make([]uint32, e2eRootLen*16)
		for i := range base {
			base[i] = uint32(engine*1_000_003 + c*7919 + i)
		}
		root := sim.Event{Kind: sim.BlockStored, TokenIDs: base, BlockSize: 16, Medium: "GPU", KVCacheSpecKind: sim.SpecFullAttention}
		for range e2eRootLen {
			root.BlockHashes = append(root.BlockHashes, h)
			h++
		}
		parents[c] = h - 1
		p, err := e.Encode(sim.Batch{TS: 1, Events: []sim.Event{root}})
		if err != nil {
			tb.Fatal(err)
		}
		roots = append(roots, p)
		rootBlocks += e2eRootLen
	}
	for s := 0; s < e2eChains/e2eReqs; s++ {
		var evs []sim.Event
		for r := range e2eReqs {
			c := s*e2eReqs + r
			toks := make([]uint32, e2ePerReq*16)
			for i := range toks {
				toks[i] = uint32(engine*31 + c*131 + i)
			}
			ev := sim.Event{Kind: sim.BlockStored, ParentBlockHash: parents[c], HasParent: true, TokenIDs: toks, BlockSize: 16, Medium: "GPU", KVCacheSpecKind: sim.SpecFullAttention}
			for i := range e2ePerReq {
				ev.BlockHashes = append(ev.BlockHashes, h+uint64(i))
			}
			evs = append(evs, ev)
			for i := range e2ePerReq {
				evs = append(evs, sim.Event{Kind: sim.BlockRemoved, BlockHashes: []uint64{h + uint64(i)}, Medium: "GPU"})
			}
			h += e2ePerReq
		}
		p, err := e.Encode(sim.Batch{TS: 1, Events: evs})
		if err != nil {
			tb.Fatal(err)
		}
		steps = append(steps, p)
	}
	return roots, steps, rootBlocks, e2eReqs * e2ePerReq
}

// countingSink forwards to the index and counts applied batches per engine (rankAs).
type countingSink struct {
	kvevents.Handler
	batches []atomic.Int64
	want    int64
	left    atomic.Int64
	done    chan struct{}
}

// idleTime is the machine's idle CPU time so far, in seconds (every core's; -1 without
// /proc/stat): what the control plane could have had and did not take.
func idleTime() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle ...
	if len(f) < 5 || f[0] != "cpu" {
		return -1
	}
	ticks, err := strconv.ParseFloat(f[4], 64)
	if err != nil {
		return -1
	}
	return ticks / 100 // USER_HZ
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ingestEndToEnd runs one measurement: steps scheduler steps per engine after the
// roots. It returns the blocks stored, the wall time and the CPU time spent. With
// bind, the control plane listens and the engines connect (topic kv@e<n>).
func ingestEndToEnd(b *testing.B, layout sim.Encoding, engines, steps int, bind bool) (blocks, wall, cpu, pubCPU, idle float64) {
	b.StopTimer()
	ix := New(Config{Budget: Budget{MaxKeys: 1 << 24}})
	var specs []Spec
	for i := range engines {
		specs = append(specs, Spec{ID: fmt.Sprintf("e%d", i), Model: "m", Addr: fmt.Sprintf("10.0.0.%d:8000", i+1), Events: true})
	}
	ix.SetReplicas(specs, time.Now())
	_, _, rootBlocks, stepBlocks := e2ePayloads(b, layout, 0)
	perEngine := int64(e2eChains + steps)
	sink := &countingSink{Handler: ix.Events(), batches: make([]atomic.Int64, engines), want: perEngine, done: make(chan struct{})}
	sink.left.Store(int64(engines))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	env := fmt.Sprintf("%s=%s,%d,%d", pubEnv, layout, engines, steps)
	if bind {
		addr, done, err := kvevents.Listen(ctx, "tcp://127.0.0.1:0", func(topic string) (kvevents.Source, bool) {
			id, ok := strings.CutPrefix(topic, "kv@")
			return kvevents.Source{ID: kvevents.StreamID{Replica: id}}, ok
		}, byReplica{sink}, func(string) {}, kvevents.Options{})
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); <-done }()
		env += ",tcp://" + addr.String()
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestIngestPublisherProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), env, "GOMAXPROCS=1")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	defer func() { cancel(); wg.Wait() }() // before the publisher goes: no reconnections
	rd := bufio.NewScanner(stdout)
	var addrs []string
	for rd.Scan() && rd.Text() != "ready" {
		if a, ok := strings.CutPrefix(rd.Text(), "addr "); ok {
			addrs = append(addrs, a)
		}
	}
	if !bind && len(addrs) != engines {
		b.Fatalf("publisher gave %d addresses", len(addrs))
	}
	for i, a := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kvevents.Subscribe(ctx, kvevents.Source{ID: kvevents.StreamID{Replica: fmt.Sprintf("e%d", i), Rank: 0}, Endpoint: a},
				&rankAs{sink, i}, kvevents.Options{})
		}()
	}
	// Wait for every subscription (and its topic filter) to reach the publisher; with
	// bind the publisher waits for them itself before it is ready.
	for deadline := time.Now().Add(10 * time.Second); !bind; {
		n := 0
		for _, st := range ix.DebugState(time.Now()) {
			if st.KVEvents.Connected {
				n++
			}
		}
		if n == engines {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("subscriptions did not connect")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	idle0, c0, t0 := idleTime(), cpuTime(), time.Now()
	b.StartTimer()
	io.WriteString(stdin, "go\n")
	select {
	case <-sink.done:
	case <-time.After(2 * time.Minute):
		b.Fatal("timed out: not every batch arrived")
	}
	wall = time.Since(t0).Seconds()
	b.StopTimer()
	if idle = idleTime() - idle0; idle0 < 0 {
		idle = -1
	}
	cpu = (cpuTime() - c0).Seconds()
	// The publisher's CPU from "go" to now, when every message has arrived: on a 2-core
	// machine what it takes is what the control plane cannot have. (Read at its last Send,
	// before go-zeromq's writers had written, it showed 0.05-0.13 cores of the 0.3 taken.)
	io.WriteString(stdin, "cpu\n")
	for rd.Scan() {
		if v, ok := strings.CutPrefix(rd.Text(), "cpu "); ok {
			ns, _ := strconv.ParseInt(v, 10, 64)
			pubCPU = float64(ns) / 1e9
			break
		}
	}
	var stored uint64
	for _, st := range ix.DebugState(time.Now()) {
		stored += st.KVEvents.StoredBlocks
		if st.KVEvents.Gaps != 0 || st.KVEvents.DecodeErrors != 0 {
			b.Fatalf("%s: gaps %d, decode errors %d", st.ID, st.KVEvents.Gaps, st.KVEvents.DecodeErrors)
		}
	}
	if want := uint64(engines * (rootBlocks + steps*stepBlocks)); stored != want {
		b.Fatalf("stored %d blocks, want %d", stored, want)
	}
	return float64(stored), wall, cpu, pubCPU, idle
}

// byReplica counts the streams of a bound socket by their replica ("e<n>").
type byReplica struct{ *countingSink }

func (r byReplica) Batch(id kvevents.StreamID, seq uint64, b *kvevents.Batch) {
	n, _ := strconv.Atoi(strings.TrimPrefix(id.Replica, "e"))
	(&rankAs{r.countingSink, n}).Batch(id, seq, b)
}

// rankAs tags a stream with its engine number for countingSink.
type rankAs struct {
	*countingSink
	n int
}

func (r *rankAs) Batch(id kvevents.StreamID, seq uint64, b *kvevents.Batch) {
	r.countingSink.Handler.Batch(id, seq, b)
	if r.batches[r.n].Add(1) == r.want && r.left.Add(-1) == 0 {
		close(r.done)
	}
}

// TestIngestPublisherProcess is BenchmarkIngestEndToEnd's publisher process; without
// its environment variable it does nothing.
func TestIngestPublisherProcess(t *testing.T) {
	arg := os.Getenv(pubEnv)
	if arg == "" {
		t.Skip("the ingest benchmark's publisher process")
	}
	parts := strings.Split(arg, ",")
	layout := sim.Encoding(parts[0])
	engines, _ := strconv.Atoi(parts[1])
	steps, _ := strconv.Atoi(parts[2])
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var socks []zmq4.Socket
	var msgs [][]zmq4.Msg
	for i := range engines {
		pub := zmq4.NewPub(ctx)
		topic := "kv"
		if len(parts) > 3 { // the control plane is bound: connect, as engines with --kv-bind
			topic = fmt.Sprintf("kv@e%d", i)
			if err := pub.Dial(parts[3]); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); len(pub.(zmq4.Topics).Topics()) == 0; {
				if time.Now().After(deadline) {
					t.Fatal("the subscription did not arrive")
				}
				time.Sleep(5 * time.Millisecond)
			}
		} else if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, pub)
		roots, st, _, _ := e2ePayloads(t, layout, i)
		var m []zmq4.Msg
		seq := uint64(0)
		add := func(p []byte) {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], seq)
			seq++
			m = append(m, zmq4.NewMsgFrom([]byte(topic), s[:], p))
		}
		for _, p := range roots {
			add(p)
		}
		for j := range steps {
			add(st[j%len(st)])
		}
		msgs = append(msgs, m)
		if len(parts) <= 3 {
			fmt.Printf("addr tcp://%s\n", pub.Addr())
		}
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() || in.Text() != "go" {
		return
	}
	c0 := cpuTime()
	var wg sync.WaitGroup
	for i, pub := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, m := range msgs[i] {
				if err := pub.Send(m); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if in.Scan() && in.Text() == "cpu" { // every message has arrived
		fmt.Printf("cpu %d\n", cpuTime()-c0)
	}
	for in.Scan() { // until the benchmark closes stdin
	}
	for _, s := range socks {
		s.Close()
	}
}

// The same steps without the network: one goroutine per engine decodes its stream and
// applies it to the index (what each subscription goroutine does after go-zeromq),
// for the scaling with cores without the publisher's CPU on the same machine.
//
//	go test ./controlplane/index -run '^$' -bench IngestParallel -cpu 1,2
func BenchmarkIngestParallel(b *testing.B) {
	const engines = 8
	ix := New(Config{Budget: Budget{MaxKeys: 1 << 24}})
	var specs []Spec
	for i := range engines {
		specs = append(specs, Spec{ID: fmt.Sprintf("e%d", i), Model: "m", Addr: fmt.Sprintf("10.0.0.%d:8000", i+1), Events: true})
	}
	ix.SetReplicas(specs, time.Now())
	steps := make([][][]byte, engines)
	var stepBlocks int
	for i := range engines {
		roots, st, _, sb := e2ePayloads(b, sim.Map, i)
		stepBlocks = sb
		d := kvevents.NewDecoder()
		var batch kvevents.Batch
		for j, p := range roots {
			if err := d.Decode(p, &batch); err != nil {
				b.Fatal(err)
			}
			ix.Events().Batch(kvevents.StreamID{Replica: fmt.Sprintf("e%d", i)}, uint64(j), &batch)
		}
		steps[i] = st
	}
	per := (b.N + engines - 1) / engines
	b.ResetTimer()
	start, c0 := time.Now(), cpuTime()
	var wg sync.WaitGroup
	for i := range engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := kvevents.NewDecoder()
			var batch kvevents.Batch
			sink, id := ix.Events(), kvevents.StreamID{Replica: fmt.Sprintf("e%d", i)}
			for j := range per {
				if err := d.Decode(steps[i][j%len(steps[i])], &batch); err != nil {
					b.Error(err)
					return
				}
				sink.Batch(id, uint64(e2eChains+j), &batch)
			}
		}()
	}
	wg.Wait()
	wall, cpu := time.Since(start).Seconds(), (cpuTime() - c0).Seconds()
	b.ReportMetric(float64(per*engines*stepBlocks)/wall, "blocks/s")
	b.ReportMetric(float64(per*engines*stepBlocks)/cpu, "blocks/cpu-s")
	b.ReportMetric(cpu/wall, "cores")
}
