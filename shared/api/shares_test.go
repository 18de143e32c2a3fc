package api

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSharesRoundTripAndRefuseBadBodies(t *testing.T) {
	es := []ShareEntry{{Key: TenantKey("a"), Tokens: 8000}, {Key: TenantKey("b"), Tokens: 0.5}}
	got, err := ParseShares(nil, AppendShares(nil, es), MaxSharePost)
	require.NoError(t, err)
	assert.Equal(t, es, got)
	assert.NotEqual(t, TenantKey("a"), AffinityKey(AffinityResponse, "a", nil), "a tenant's key is not an affinity key")

	good := AppendShares(nil, es)
	bad := map[string][]byte{
		"too short":      good[:3],
		"other magic":    append([]byte("KVAF"), good[4:]...),
		"other version":  append(append([]byte{}, good[:4]...), append([]byte{2}, good[5:]...)...),
		"partial entry":  good[:len(good)-1],
		"too many":       AppendShares(nil, make([]ShareEntry, 3)),
		"key 0":          AppendShares(nil, []ShareEntry{{Key: 0, Tokens: 1}}),
		"negative":       AppendShares(nil, []ShareEntry{{Key: 1, Tokens: -1}}),
		"not a number":   AppendShares(nil, []ShareEntry{{Key: 1, Tokens: float32(math.NaN())}}),
		"infinite count": AppendShares(nil, []ShareEntry{{Key: 1, Tokens: float32(math.Inf(1))}}),
	}
	for name, b := range bad {
		es, err := ParseShares(nil, b, 2)
		assert.Error(t, err, name)
		assert.Empty(t, es, name)
	}
}
