package server

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
)

var queries = []string{
	"", "version=5", "version=5&version=6", "wait_ms=10&version=7&model=m", "model=a%2Fb&version=1",
	"model=a+b", "model=%zz&model=ok", "version=1;model=x&model=y", "&&version=3&", "version", "version=",
	"ver%73ion=9", "model=%E2%82%AC", "=x&version=2", "version=1=2",
}

// queryGet is url.Values.Get of the parsed query.
func TestQueryGetIsURLQueryGet(t *testing.T) {
	for _, q := range queries {
		for _, k := range []string{"version", "model", "wait_ms", ""} {
			want := (&url.URL{RawQuery: q}).Query().Get(k)
			if got := queryGet(q, k); got != want {
				t.Errorf("%q %q: got %q, want %q", q, k, got, want)
			}
		}
	}
}

func FuzzQueryGet(f *testing.F) {
	for _, q := range queries {
		f.Add(q, "version")
	}
	f.Fuzz(func(t *testing.T, q, k string) {
		want := (&url.URL{RawQuery: q}).Query().Get(k)
		if got := queryGet(q, k); got != want {
			t.Fatalf("%q %q: got %q, want %q", q, k, got, want)
		}
	})
}

// A poll's own work allocates little: the query read in place, header values shared by
// every answer of a version, counters looked up once (not a query map, a slice per
// header, the labels' lookups, a context with its timer per long poll). The answers are
// written as the front's lean loop writes them, to one header map per connection,
// cleared between requests: a fresh map per answer would also count its growth past
// eight headers, which the front pays once a connection.
func TestTablePollAllocations(t *testing.T) {
	e := newEnv(t, "", 10)
	e.place(t, rand.New(rand.NewPCG(1, 2)), "m", "10.0.0.1:8000", 5)
	v1 := e.publish(t)
	e.place(t, rand.New(rand.NewPCG(3, 4)), "m", "10.0.0.1:8000", 5)
	v2 := e.publish(t)
	h := e.handler
	for _, c := range []struct {
		query string
		code  int
		max   float64
	}{
		{fmt.Sprintf("?version=%d&wait_ms=1000", v1), http.StatusOK, 6}, // 5 (the held header's value is one)
		{fmt.Sprintf("?version=%d", v2), http.StatusNotModified, 3},     // 2
	} {
		req := httptest.NewRequest(http.MethodGet, api.TablePath+c.query, nil)
		req.Header.Set(api.TableFormatsHeader, api.TableFormats)
		w := &connWriter{header: http.Header{}}
		h.ServeHTTP(w, req)
		if w.code != c.code {
			t.Fatalf("%s: %d", c.query, w.code)
		}
		n := testing.AllocsPerRun(100, func() {
			w.reset()
			h.ServeHTTP(w, req)
		})
		if n > c.max {
			t.Errorf("%s: %.0f allocations per poll, want at most %.0f", c.query, n, c.max)
		}
		t.Logf("%s: %.0f allocations", c.query, n)
	}
}

// connWriter is an http.ResponseWriter as the front's lean loop has one per connection:
// its header map is kept and cleared between answers; the body is dropped.
type connWriter struct {
	header http.Header
	code   int
}

func (w *connWriter) reset()              { clear(w.header); w.code = 0 }
func (w *connWriter) Header() http.Header { return w.header }
func (w *connWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}
func (w *connWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return len(b), nil
}

// A long poll ends when its client goes away, and a pooled deadline left behind does not
// end the next one early.
func TestLongPollEndsWithItsClient(t *testing.T) {
	e := newEnv(t, "", 10)
	v := e.publish(t)
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("%s%s?version=%d&wait_ms=30000", e.url, api.TablePath, v), nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := http.DefaultClient.Do(req.WithContext(ctx)); err == nil {
		t.Fatal("the poll returned before its client went away")
	}
	for range 3 {
		r := e.get(t, fmt.Sprintf("?version=%d&wait_ms=200", v), "")
		if r.code != http.StatusNotModified {
			t.Fatalf("%d", r.code)
		}
	}
	if time.Since(start) < 600*time.Millisecond {
		t.Fatal("a long poll ended before its deadline")
	}
}

// Format-2 filters following composed deltas hold the control plane's table exactly,
// replica churn and slot reuse included (the deltas patch replica lists).
func TestComposedFormat2DeltasMatchFull(t *testing.T) {
	e := newEnv(t, "", 50)
	rng := rand.New(rand.NewPCG(7, 8))
	var clients []*table.Table
	specs := []index.Spec{{ID: "a", Model: "m", Addr: "10.0.0.1:8000"}, {ID: "b", Model: "m", Addr: "10.0.0.2:8000"}, {ID: "c", Model: "n", Addr: "10.0.0.3:8000"}}
	for v := range 40 {
		e.place(t, rng, "m", "10.0.0.1:8000", 1+rng.IntN(4))
		if v%7 == 3 { // replicas leave and join: slots are reused by others
			rng.Shuffle(len(specs), func(i, j int) { specs[i], specs[j] = specs[j], specs[i] })
			n := 1 + rng.IntN(len(specs))
			specs = append(specs[:n:n], index.Spec{ID: fmt.Sprint("x", v), Model: "m", Addr: fmt.Sprintf("10.0.1.%d:8000", v)})
			e.ix.SetReplicas(specs, e.now)
		}
		e.publish(t)
		full := e.getFormats(t, "", api.TableFormats)
		c := table.New()
		if _, err := c.Apply(full.body); err != nil {
			t.Fatal(err)
		}
		want := table.EncodeFullFormat(c, table.FormatTiers)
		for _, old := range clients {
			r := e.getFormats(t, fmt.Sprintf("?version=%d", old.Version), api.TableFormats)
			if r.kind != "delta" {
				t.Fatalf("from %d: %s", old.Version, r.kind)
			}
			if _, err := old.Apply(r.body); err != nil {
				t.Fatalf("from %d: %v", old.Version, err)
			}
			if !bytes.Equal(table.EncodeFullFormat(old, table.FormatTiers), want) {
				t.Fatalf("v%d: a composed format-2 delta does not reproduce the table", c.Version)
			}
		}
		clients = append(clients, c)
	}
}
