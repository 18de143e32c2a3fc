package timing

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

func TestSeed000Numbers(t *testing.T) {
	p := Seed000()
	require.NoError(t, p.Validate())
	// docs/rule.md's worked example: prefill per tok = 2 x 70.55e9 / (2 x 1979e12 x 0.50) = 71.3 us.
	assert.InDelta(t, 71.3e-6, p.PrefillSecondsPerToken(), 0.05e-6)
	// TTFT compute = 8,000 x 71.3 us = 570 ms cold, 2,000 x 71.3 us = 143 ms warm; a hit saves 428 ms.
	assert.InDelta(t, 570, ms(p.PrefillTime(8000)), 0.5)
	assert.InDelta(t, 143, ms(p.PrefillTime(2000)), 0.5)
	assert.InDelta(t, 428, ms(p.PrefillTime(8000)-p.PrefillTime(2000)), 0.5)
	// Decode at batch 64 and 8,150 tokens of context: 33.5 ms.
	assert.InDelta(t, 33.5, ms(p.DecodeStep(64*8150)), 0.05)
	// 64 / 33.5 ms = 1,908 tok/s per replica.
	assert.InDelta(t, 1908, 64/p.DecodeStepSeconds(64*8150), 1)
	// KV pool: 558,124 tokens -> 34,882 blocks of 16.
	assert.Equal(t, 558124, p.PoolTokens)
	assert.Equal(t, 34882, p.NumGPUBlocks())
	// The memory formula agrees with the seed's pool to within 0.01% (558,136 vs 558,124).
	fromMem := PoolTokensFromMemory(2, 141e9, 0.92, 3e9, 70.55e9, 327680)
	assert.InEpsilon(t, float64(p.PoolTokens), float64(fromMem), 1e-4)
	assert.Equal(t, 327680.0, p.KVBytesPerToken, "320 KiB per token")
}

func TestStep(t *testing.T) {
	p := Seed000()
	cases := []struct {
		name                  string
		prefill, decodes, ctx int
		wantMS                float64
	}{
		{"prefill only pays no weight read", 8000, 0, 0, 570.39},
		{"decode only", 0, 64, 64 * 8150, 33.54},
		{"mixed adds both", 2000, 64, 64 * 8150, 142.60 + 33.54},
		{"single decode is the weight read", 0, 1, 8001, 9.81 + 8001*163840/3.6e12*1e3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.InDelta(t, c.wantMS, ms(p.Step(c.prefill, c.decodes, c.ctx)), 0.01)
		})
	}
	assert.Equal(t, time.Duration(1), p.Step(0, 0, 0), "a step always advances time")
}

func TestFastProfile(t *testing.T) {
	p := Fast()
	require.NoError(t, p.Validate())
	assert.InDelta(t, 10e-6, p.PrefillSecondsPerToken(), 1e-12)
	assert.Equal(t, time.Millisecond, p.DecodeStep(0))
	assert.GreaterOrEqual(t, p.PoolTokens, p.MaxModelLen, "any admissible request fits the pool")
}

func TestByNameAndValidate(t *testing.T) {
	for _, n := range []string{"seed000", "fast"} {
		p, err := ByName(n)
		require.NoError(t, err)
		assert.Equal(t, n, p.Name)
	}
	_, err := ByName("h100")
	assert.Error(t, err)
	bad := Fast()
	bad.BlockSize = 0
	assert.Error(t, bad.Validate())
	bad = Fast()
	bad.PoolTokens = 16
	assert.Error(t, bad.Validate())
}
