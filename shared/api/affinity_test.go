package api

import (
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An outcome's affinity key rides at the end of its record (and as an optional JSON
// member): it parses back in both forms, and the record's bytes before it are exactly
// those of the same report without it, which a control plane that predates the field
// reads and then skips what follows (it ignores a record's trailing bytes, and JSON's
// unknown members).
func TestOutcomeCarriesItsAffinityKeyBackwardsCompatibly(t *testing.T) {
	with := goodReport()
	with.Affinity = AffinityKey(AffinityResponse, "acme", []byte("resp_1"))
	without := goodReport()

	rb, rejected, err := ParseReportBatch(with.AppendBinary(AppendBatchHeader(nil, "p")))
	require.NoError(t, err)
	require.Empty(t, rejected)
	assert.Equal(t, []Report{with}, rb.Reports)
	fromJSON, _, err := ParseReportBatch(AppendBatch(nil, "p", [][]byte{with.AppendJSON(nil)}))
	require.NoError(t, err)
	assert.Equal(t, rb, fromJSON)

	w, wo := with.AppendBinary(nil), without.AppendBinary(nil)
	require.Len(t, w, len(wo)+8)
	assert.Equal(t, wo[4:], w[4:len(wo)], "the fields an older reader knows, unchanged")

	var old struct {
		Kind string `json:"kind"`
		AtMs int64  `json:"at_ms"`
	}
	require.NoError(t, json.Unmarshal(with.AppendJSON(nil), &old), "an unknown member is ignored")

	// A placement never carries one.
	pl := goodReport()
	pl.Kind, pl.CachedTokens, pl.PromptTokens, pl.Status, pl.Affinity = KindPlacement, 0, 0, 0, 42
	rb, _, err = ParseReportBatch(pl.AppendBinary(AppendBatchHeader(nil, "p")))
	require.NoError(t, err)
	assert.Zero(t, rb.Reports[0].Affinity)
}

func TestAffinityAnswerParsesBackAndStopsAtATornEntry(t *testing.T) {
	b := AppendAffinityHead(nil, 7, 99)
	b = AppendAffinityEntry(b, 1, 250, "10.0.0.1:8000")
	b = AppendAffinityEntry(b, 2, 0, string(make([]byte, 256))) // not an address: left out
	b = AppendAffinityEntry(b, 3, 1<<31, "10.0.0.3:8000")
	epoch, next, got, err := ParseAffinityAnswer(b)
	require.NoError(t, err)
	assert.Equal(t, []uint64{7, 99}, []uint64{epoch, next})
	assert.Equal(t, []AffinityEntry{{1, 250, "10.0.0.1:8000"}, {3, 1 << 31, "10.0.0.3:8000"}}, got)

	_, _, entries, _ := ParseAffinityHead(b[:len(b)-1])
	_, _, _, rest, ok := NextAffinityEntry(entries)
	require.True(t, ok)
	_, _, _, _, ok = NextAffinityEntry(rest)
	assert.False(t, ok, "torn")

	bad := append([]byte(nil), b...)
	bad[4] = 2
	_, _, _, err = ParseAffinityHead(bad)
	assert.Error(t, err, "another version")
	_, _, _, err = ParseAffinityHead(b[:AffinityHeadLen-1])
	assert.Error(t, err)
	assert.Equal(t, uint64(99), binary.LittleEndian.Uint64(b[AffinityHeadLen-8:]))
}

func FuzzParseAffinityAnswer(f *testing.F) {
	f.Add(AppendAffinityEntry(AppendAffinityHead(nil, 1, 2), 3, 4, "10.0.0.1:8000"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, entries, err := ParseAffinityHead(b)
		if err != nil {
			return
		}
		for {
			_, _, addr, rest, ok := NextAffinityEntry(entries)
			if !ok {
				return
			}
			require.LessOrEqual(t, len(addr), 255)
			require.Less(t, len(rest), len(entries))
			entries = rest
		}
	})
}
