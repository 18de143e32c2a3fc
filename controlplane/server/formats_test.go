package server

import (
	"io"
	"net/http"
	"testing"

	"github.com/kvroute/kvroute/controlplane/index"
	"github.com/kvroute/kvroute/shared/api"
	"github.com/kvroute/kvroute/shared/table"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTableFormatFromTheFiltersHeader(t *testing.T) {
	for header, want := range map[string]uint8{
		"": 1, "1": 1, "1,2": 2, " 2 ": 2, "1, 2, 3": 3, "3": 3, "3,2": 3, "x,,2": 2, "12": 1, "4": 4, "1,2,4": 4, "1,2,3,4": 4,
		"5": 1, "1,2,5": 2,
	} {
		assert.Equal(t, want, tableFormat(header), "%q", header)
	}
}

// Version skew over HTTP: a filter that sends no formats header (an older build) gets
// format 1 without the CPU-only key; one that lists 2 gets the tiers; one that lists 3
// the replicas' load as well, and one that lists 4 the homes too.
func TestTableFormatNegotiation(t *testing.T) {
	e := newEnv(t, "", 10)
	u := index.ModelUpdate{Name: "m", Reset: true, Tiers: []string{"CPU"},
		Config:   table.ModelConfig{BlockBytes: 64, BlockTokens: 16, Stride: 4, BytesPerToken: 4},
		Replicas: []table.Replica{{Slot: 0, ID: "a", Addr: "10.0.0.1:8000", Healthy: true, Running: 7, Busy: 0.5, MeanUncached: 900}}}
	u.Upserts.Add(10, 0)
	u.Upserts.Add(20, table.Holder(0, 1))
	u.Homes.Add(30, 0)
	_, err := e.pub.Publish([]index.ModelUpdate{u}, e.now)
	require.NoError(t, err)

	get := func(formats string) (*table.Table, *http.Response) {
		req, _ := http.NewRequest(http.MethodGet, e.url+api.TablePath, nil)
		if formats != "" {
			req.Header.Set(api.TableFormatsHeader, formats)
		}
		r, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		require.Equal(t, 200, r.StatusCode, "%s", b)
		tb := table.New()
		_, err = tb.Apply(b)
		require.NoError(t, err)
		return tb, r
	}
	old, r := get("")
	assert.Equal(t, uint8(table.FormatVersion), old.Format)
	assert.Equal(t, api.TableFormatsHeader, r.Header.Get("Vary"))
	assert.Equal(t, 1, old.Models["m"].Len(), "the CPU-only key is not in format 1")
	assert.Empty(t, old.Models["m"].Tiers)

	tiered, _ := get("1,2")
	assert.Equal(t, uint8(table.FormatTiers), tiered.Format)
	assert.Equal(t, []string{"CPU"}, tiered.Models["m"].Tiers)
	assert.Equal(t, []uint32{table.Holder(0, 1)}, tiered.Models["m"].Lookup(20))
	assert.Zero(t, tiered.Models["m"].Replicas[0].Running, "format 2 carries no load")

	loaded, _ := get("1,2,3")
	assert.Equal(t, uint8(table.FormatLoad), loaded.Format)
	assert.Zero(t, loaded.Models["m"].HomesLen(), "format 3 carries no homes")
	assert.Equal(t, []uint32{table.Holder(0, 1)}, loaded.Models["m"].Lookup(20))
	r0 := loaded.Models["m"].Replicas[0]
	assert.Equal(t, []any{7.0, 0.5, uint32(900)}, []any{r0.Running, r0.Busy, r0.MeanUncached})

	homed, _ := get(api.TableFormats)
	assert.Equal(t, uint8(table.FormatHomes), homed.Format)
	s, ok := homed.Models["m"].HomeOf(30)
	assert.True(t, ok && s == 0, "the home of key 30")
	assert.Equal(t, 2, homed.Models["m"].Len())
}
