package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/front"
	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/controlplane/kvevents"
	"github.com/kvroute/kvroute/controlplane/publish"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/prometheus/client_golang/prometheus"
)

type env struct {
	ix      *index.Index
	pub     *publish.Publisher
	url     string
	handler http.Handler
	now     time.Time
	server  *Server
}

func newEnv(t testing.TB, token string, history int) *env {
	t.Helper()
	e := &env{ix: index.New(index.Config{}), pub: publish.New(publish.Options{MaxHistory: history, FirstVersion: 100}), now: time.Unix(1_800_000_000, 0)}
	reg := prometheus.NewRegistry()
	s := &Server{Index: e.ix, Publisher: e.pub, Token: token, MaxBodyBytes: 4096, Gatherer: reg, Metrics: NewMetrics(reg), Now: func() time.Time { return e.now }}
	e.handler, e.server = s.Handler(), s
	e.url = serveFront(t, e.handler)
	e.ix.SetReplicas([]index.Spec{
		{ID: "a", Model: "m", Addr: "10.0.0.1:8000"},
		{ID: "b", Model: "m", Addr: "10.0.0.2:8000"},
		{ID: "c", Model: "n", Addr: "10.0.0.3:8000"},
	}, e.now)
	return e
}

func (e *env) publish(t testing.TB) uint64 {
	t.Helper()
	e.now = e.now.Add(50 * time.Millisecond)
	ups := e.ix.Flush(e.now, e.pub.Version() == 0)
	if ups == nil {
		ups = e.ix.Flush(e.now, true)
	}
	v, err := e.pub.Publish(ups, e.now)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// place confirms a chain of n random text keys on the replica at addr of model.
func (e *env) place(t testing.TB, rng *rand.Rand, model, addr string, n int) []uint64 {
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	r := api.Report{Kind: api.KindOutcome, Model: model, Replica: addr, Domain: prefix.Text, BlockSize: 64, Stride: 4, Blocks: 4 * n, Keys: keys, Status: 200, PromptTokens: 100, PromptBytes: 400}
	e.ix.ApplyReports(&api.ReportBatch{Reports: []api.Report{r}}, e.now, nil)
	return keys
}

// serveFront serves h on loopback as the control plane does: FrontRoutes through the
// lean front, everything else through net/http.
func serveFront(t testing.TB, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &front.Front{Handler: h, Fallback: &http.Server{Handler: h}, Routes: FrontRoutes, Headers: FrontHeaders}
	go f.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

type resp struct {
	code  int
	kind  string
	ver   uint64
	body  []byte
	ctype string
	age   string // the version's age header
	epoch string // the publisher's epoch header
	held  string // how long a long poll was held ("" when the header is absent)
}

func (e *env) get(t testing.TB, query, token string) resp {
	t.Helper()
	return e.do(t, query, token, "")
}

// getFormats polls as a filter listing formats does.
func (e *env) getFormats(t testing.TB, query, formats string) resp {
	t.Helper()
	return e.do(t, query, "", formats)
}

func (e *env) do(t testing.TB, query, token, formats string) resp {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.url+api.TablePath+query, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if formats != "" {
		req.Header.Set(api.TableFormatsHeader, formats)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	v, _ := strconv.ParseUint(r.Header.Get("X-Kvroute-Version"), 10, 64)
	return resp{r.StatusCode, r.Header.Get("X-Kvroute-Frame"), v, b, r.Header.Get("Content-Type"), r.Header.Get(api.TableAgeHeader), r.Header.Get(api.TableEpochHeader),
		r.Header.Get(api.TableHeldHeader)}
}

// serverTable is the publisher's table, encoded, for comparisons.
func (e *env) serverTable(model string) []byte {
	var b []byte
	e.pub.Table(func(t *table.Table) {
		if model != "" {
			t = &table.Table{Version: t.Version, GeneratedMs: t.GeneratedMs, Models: map[string]*table.Model{model: t.Models[model]}}
		}
		b = table.EncodeFull(t)
	})
	return b
}

func TestTableFullDeltaNotModified(t *testing.T) {
	e := newEnv(t, "", 3)
	rng := rand.New(rand.NewPCG(1, 2))
	if r := e.get(t, "", ""); r.code != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "no table yet") {
		t.Fatalf("before the first version: %d %s", r.code, r.body)
	}
	e.place(t, rng, "m", "10.0.0.1:8000", 5)
	v1 := e.publish(t)
	client := table.New()
	r := e.get(t, "", "")
	if r.code != 200 || r.kind != "full" || r.ver != v1 || r.ctype != api.TableContentType {
		t.Fatalf("first fetch: %+v", r)
	}
	if _, err := client.Apply(r.body); err != nil {
		t.Fatal(err)
	}
	if r := e.get(t, fmt.Sprintf("?version=%d", v1), ""); r.code != http.StatusNotModified || len(r.body) != 0 {
		t.Fatalf("current version: %d", r.code)
	}
	// Two versions later, a filter at v1 gets one delta composed of both.
	keysB := e.place(t, rng, "m", "10.0.0.2:8000", 3)
	e.publish(t)
	e.place(t, rng, "n", "10.0.0.3:8000", 2)
	e.ix.ApplyReports(&api.ReportBatch{Reports: []api.Report{{Kind: api.KindOutcome, Model: "m", Replica: "10.0.0.2:8000", Domain: prefix.Text, BlockSize: 64, Stride: 4, Blocks: 12, Keys: keysB, Status: 200}}}, e.now, nil)
	v3 := e.publish(t)
	r = e.get(t, fmt.Sprintf("?version=%d", v1), "")
	if r.code != 200 || r.kind != "delta" || r.ver != v3 {
		t.Fatalf("delta: %+v", r)
	}
	f, err := client.Apply(r.body)
	if err != nil {
		t.Fatal(err)
	}
	if f.Kind != table.Delta || f.Base != v1 || client.Models["m"].Len() != 8 || client.Models["n"].Len() != 2 {
		t.Fatalf("after delta: kind %d base %d, m %d keys, n %d keys", f.Kind, f.Base, client.Models["m"].Len(), client.Models["n"].Len())
	}
	if !bytes.Equal(table.EncodeFull(client), e.serverTable("")) {
		t.Fatal("client table differs from the server's after the delta")
	}
	for _, k := range keysB {
		if s := client.Models["m"].Lookup(k); !slices.Equal(s, []uint32{1}) {
			t.Fatalf("key %x slots %v", k, s)
		}
	}
	// Beyond the history (3 versions): a full frame.
	for i := 0; i < 3; i++ {
		e.place(t, rng, "m", "10.0.0.1:8000", 1)
		e.publish(t)
	}
	if r := e.get(t, fmt.Sprintf("?version=%d", v1), ""); r.code != 200 || r.kind != "full" {
		t.Fatalf("old version: %+v", r)
	}
	// A version this process never published (a previous control plane's): full.
	if r := e.get(t, "?version=7", ""); r.code != 200 || r.kind != "full" {
		t.Fatalf("foreign version: %+v", r)
	}
	if r := e.get(t, "?version=99999999999", ""); r.code != 200 || r.kind != "full" {
		t.Fatalf("future version: %+v", r)
	}
}

// Two replicas (or a process and its restart) count versions alike: both start at 100
// here. A filter that moves from one to the other with a version the other also
// published gets a full table, not a delta against a table it does not have, because
// its poll names the epoch its version belongs to.
func TestTableVersionsAreScopedToTheirEpoch(t *testing.T) {
	a, b := newEnv(t, "", 10), newEnv(t, "", 10)
	rng := rand.New(rand.NewPCG(5, 6))
	a.place(t, rng, "m", "10.0.0.1:8000", 3)
	va := a.publish(t)
	for range 2 {
		b.place(t, rng, "m", "10.0.0.2:8000", 2)
		b.publish(t)
	}
	fromA := a.get(t, "", "")
	if fromA.code != 200 || fromA.epoch == "" || fromA.epoch == b.get(t, "", "").epoch {
		t.Fatalf("each replica names its own epoch: a %q, b %q", fromA.epoch, b.get(t, "", "").epoch)
	}
	// The filter holds a's v100; b published v100 and v101 of its own.
	q := fmt.Sprintf("?version=%d&epoch=%s", va, fromA.epoch)
	if r := b.get(t, q, ""); r.code != 200 || r.kind != "full" || r.epoch == fromA.epoch {
		t.Fatalf("another epoch's version: %d %q, want a full table in b's epoch", r.code, r.kind)
	}
	if r := b.get(t, q+"&wait_ms=20000", ""); r.code != 200 || r.kind != "full" {
		t.Fatalf("a long poll from another epoch is answered at once with a full table: %d %q", r.code, r.kind)
	}
	// Its own epoch, or none (filters that do not send it), keeps the usual answers.
	if r := a.get(t, q, ""); r.code != http.StatusNotModified || r.epoch != fromA.epoch {
		t.Fatalf("own epoch, current version: %d", r.code)
	}
	if r := b.get(t, fmt.Sprintf("?version=%d", va), ""); r.code != 200 || r.kind != "delta" {
		t.Fatalf("without an epoch the version is taken as b's own: %d %q", r.code, r.kind)
	}
}

// A replica that started less than TakeoverAfter ago sends a filter holding another
// replica's table back (503): it has not heard that filter's reports for long. A filter
// without a table, or of its own epoch, is served.
func TestYoungReplicaDeclinesATakeover(t *testing.T) {
	e := newEnv(t, "", 10)
	e.place(t, rand.New(rand.NewPCG(7, 8)), "m", "10.0.0.1:8000", 2)
	v := e.publish(t)
	// Served in this goroutine (the handler reads TakeoverAfter as it changes).
	poll := func(query string) (int, string) {
		w := httptest.NewRecorder()
		e.handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, api.TablePath+query, nil))
		return w.Code, w.Header().Get(api.TableEpochHeader)
	}
	e.server.TakeoverAfter = time.Hour
	code, own := poll("")
	if code != 200 || own == "" {
		t.Fatalf("no table yet: %d", code)
	}
	if code, _ := poll(fmt.Sprintf("?version=%d&epoch=%s", v, own)); code != http.StatusNotModified {
		t.Fatalf("own epoch: %d", code)
	}
	if code, _ := poll(fmt.Sprintf("?version=%d&epoch=1&wait_ms=20000", v)); code != http.StatusServiceUnavailable {
		t.Fatalf("another replica's epoch: %d, want 503 at once", code)
	}
	e.server.TakeoverAfter = time.Nanosecond
	if code, epoch := poll(fmt.Sprintf("?version=%d&epoch=1", v)); code != 200 || epoch != own {
		t.Fatalf("after TakeoverAfter: %d, epoch %q", code, epoch)
	}
}

// Every table answer says how old its version is, so the filter dates the queue numbers
// from when they were built, not from when its poll returned.
func TestTableAnswersCarryTheVersionsAge(t *testing.T) {
	e := newEnv(t, "", 3)
	e.place(t, rand.New(rand.NewPCG(1, 2)), "m", "10.0.0.1:8000", 2)
	v := e.publish(t)
	if r := e.get(t, "", ""); r.code != 200 || r.age != "0" {
		t.Fatalf("fresh version: %d, age %q", r.code, r.age)
	}
	e.now = e.now.Add(1234 * time.Millisecond)
	if r := e.get(t, "", ""); r.code != 200 || r.age != "1234" {
		t.Fatalf("full frame of an older version: age %q, want 1234", r.age)
	}
	if r := e.get(t, fmt.Sprintf("?version=%d", v), ""); r.code != http.StatusNotModified || r.age != "1234" {
		t.Fatalf("304: %d, age %q, want 1234", r.code, r.age)
	}
}

// A long poll's answer says how long the control plane held it, so that the filter can
// date the version from when its poll left (api.TableBuilt), not from when the answer
// came back; an answer to a poll without wait_ms says nothing.
func TestLongPollAnswersSayHowLongTheyWereHeld(t *testing.T) {
	e := newEnv(t, "", 3)
	v := e.publish(t)
	e.publish(t)
	held := func(r resp) int {
		t.Helper()
		ms, err := strconv.Atoi(r.held)
		if err != nil {
			t.Fatalf("%d answer to a long poll: held header %q", r.code, r.held)
		}
		return ms
	}
	if r := e.get(t, fmt.Sprintf("?version=%d", v), ""); r.code != 200 || r.held != "" {
		t.Fatalf("a poll without wait_ms: %d, held %q", r.code, r.held)
	}
	if r := e.get(t, fmt.Sprintf("?version=%d&wait_ms=5000", v), ""); r.code != 200 || held(r) >= 5000 {
		t.Fatalf("a long poll for an older version is answered at once: %d, held %q", r.code, r.held)
	}
	if r := e.get(t, fmt.Sprintf("?version=%d&wait_ms=30", e.pub.Version()), ""); r.code != http.StatusNotModified || held(r) < 30 {
		t.Fatalf("a long poll that waited out 30 ms: %d, held %q", r.code, r.held)
	}
}

func TestTableOneModel(t *testing.T) {
	e := newEnv(t, "", 10)
	rng := rand.New(rand.NewPCG(3, 4))
	e.place(t, rng, "m", "10.0.0.1:8000", 5)
	e.place(t, rng, "n", "10.0.0.3:8000", 2)
	v1 := e.publish(t)
	r := e.get(t, "?model=n", "")
	client := table.New()
	if _, err := client.Apply(r.body); err != nil || r.kind != "full" {
		t.Fatal(err, r.kind)
	}
	if names := client.ModelNames(); !slices.Equal(names, []string{"n"}) || client.Models["n"].Len() != 2 {
		t.Fatalf("models %v", names)
	}
	e.place(t, rng, "m", "10.0.0.1:8000", 5)
	e.place(t, rng, "n", "10.0.0.3:8000", 1)
	e.publish(t)
	r = e.get(t, fmt.Sprintf("?model=n&version=%d", v1), "")
	f, err := client.Apply(r.body)
	if err != nil || r.kind != "delta" || len(f.Models) != 1 || f.Models[0].Name != "n" {
		t.Fatalf("delta for n: %v %s %+v", err, r.kind, f)
	}
	if !bytes.Equal(table.EncodeFull(client), e.serverTable("n")) {
		t.Fatal("client differs")
	}
	if r := e.get(t, "?model=nosuch", ""); r.code != 200 {
		t.Fatalf("unknown model: %d", r.code)
	} else if f, err := table.Decode(r.body); err != nil || len(f.Models) != 0 {
		t.Fatalf("unknown model frame: %v %+v", err, f)
	}
}

// Random changes over many versions: from every recent version, the composed delta
// takes a filter's table to exactly the current one.
func TestComposedDeltasMatchFull(t *testing.T) {
	e := newEnv(t, "", 50)
	rng := rand.New(rand.NewPCG(5, 6))
	addrs := map[string][]string{"m": {"10.0.0.1:8000", "10.0.0.2:8000"}, "n": {"10.0.0.3:8000"}}
	var chains [][]uint64
	var clients []*table.Table
	for v := 0; v < 40; v++ {
		for j := 0; j < 1+rng.IntN(4); j++ {
			model := []string{"m", "n"}[rng.IntN(2)]
			addr := addrs[model][rng.IntN(len(addrs[model]))]
			switch rng.IntN(4) {
			case 0, 1:
				chains = append(chains, e.place(t, rng, model, addr, 1+rng.IntN(6)))
			case 2:
				if len(chains) > 0 {
					// A refuted placement and an expiring one.
					c := chains[rng.IntN(len(chains))]
					rep := api.Report{Kind: api.KindPlacement, Model: model, Replica: addr, Domain: prefix.Text, BlockSize: 64, Stride: 4, Blocks: 4 * len(c), Keys: c}
					e.ix.ApplyReports(&api.ReportBatch{Reports: []api.Report{rep}}, e.now.Add(-9950*time.Millisecond), nil)
				}
			case 3:
				e.ix.Events().Batch(kvevents.StreamID{Replica: []string{"a", "b", "c"}[rng.IntN(3)]}, uint64(v), &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}})
			}
		}
		if v == 20 { // a replica leaves, another joins (slot reuse)
			e.ix.SetReplicas([]index.Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000"}, {ID: "c", Model: "n", Addr: "10.0.0.3:8000"}, {ID: "d", Model: "o", Addr: "10.0.0.4:8000"}}, e.now)
			addrs["m"] = addrs["m"][:1]
		}
		e.publish(t)
		r := e.get(t, "", "")
		c := table.New()
		if _, err := c.Apply(r.body); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		full := e.serverTable("")
		for i, old := range clients[:len(clients)-1] {
			if i < len(clients)-50 {
				continue
			}
			cp := table.New()
			if _, err := cp.Apply(table.EncodeFull(old)); err != nil {
				t.Fatal(err)
			}
			r := e.get(t, fmt.Sprintf("?version=%d", cp.Version), "")
			if r.kind != "delta" {
				t.Fatalf("v%d from %d: %s", e.pub.Version(), cp.Version, r.kind)
			}
			if _, err := cp.Apply(r.body); err != nil {
				t.Fatalf("v%d from %d: %v", e.pub.Version(), cp.Version, err)
			}
			if !bytes.Equal(table.EncodeFull(cp), full) {
				t.Fatalf("v%d from %d: composed delta does not reproduce the table", e.pub.Version(), cp.Version)
			}
		}
	}
}

func TestLongPoll(t *testing.T) {
	e := newEnv(t, "", 10)
	v1 := e.publish(t)
	got := make(chan resp, 1)
	go func() { got <- e.get(t, fmt.Sprintf("?version=%d&wait_ms=20000", v1), "") }()
	// Publish once the poller is (very probably) waiting; either way it gets v2.
	time.Sleep(20 * time.Millisecond)
	e.place(t, rand.New(rand.NewPCG(1, 1)), "m", "10.0.0.1:8000", 1)
	v2 := e.publish(t)
	select {
	case r := <-got:
		if r.code != 200 || r.kind != "delta" || r.ver != v2 {
			t.Fatalf("long poll: %+v", r)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("long poll never answered")
	}
	if r := e.get(t, fmt.Sprintf("?version=%d&wait_ms=1", v2), ""); r.code != http.StatusNotModified {
		t.Fatalf("long poll without a new version: %d", r.code)
	}
}

func post(t testing.TB, url, ctype, token string, body []byte) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%d: body %q is not JSON", r.StatusCode, b)
	}
	return r.StatusCode, m
}

func TestReportsAPI(t *testing.T) {
	e := newEnv(t, "", 10)
	url := e.url + api.ReportsPath
	good := `{"proxy":"p1","reports":[` +
		`{"kind":"placement","model":"m","replica":"10.0.0.1:8000","domain":1,"block_size":64,"stride":4,"blocks":8,"keys":[1,2],"predicted_cached_tokens":0,"at_ms":1},` +
		`{"kind":"placement","model":"m","replica":"10.9.9.9:8000","domain":1,"block_size":64,"stride":4,"blocks":4,"keys":[3],"predicted_cached_tokens":0,"at_ms":1}]}`
	cases := []struct {
		name, ctype, body string
		code              int
		errHas            string
	}{
		{"valid batch", "application/json", good, 200, ""},
		{"no content type", "", good, 200, ""},
		{"corrupt JSON", "application/json", `{"reports":[`, 400, "report batch"},
		{"not a batch", "application/json", `{"reports":{}}`, 400, "report batch"},
		{"too large", "application/json", `{"reports":[],"proxy":"` + strings.Repeat("x", 5000) + `"}`, 413, "larger than 4096"},
		{"wrong content type", "text/plain", good, 415, "or application/json"},
		// Current filters post binary batches; the JSON ones above are older filters'.
		{"valid binary batch", api.ReportsContentType, binaryOf(t, good), 200, ""},
		{"corrupt binary batch", api.ReportsContentType, binaryOf(t, good)[:12], 400, "report batch"},
	}
	for _, c := range cases {
		code, m := post(t, url, c.ctype, "", []byte(c.body))
		if code != c.code {
			t.Errorf("%s: %d %v, want %d", c.name, code, m, c.code)
			continue
		}
		if c.errHas != "" && !strings.Contains(fmt.Sprint(m["error"]), c.errHas) {
			t.Errorf("%s: error %q lacks %q", c.name, m["error"], c.errHas)
		}
		if c.code == 200 && (m["received"] != 2.0 || m["applied"] != 1.0) {
			t.Errorf("%s: %v", c.name, m)
		}
	}
	// Bad reports are dropped one by one with the reason; unknown fields (a newer
	// filter) are ignored; the rest of the batch is applied.
	mixed := `{"proxy":"p1","x":1,"reports":[` +
		`{"kind":"guess","model":"m","replica":"r","domain":1,"block_size":64,"stride":4,"blocks":0,"keys":[],"predicted_cached_tokens":0,"at_ms":0},` +
		`{"kind":"placement","model":"m","replica":"r","domain":1,"block_size":64,"stride":4,"blocks":8,"keys":[1],"predicted_cached_tokens":0,"at_ms":0},` +
		`{"kind":"placement","model":"m","replica":"10.0.0.1:8000","domain":1,"block_size":64,"stride":4,"blocks":4,"keys":[5],"predicted_cached_tokens":0,"at_ms":1,"newer":true}]}`
	code, m := post(t, url, "application/json", "", []byte(mixed))
	if code != 200 || m["received"] != 3.0 || m["rejected"] != 2.0 || m["applied"] != 1.0 {
		t.Errorf("mixed batch: %d %v", code, m)
	}
	if errs := fmt.Sprint(m["errors"]); !strings.Contains(errs, "report 0: kind") || !strings.Contains(errs, "report 1: 1 keys for 8 blocks") {
		t.Errorf("mixed batch errors %q", errs)
	}
	r, _ := http.Get(url)
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET reports: %d", r.StatusCode)
	}
	if r := e.get(t, "?version=abc", ""); r.code != 400 || !strings.Contains(string(r.body), "unsigned integer") {
		t.Fatalf("bad version: %d %s", r.code, r.body)
	}
	if r := e.get(t, "?version=1&wait_ms=-5", ""); r.code != 400 {
		t.Fatalf("bad wait_ms: %d", r.code)
	}
}

// Report bodies are charged against the bytes in flight (2 x MaxBodyBytes here: 8192)
// as they are read: two bodies stalled after 3,000 of their 4,000 bytes hold 6,000, so
// a small batch is accepted and one that sends 4,000 bytes is refused with 429 when its
// reading crosses the limit; once the stalled ones are gone, it is accepted.
func TestReportBytesAreChargedAsRead(t *testing.T) {
	e := newEnv(t, "", 10)
	addr := strings.TrimPrefix(e.url, "http://")
	good := []byte(`{"proxy":"p1","reports":[]}`)
	pad := func(n int) []byte { return append(bytes.Repeat([]byte(" "), n-len(good)), good...) } // JSON, n bytes
	var stalled []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: cp\r\nContent-Length: 4000\r\n\r\n%s", api.ReportsPath, pad(4000)[:3000])
		stalled = append(stalled, c)
	}
	inFlight := func() int64 { e.server.inflightMu.Lock(); defer e.server.inflightMu.Unlock(); return e.server.inflight }
	for deadline := time.Now().Add(10 * time.Second); inFlight() < 6000; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled bodies were not read: %d bytes in flight", inFlight())
		}
	}
	if code, m := post(t, e.url+api.ReportsPath, "application/json", "", pad(1000)); code != 200 {
		t.Errorf("a 1,000-byte batch beside 6,000 bytes in flight: %d %v", code, m)
	}
	if code, m := post(t, e.url+api.ReportsPath, "application/json", "", pad(4000)); code != http.StatusTooManyRequests {
		t.Errorf("a 4,000-byte batch beside 6,000 bytes in flight: %d %v, want 429", code, m)
	}
	for _, c := range stalled {
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); inFlight() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stalled bodies' bytes were not released: %d in flight", inFlight())
		}
	}
	if code, m := post(t, e.url+api.ReportsPath, "application/json", "", pad(4000)); code != 200 {
		t.Errorf("a 4,000-byte batch alone: %d %v", code, m)
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, "s3cret", 10)
	e.publish(t)
	for _, tok := range []string{"", "wrong"} {
		if r := e.get(t, "", tok); r.code != http.StatusUnauthorized || !strings.Contains(string(r.body), "bearer token") {
			t.Fatalf("table with token %q: %d", tok, r.code)
		}
		if code, _ := post(t, e.url+api.ReportsPath, "application/json", tok, []byte(`{"reports":[]}`)); code != http.StatusUnauthorized {
			t.Fatalf("reports with token %q: %d", tok, code)
		}
	}
	if r := e.get(t, "", "s3cret"); r.code != 200 {
		t.Fatalf("table with the token: %d", r.code)
	}
	if code, _ := post(t, e.url+api.ReportsPath, "application/json", "s3cret", []byte(`{"reports":[]}`)); code != 200 {
		t.Fatalf("reports with the token: %d", code)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		r, err := http.Get(e.url + p)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("%s: %d", p, r.StatusCode)
		}
	}
	r, _ := http.Get(e.url + api.AffinityPath)
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("affinity without token: %d", r.StatusCode)
	}
	r, _ = http.Get(e.url + "/debug/state")
	r.Body.Close()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("debug without token: %d", r.StatusCode)
	}
}

func TestDebugStateFieldsAndReadiness(t *testing.T) {
	e := newEnv(t, "", 10)
	r, _ := http.Get(e.url + "/readyz")
	r.Body.Close()
	if r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("readyz before the first table: %d", r.StatusCode)
	}
	e.publish(t)
	r, _ = http.Get(e.url + "/readyz")
	r.Body.Close()
	if r.StatusCode != 200 {
		t.Fatalf("readyz: %d", r.StatusCode)
	}
	r, err := http.Get(e.url + "/debug/state")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	var st map[string]any
	if err := json.NewDecoder(r.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) []string {
		var k []string
		for n := range m {
			k = append(k, n)
		}
		slices.Sort(k)
		return k
	}
	if got := keys(st); !slices.Equal(got, []string{"budget", "replicas", "version"}) {
		t.Fatalf("top level %v", got)
	}
	reps := st["replicas"].([]any)
	rep := reps[0].(map[string]any)
	want := []string{"address", "capacity_tokens", "healthy", "homes", "id", "key_limit", "keys", "kv_events", "kv_usage", "model", "queue_tokens", "running", "speculative_keys", "state_age_ms", "text_keys", "token_keys", "waiting"}
	if got := keys(rep); !slices.Equal(got, want) {
		t.Fatalf("replica fields %v, want %v", got, want)
	}
	wantKV := []string{"batches", "clears", "connected", "decode_errors", "deferred_commits", "evicted_block_residency_s", "evicted_blocks_stored_again", "evicted_blocks_stored_again_fleet", "gaps", "last_event_age_ms", "last_seq", "removed_blocks", "stored_blocks"}
	if got := keys(rep["kv_events"].(map[string]any)); !slices.Equal(got, wantKV) {
		t.Fatalf("kv_events fields %v", got)
	}
	if got := keys(st["budget"].(map[string]any)); !slices.Equal(got, []string{"bytes", "dropped", "keys", "max_bytes", "max_keys", "max_replicas", "reclaims"}) {
		t.Fatalf("budget fields %v", got)
	}
	if len(reps) != 3 || rep["id"] != "a" || rep["model"] != "m" || rep["address"] != "10.0.0.1:8000" {
		t.Fatalf("replicas %v", reps)
	}
}

// binaryOf re-encodes a JSON report batch in the binary form current filters post.
func binaryOf(t *testing.T, batch string) string {
	rb, rejected, err := api.ParseReportBatch([]byte(batch))
	if err != nil || len(rejected) > 0 {
		t.Fatalf("test batch: %v %v", err, rejected)
	}
	b := api.AppendBatchHeader(nil, rb.Proxy)
	for i := range rb.Reports {
		b = rb.Reports[i].AppendBinary(b)
	}
	return string(b)
}

func FuzzReports(f *testing.F) {
	f.Add([]byte(`{"proxy":"p","reports":[{"kind":"placement","model":"m","replica":"10.0.0.1:8000","domain":1,"block_size":64,"stride":4,"blocks":8,"keys":[1,2],"predicted_cached_tokens":0,"at_ms":1}]}`))
	f.Add([]byte(`{"proxy":"p","reports":[{"kind":"outcome","model":"m","replica":"10.0.0.1:8000","domain":2,"block_size":16,"stride":4,"blocks":4,"keys":[9],"predicted_cached_tokens":64,"prompt_tokens":80,"cached_tokens":-1,"status":200,"at_ms":1}]}`))
	f.Add([]byte(`{"reports":[{"kind":"outcome","model":"m","replica":"10.0.0.2:8000","domain":1,"block_size":64,"stride":4,"blocks":4,"keys":[9],"predicted_cached_tokens":64,"prompt_tokens":80,"prompt_bytes":1,"cached_tokens":3,"status":503,"at_ms":1}]}`))
	f.Add([]byte(`{"reports":[`))
	ix := index.New(index.Config{})
	ix.SetReplicas([]index.Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000"}, {ID: "b", Model: "m", Addr: "10.0.0.2:8000", Events: true}}, time.Now())
	pub := publish.New(publish.Options{})
	reg := prometheus.NewRegistry()
	h := (&Server{Index: ix, Publisher: pub, Metrics: NewMetrics(reg), MaxBodyBytes: 1 << 16}).Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		req := httptest.NewRequestWithContext(context.Background(), http.MethodPost, api.ReportsPath, bytes.NewReader(body))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		switch w.Code {
		case 200, 400, 413:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		if w.Code != 200 && !json.Valid(w.Body.Bytes()) {
			t.Fatalf("error body is not JSON: %s", w.Body)
		}
		if ups := ix.Flush(time.Now(), false); ups != nil {
			if _, err := pub.Publish(ups, time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// Every path answers a method it does not take with 405 and an Allow header naming the
// ones it does (RFC 9110, 15.5.6).
func TestMethodRefusalsNameTheAllowedMethods(t *testing.T) {
	e := newEnv(t, "", 10)
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPost, api.TablePath, "GET, HEAD"},
		{http.MethodGet, api.ReportsPath, "POST"},
		{http.MethodPost, api.AffinityPath, "GET"},
		{http.MethodGet, api.SharesPath, "POST"},
		{http.MethodPost, "/debug/state", "GET"},
	} {
		req, err := http.NewRequest(c.method, e.url+c.path, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusMethodNotAllowed || r.Header.Get("Allow") != c.allow {
			t.Errorf("%s %s: %d, Allow %q; want 405, Allow %q", c.method, c.path, r.StatusCode, r.Header.Get("Allow"), c.allow)
		}
	}
}
