package version

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/metrics"
)

func TestBehavioursByRelease(t *testing.T) {
	for _, c := range []struct {
		v      string
		nested bool
		enc    kvevents.Encoding
		legacy bool
	}{
		{"0.9.0", false, kvevents.ArrayV09, true},
		{"0.10.0", false, kvevents.ArrayV010, true},
		{"0.10.1", true, kvevents.ArrayV010, true},
		{"0.23.0", true, kvevents.Array, true},
		{"0.24.0", true, kvevents.Map, true},
		{"0.25.1", true, kvevents.Map, true},
		{"v0.26.0", true, kvevents.Map, false},
	} {
		v, err := Parse(c.v)
		require.NoError(t, err)
		assert.Equal(t, c.nested, v.NestedErrors(), c.v)
		assert.Equal(t, c.legacy, v.LegacyReplay(), c.v)
		enc, err := v.EventEncoding()
		require.NoError(t, err, c.v)
		assert.Equal(t, c.enc, enc, c.v)
	}
	_, err := MustParse("0.11.0").EventEncoding()
	assert.Error(t, err, "0.11's layout is not modelled")
	_, err = Parse("0.x")
	assert.Error(t, err)
	assert.Equal(t, Default, Version{}.OrDefault().String())
}

func TestTPOTMode(t *testing.T) {
	assert.Equal(t, metrics.TPOTOnly, MustParse("0.10.2").TPOT())
	assert.Equal(t, metrics.TPOTDeprecated, MustParse("0.11.1").TPOT())
	assert.Equal(t, metrics.TPOTHidden, MustParse("0.12.0").TPOT())
	assert.Equal(t, metrics.TPOTHidden, MustParse(Default).TPOT())
}

func TestParseSGLang(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string
	}{{"main", "main"}, {"", "main"}, {"0.4.7", "0.5.0rc0"}, {"v0.4.10", "0.5.0rc0"}, {"0.5.0rc0", "0.5.0rc0"}} {
		v, err := ParseSGLang(c.in)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, v.String(), c.in)
	}
	for _, in := range []string{"0.4.6", "0.5.0", "0.5.6", "1.0", "latest"} {
		_, err := ParseSGLang(in)
		assert.ErrorContains(t, err, "not modelled", in)
	}
	var zero SGLang
	assert.True(t, zero.NewLabels(), "the zero value is main")
	old, _ := ParseSGLang("0.5.0rc0")
	assert.False(t, old.NewLabels())
	assert.True(t, old.Radix(1).SplitEvents)
	assert.True(t, zero.Radix(16).RemovePerNode)
}
