package server

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/prefix"
)

// An outcome's affinity key, posted by proxy a in a binary batch, is served to proxy b
// and not back to a; b's cursor then answers nothing new, and a cursor of another
// epoch (a poll that moved from another replica) gets everything again.
func TestReportedAffinityIsServedToTheOtherProxies(t *testing.T) {
	e := newEnv(t, "", 10)
	key := api.AffinityKey(api.AffinityResponse, "", []byte("resp_1"))
	r := api.Report{Kind: api.KindOutcome, Model: "m", Replica: "10.0.0.2:8000", Domain: prefix.Text, BlockSize: 64, Stride: 4,
		Status: 200, CachedTokens: -1, Affinity: key}
	code, m := post(t, e.url+api.ReportsPath, api.ReportsContentType, "", r.AppendBinary(api.AppendBatchHeader(nil, "proxy-a")))
	require.Equal(t, 200, code, "%v", m)
	e.now = e.now.Add(1500 * time.Millisecond)

	poll := func(since, epoch uint64, proxy string) (uint64, uint64, []string) {
		t.Helper()
		res, err := http.Get(fmt.Sprintf("%s%s?since=%d&epoch=%d&proxy=%d", e.url, api.AffinityPath, since, epoch, api.ProxyKey(proxy)))
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		require.Equal(t, 200, res.StatusCode, "%s", b)
		assert.Equal(t, api.AffinityContentType, res.Header.Get("Content-Type"))
		ep, next, es, err := api.ParseAffinityAnswer(b)
		require.NoError(t, err)
		var out []string
		for _, x := range es {
			out = append(out, fmt.Sprintf("%x %d %s", x.Key, x.AgeMs, x.Replica))
		}
		return ep, next, out
	}
	want := []string{fmt.Sprintf("%x 1500 10.0.0.2:8000", key)}
	epoch, next, got := poll(0, 0, "proxy-b")
	assert.Equal(t, e.pub.Epoch(), epoch)
	assert.Equal(t, want, got)
	_, _, got = poll(next, epoch, "proxy-b")
	assert.Empty(t, got, "nothing new")
	_, _, got = poll(next, epoch+1, "proxy-b")
	assert.Equal(t, want, got, "another epoch: from the start")
	_, _, got = poll(0, 0, "proxy-a")
	assert.Empty(t, got, "not echoed to the proxy that learned it")

	res, err := http.Get(e.url + api.AffinityPath + "?since=-1")
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, 400, res.StatusCode)
}
