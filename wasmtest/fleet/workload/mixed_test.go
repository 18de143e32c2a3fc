package workload

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A mixed workload is its base's arrivals and prompts, each request with a tenant and a
// class drawn by the parts' shares.
func TestMixedSplitsTheBaseByShare(t *testing.T) {
	c := DefaultSeed()
	c.Customers, c.Rate, c.Duration = 20, 100, 100*time.Second
	base, err := NewSeed(c)
	require.NoError(t, err)
	m, err := NewMixed(base, DefaultParts(), 7)
	require.NoError(t, err)
	require.Equal(t, base.Len(), m.Len())
	count := map[string]int{}
	src, bsrc := m.NewSource(), base.NewSource()
	for i := range m.Len() {
		at, g := m.Arrival(i)
		bat, bg := base.Arrival(i)
		require.Equal(t, bat, at)
		require.Equal(t, bg, g)
		p := m.Part(i)
		count[p.Tenant]++
		if i < 50 {
			r, br := src.Request(i), bsrc.Request(i)
			assert.Equal(t, string(br.Body), string(r.Body))
			assert.Equal(t, p.Tenant, r.Tenant)
			assert.Equal(t, p.Class, r.Class)
		}
	}
	for _, p := range DefaultParts() {
		assert.InDelta(t, p.Share, float64(count[p.Tenant])/float64(m.Len()), 0.02, p.Tenant)
	}
	_, err = NewMixed(base, nil, 1)
	assert.Error(t, err)
}
