package server

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/shared/api"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each proxy's post of its admitted tokens is answered with the fleet's totals, its own
// and the others'; a body that is not a shares post is refused and counted.
func TestSharesPostsAreAnsweredWithTheFleetsTotals(t *testing.T) {
	e := newEnv(t, "", 10)
	postShares := func(body []byte) (int, map[uint64]float32) {
		t.Helper()
		res, err := http.Post(e.url+api.SharesPath, api.SharesContentType, bytes.NewReader(body))
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			return res.StatusCode, nil
		}
		assert.Equal(t, api.SharesContentType, res.Header.Get("Content-Type"))
		es, err := api.ParseShares(nil, b, api.MaxSharesAnswer)
		require.NoError(t, err)
		m := map[uint64]float32{}
		for _, x := range es {
			m[x.Key] = x.Tokens
		}
		return 200, m
	}
	noisy, team := api.TenantKey("noisy"), api.TenantKey("team")
	code, got := postShares(api.AppendShares(nil, []api.ShareEntry{{Key: noisy, Tokens: 8000}}))
	require.Equal(t, 200, code)
	assert.Equal(t, map[uint64]float32{noisy: 8000}, got)
	code, got = postShares(api.AppendShares(nil, []api.ShareEntry{{Key: noisy, Tokens: 8000}, {Key: team, Tokens: 2000}}))
	require.Equal(t, 200, code)
	assert.Equal(t, map[uint64]float32{noisy: 16000, team: 2000}, got)

	code, _ = postShares([]byte("not shares"))
	assert.Equal(t, http.StatusBadRequest, code)
	code, _ = postShares(api.AppendShares(nil, make([]api.ShareEntry, api.MaxSharePost+1)))
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	res, err := http.Get(e.url + api.SharesPath)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, res.StatusCode)
	p := e.server.Metrics.SharesPosts
	assert.Equal(t, 2.0, counted(p.WithLabelValues("accepted")))
	assert.Equal(t, 1.0, counted(p.WithLabelValues("bad_body")))
	assert.Equal(t, 1.0, counted(p.WithLabelValues("too_large")))
	assert.Equal(t, 1.0, counted(p.WithLabelValues("bad_method")))
	assert.Equal(t, 2.0, counted(e.server.Metrics.SharesTenants.WithLabelValues("added")))
}

func counted(c prometheus.Counter) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue()
}
