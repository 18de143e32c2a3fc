package api

import (
	"encoding/binary"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/shared/prefix"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const minimal = `{"control_plane":{"cluster":"outbound|8080||cp.kvroute-system.svc.cluster.local","authority":"cp.kvroute-system.svc.cluster.local"}}`

func TestParseConfigFillsDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, DefaultEndpointHeader, c.EndpointHeader)
	assert.Equal(t, 100, c.ControlPlane.PollMs)
	assert.Equal(t, 64, c.BlockBytes)
	assert.Equal(t, 16, c.BlockTokens)
	assert.Equal(t, PolicyShared, c.Tenants.DefaultPolicy)
	p := c.RuleParams()
	assert.Equal(t, 1.0, p.MaxKVUsage, "the KV guard is off unless configured (shared/rule: it caused the thrashing it was meant to prevent)")
	assert.Equal(t, 2*time.Second, p.MaxStateAge)
	assert.Equal(t, 3, p.MaxEndpoints)
}

func TestParseConfigErrors(t *testing.T) {
	cases := map[string]struct {
		json string
		want []string
	}{
		"empty":             {``, []string{"control_plane.cluster"}},
		"not json":          {`{`, []string{"plugin config"}},
		"unknown field":     {`{"control_plane":{"cluster":"c","authority":"a"},"endpoint_headr":"x"}`, []string{"unknown field"}},
		"missing authority": {`{"control_plane":{"cluster":"c"}}`, []string{"control_plane.authority"}},
		"isolated needs a secret": {
			`{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"header":"x-tenant","policies":{"acme":"isolated"}}}`,
			[]string{"tenants.secret"},
		},
		"bad policy and bad header, reported together": {
			`{"control_plane":{"cluster":"c","authority":"a"},"endpoint_header":"bad header","tenants":{"default_policy":"private"}}`,
			[]string{"endpoint_header", "tenant policy \"private\""},
		},
		"a tenant header without the header source": {
			`{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"header":"x-tenant"}}`,
			[]string{`tenants.header "x-tenant" is read only with tenants.source "header"`},
		},
		"the header source without a header": {
			`{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"source":"header"}}`,
			[]string{`tenants.source "header" needs tenants.header`},
		},
		"an unknown tenant source": {
			`{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"source":"cookie"}}`,
			[]string{`tenants.source "cookie"`},
		},
		"an unsalted path that is not a path": {
			`{"control_plane":{"cluster":"c","authority":"a"},"tenants":{"unsalted_paths":["v1/embeddings"]}}`,
			[]string{"tenants.unsalted_paths"},
		},
		"guards out of range": {
			`{"control_plane":{"cluster":"c","authority":"a"},"guards":{"max_kv_usage":1.5}}`,
			[]string{"max_kv_usage"},
		},
		"trailing data": {minimal + `{}`, []string{"trailing"}},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.json))
			require.Error(t, err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestTenantSaltFollowsPolicy(t *testing.T) {
	c, err := ParseConfig([]byte(`{"control_plane":{"cluster":"c","authority":"a"},
		"tenants":{"source":"header","header":"X-Tenant","secret":"s3cret","policies":{"acme":"isolated","globex":"shared"}}}`))
	require.NoError(t, err)
	assert.Equal(t, "x-tenant", c.Tenants.Header, "header names are lower-cased as Envoy stores them")
	s, isolated := c.TenantSalt("acme")
	assert.True(t, isolated)
	assert.Equal(t, prefix.TenantSalt([]byte("s3cret"), "acme"), s)
	_, isolated = c.TenantSalt("globex")
	assert.False(t, isolated)
	_, isolated = c.TenantSalt("unknown")
	assert.False(t, isolated, "default policy is shared")
}

func goodReport() Report {
	return Report{Kind: KindOutcome, Model: "llama", Replica: "10.0.0.1:8000", Domain: prefix.Text,
		BlockSize: 64, Stride: 4, Blocks: 9, Keys: []uint64{1, 2}, PromptTokens: 150, CachedTokens: 128, AtMs: 1}
}

func TestReportValidate(t *testing.T) {
	require.NoError(t, func() error { r := goodReport(); return r.Validate() }())
	cases := map[string]func(*Report){
		"kind":            func(r *Report) { r.Kind = "guess" },
		"model":           func(r *Report) { r.Model = "" },
		"replica":         func(r *Report) { r.Replica = "" },
		"domain":          func(r *Report) { r.Domain = 9 },
		"stride":          func(r *Report) { r.Stride = 0 },
		"keys vs blocks":  func(r *Report) { r.Blocks = 20 },
		"negative cached": func(r *Report) { r.CachedTokens = -2 },
		"start of blocks": func(r *Report) { r.Kind = KindStart },
	}
	for name, mut := range cases {
		t.Run(name, func(t *testing.T) {
			r := goodReport()
			mut(&r)
			assert.Error(t, r.Validate())
		})
	}
}

func TestAppendBatchParsesBack(t *testing.T) {
	r1, r2 := goodReport(), goodReport()
	r2.Kind = KindPlacement
	r2.Keys = []uint64{^uint64(0), 1 << 63} // full 64-bit keys survive JSON
	var enc [][]byte
	for _, r := range []Report{r1, r2} {
		b, err := json.Marshal(r)
		require.NoError(t, err)
		enc = append(enc, b)
	}
	b := AppendBatch(nil, `proxy "7"`, enc)
	rb, rejected, err := ParseReportBatch(b)
	require.NoError(t, err)
	assert.Empty(t, rejected)
	assert.Equal(t, `proxy "7"`, rb.Proxy)
	assert.Equal(t, []Report{r1, r2}, rb.Reports)
}

func TestParseReportBatchDropsBadReportsAloneAndIgnoresUnknownFields(t *testing.T) {
	good, err := json.Marshal(goodReport())
	require.NoError(t, err)
	newer := []byte(`{"kind":"outcome","model":"llama","replica":"10.0.0.1:8000","domain":1,"block_size":64,"stride":4,` +
		`"blocks":9,"keys":[1,2],"prompt_tokens":150,"cached_tokens":128,"at_ms":1,"field_from_a_newer_filter":true}`)
	rb, rejected, err := ParseReportBatch(AppendBatch(nil, "p", [][]byte{good, []byte(`{"kind":"outcome"}`), newer}))
	require.NoError(t, err)
	assert.Len(t, rb.Reports, 2, "the good report and the newer filter's report are kept")
	require.Len(t, rejected, 1)
	assert.ErrorContains(t, rejected[0], "report 1")

	_, _, err = ParseReportBatch([]byte(`{"proxy":"p","reports":{}}`))
	assert.Error(t, err, "not a batch")
	_, _, err = ParseReportBatch([]byte(`not json`))
	assert.Error(t, err)
}

func TestAppendJSONIsWhatEncodingJSONWrites(t *testing.T) {
	cases := []Report{
		goodReport(),
		{Kind: KindPlacement, Model: "m \"quoted\" \u2028", Replica: "[::1]:80", Domain: prefix.Token, BlockSize: 16, Stride: 1,
			Blocks: 2, Keys: []uint64{0, ^uint64(0)}, PredictedCachedTokens: 16, AtMs: -5},
		{Kind: KindOutcome, Model: "m", Replica: "r", Domain: prefix.Text, BlockSize: 64, Stride: 4, CachedTokens: -1, Status: 503},
		{Kind: KindPlacement, Model: "m", Replica: "r", Domain: prefix.Text, BlockSize: 64, Stride: 4, Starts: true},
		{Kind: KindStart, Model: "m", Replica: "r", Domain: prefix.Text, BlockSize: 64, Stride: 4, Placement: ^uint64(0), AtMs: 9},
	}
	for _, r := range cases {
		want, err := json.Marshal(r)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(r.AppendJSON(nil)))
	}
}

func BenchmarkAppendJSON(b *testing.B) {
	r := goodReport()
	r.Keys = make([]uint64, 125)
	for i := range r.Keys {
		r.Keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	r.Blocks = 500
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendJSON(buf[:0])
	}
}

func TestBinaryBatchParsesBackAndKeepsBadRecordsApart(t *testing.T) {
	r1, r2 := goodReport(), goodReport()
	r2.Kind, r2.CachedTokens, r2.PromptTokens, r2.Status = KindPlacement, 0, 0, 0
	r2.Keys = []uint64{^uint64(0), 1 << 63}
	r2.Starts = true
	r3 := goodReport()
	r3.CachedTokens, r3.AtMs = -1, -7
	r4 := Report{Kind: KindStart, Model: "llama", Replica: "10.0.0.1:8000", Domain: prefix.Text, BlockSize: 64, Stride: 4,
		Placement: r2.PlacementID(), AtMs: 12}
	b := AppendBatchHeader(nil, `proxy "7"`)
	for _, r := range []Report{r1, r2, r3, r4} {
		b = r.AppendBinary(b)
	}
	rb, rejected, err := ParseReportBatch(b)
	require.NoError(t, err)
	assert.Empty(t, rejected)
	assert.Equal(t, `proxy "7"`, rb.Proxy)
	assert.Equal(t, []Report{r1, r2, r3, r4}, rb.Reports)

	// A record of an unknown kind, and one with bytes a newer filter added at its end.
	bad := goodReport()
	bad.Kind = "future"
	newer := r1.AppendBinary(nil)
	newer = append(newer, 0xAA, 0xBB)
	binary.LittleEndian.PutUint32(newer, uint32(len(newer)-4))
	b = AppendBatchHeader(nil, "p")
	b = bad.AppendBinary(b)
	b = append(b, newer...)
	rb, rejected, err = ParseReportBatch(b)
	require.NoError(t, err)
	require.Len(t, rb.Reports, 1)
	assert.Equal(t, r1, rb.Reports[0])
	require.Len(t, rejected, 1)
	assert.ErrorContains(t, rejected[0], "report 0")

	// Truncations anywhere are an error, never a panic.
	full := AppendBatchHeader(nil, "p")
	full = r1.AppendBinary(full)
	for n := len(batchMagic); n < len(full); n++ {
		rb, _, err := ParseReportBatch(full[:n])
		if err == nil {
			assert.Empty(t, rb.Reports, "a cut at %d", n)
		}
	}
}

// Version skew: the control plane takes the JSON form of filters from before the binary
// one, and the same reports arrive either way.
func TestJSONAndBinaryBatchesCarryTheSameReports(t *testing.T) {
	rs := []Report{goodReport(), goodReport(), goodReport()}
	rs[1].Kind, rs[1].CachedTokens, rs[1].PromptTokens, rs[1].Status, rs[1].Starts = KindPlacement, 0, 0, 0, true
	rs[2] = Report{Kind: KindStart, Model: "llama", Replica: "10.0.0.1:8000", Domain: prefix.Text, BlockSize: 64, Stride: 4,
		Placement: rs[1].PlacementID(), AtMs: 12}
	var enc [][]byte
	bin := AppendBatchHeader(nil, "p")
	for i := range rs {
		enc = append(enc, rs[i].AppendJSON(nil))
		bin = rs[i].AppendBinary(bin)
	}
	fromJSON, rej1, err1 := ParseReportBatch(AppendBatch(nil, "p", enc))
	fromBin, rej2, err2 := ParseReportBatch(bin)
	require.NoError(t, err1)
	require.NoError(t, err2)
	assert.Empty(t, rej1)
	assert.Empty(t, rej2)
	assert.Equal(t, fromJSON, fromBin)
	assert.Less(t, len(bin)*2, len(AppendBatch(nil, "p", enc)), "binary is well under half the JSON")
}

func FuzzParseReportBatch(f *testing.F) {
	r := goodReport()
	f.Add(r.AppendBinary(AppendBatchHeader(nil, "p")))
	f.Add(AppendBatch(nil, "p", [][]byte{r.AppendJSON(nil)}))
	start := Report{Kind: KindStart, Model: "llama", Replica: "10.0.0.1:8000", Domain: prefix.Text, BlockSize: 64, Stride: 4,
		Placement: r.PlacementID(), AtMs: 12}
	f.Add(start.AppendBinary(AppendBatchHeader(nil, "p")))
	f.Fuzz(func(t *testing.T, b []byte) {
		rb, _, err := ParseReportBatch(b)
		if err != nil {
			return
		}
		for i := range rb.Reports {
			require.NoError(t, rb.Reports[i].Validate())
		}
	})
}

func BenchmarkAppendBinary(b *testing.B) {
	r := goodReport()
	r.Keys = make([]uint64, 125)
	for i := range r.Keys {
		r.Keys[i] = uint64(i) * 0x9e3779b97f4a7c15
	}
	r.Blocks = 500
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = r.AppendBinary(buf[:0])
	}
}
