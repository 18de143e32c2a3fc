package controlplane

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
	"github.com/kvroute/kvroute/controlplane/discovery"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	sim "github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/publisher"
)

// fromLoopback2 is a TCP transport whose connections come from 127.0.0.2: on one
// machine, a host other than the engine (which connects from 127.0.0.1).
type fromLoopback2 struct{}

func (fromLoopback2) Dial(ctx context.Context, _ transport.Dialer, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: time.Second}
	return d.DialContext(ctx, "tcp", addr)
}
func (fromLoopback2) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return transport.New("tcp").Listen(ctx, addr)
}
func (fromLoopback2) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

func init() {
	if err := zmq4.RegisterTransport("tcpfrom2", fromLoopback2{}); err != nil {
		panic(err)
	}
}

// With --kv-bind, a message naming replica e1 from an address that is not e1's is
// dropped and counted: before, one such message with a high sequence number and an
// AllBlocksCleared wiped e1's keys. An address in --kv-bind-allow may publish.
func TestKVBindImpostor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		allow   string
		dropped bool
	}{
		{name: "impostor dropped", dropped: true},
		{name: "allow-listed address accepted", allow: "127.0.0.2/32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			allow, err := ParseAllow(tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			var queued atomic.Int64
			metrics := fakeMetrics(t, &queued)
			cp, err := New(Options{
				Listen: "127.0.0.1:0", KVBind: "tcp://127.0.0.1:0", KVBindAllow: allow,
				Engines:         []discovery.Engine{{ID: "e1", Model: "m", Addr: "127.0.0.1:8000", Metrics: metrics.URL + "/metrics", Topic: "kv@e1@m"}},
				PublishInterval: 10 * time.Millisecond, Logger: quiet(),
			})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer func() { cancel(); cp.Wait() }()
			if err := cp.Start(ctx); err != nil {
				t.Fatal(err)
			}
			kvAddr := cp.KVAddrs()[0].String()
			// The engine, from 127.0.0.1, stores 4 blocks.
			pub, err := publisher.Open(publisher.Config{EnableKVCacheEvents: true, Publisher: "zmq", Endpoint: "tcp://" + kvAddr, Topic: "kv@e1@m", BufferSteps: 10, HWM: 100},
				publisher.Options{Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			for !pub.Subscribed() {
				time.Sleep(5 * time.Millisecond)
			}
			toks := make([]uint32, 4*16)
			if _, err := pub.Publish(sim.Batch{Events: []sim.Event{{Kind: sim.BlockStored, BlockHashes: []uint64{1, 2, 3, 4}, TokenIDs: toks, BlockSize: 16, Medium: "GPU"}}}); err != nil {
				t.Fatal(err)
			}
			key := prefix.Checkpoints(nil, prefix.TokenKeys(nil, prefix.Seed(prefix.Token, "m", "", prefix.Salt{}), toks, 16), 4)[0]
			p := &poller{t: t, base: "http://" + cp.Addr(), tab: table.New()}
			p.until("e1's key", func(m *table.Model) bool { return len(m.Lookup(key)) == 1 })

			// Another host names e1: sequence 2^40, AllBlocksCleared.
			imp := zmq4.NewPub(ctx, zmq4.WithDialerMaxRetries(0))
			defer imp.Close()
			if err := imp.Dial("tcpfrom2://" + kvAddr); err != nil {
				t.Fatal(err)
			}
			payload, err := sim.NewEncoder(sim.Map).Encode(sim.Batch{Events: []sim.Event{{Kind: sim.AllBlocksCleared}}})
			if err != nil {
				t.Fatal(err)
			}
			seq := binary.BigEndian.AppendUint64(nil, 1<<40)
			e1 := func() index.ReplicaState { return cp.Index.DebugState(time.Now())[0] }
			impostors := func() float64 { return counterValue(t, cp, "kvroute_controlplane_kv_event_impostor_total") }
			deadline := time.Now().Add(10 * time.Second)
			// Sent until the control plane's subscription has reached the impostor's PUB
			// (go-zeromq's PUB drops messages nobody subscribed to yet).
			for impostors() == 0 && e1().KVEvents.Clears == 0 {
				if time.Now().After(deadline) {
					t.Fatal("the impostor's message was neither counted nor applied")
				}
				imp.Send(zmq4.NewMsgFrom([]byte("kv@e1@m"), seq, payload))
				time.Sleep(10 * time.Millisecond)
			}
			st := e1()
			if tc.dropped {
				if st.KVEvents.Clears != 0 || st.KVEvents.LastSeq != 0 || st.TokenKeys == 0 {
					t.Fatalf("the impostor reached e1: %+v", st.KVEvents)
				}
				p.poll()
				if len(p.tab.Models["m"].Lookup(key)) != 1 {
					t.Fatal("e1's key is gone")
				}
				t.Logf("impostor messages dropped and counted: %v; e1 keeps its %d token keys", impostors(), st.TokenKeys)
			} else if st.KVEvents.Clears == 0 || impostors() != 0 {
				t.Fatalf("allow-listed peer: clears %d, impostors %v", st.KVEvents.Clears, impostors())
			}
		})
	}
}

func counterValue(t *testing.T, cp *ControlPlane, name string) float64 {
	t.Helper()
	mfs, err := cp.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

func TestParseAllow(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []netip.Prefix
		bad  bool
	}{
		{in: ""},
		{in: "10.0.0.7", want: []netip.Prefix{netip.MustParsePrefix("10.0.0.7/32")}},
		{in: "10.1.2.3/16, ::1", want: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("::1/128")}},
		{in: "10.0.0.0/99", bad: true},
		{in: "pod-a", bad: true},
	} {
		got, err := ParseAllow(tc.in)
		if (err != nil) != tc.bad || len(got) != len(tc.want) {
			t.Errorf("%q: %v, %v", tc.in, got, err)
			continue
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}
