package api

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const withClasses = `{"control_plane":{"cluster":"c","authority":"a"},"overload":{
	"classes":[{"name":"critical","ttft_budget_ms":2000,"critical":true},{"name":"standard","ttft_budget_ms":5000},{"name":"sheddable","ttft_budget_ms":30000}],
	"class_header":"X-Kvroute-Class","default_class":"standard","tenant_classes":{"batch":"sheddable"},"tenant_weights":{"noisy":0.5}}}`

func TestOverloadParsesAndIsOffByDefault(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	require.NoError(t, err)
	assert.False(t, c.Overload.Enabled(), "no classes: overload off")
	assert.Zero(t, c.Overload.PrefillTokensPerSecond, "and nothing filled in")

	c, err = ParseConfig([]byte(withClasses))
	require.NoError(t, err)
	assert.True(t, c.Overload.Enabled())
	assert.Equal(t, "x-kvroute-class", c.Overload.ClassHeader, "header names are kept lower case")
	assert.Equal(t, float64(DefaultPrefillTokensPerSecond), c.Overload.PrefillTokensPerSecond)
	assert.Equal(t, 2, c.Overload.ClassIndex("sheddable"))
	assert.Equal(t, -1, c.Overload.ClassIndex("gold"))
}

func TestOverloadConfigErrors(t *testing.T) {
	cp := `{"control_plane":{"cluster":"c","authority":"a"},"overload":`
	cases := map[string]struct{ json, want string }{
		"a class header without classes":         {cp + `{"class_header":"x-class"}}`, "need overload.classes"},
		"a class name that cannot name a metric": {cp + `{"classes":[{"name":"Gold Tier","ttft_budget_ms":1}]}}`, "want 1 to 32 of [a-z0-9_]"},
		"a class listed twice":                   {cp + `{"classes":[{"name":"a","ttft_budget_ms":1},{"name":"a","ttft_budget_ms":1}],"default_class":"a"}}`, "listed twice"},
		"no budget":                              {cp + `{"classes":[{"name":"a"}]}}`, "ttft_budget_ms must be positive"},
		"several classes, no default":            {cp + `{"classes":[{"name":"a","ttft_budget_ms":1},{"name":"b","ttft_budget_ms":1}]}}`, "default_class"},
		"a tenant's unknown class":               {cp + `{"classes":[{"name":"a","ttft_budget_ms":1}],"tenant_classes":{"t":"gold"}}}`, `class "gold"`},
		"a weight of zero":                       {cp + `{"classes":[{"name":"a","ttft_budget_ms":1}],"tenant_weights":{"t":0}}}`, "tenant_weights"},
		"a critical class with a shed limit":     {cp + `{"classes":[{"name":"a","ttft_budget_ms":1,"critical":true,"shed_above_ms":5}]}}`, "shed_above_ms"},
		"a negative fairness hold":               {cp + `{"classes":[{"name":"a","ttft_budget_ms":1}],"fairness_hold_ms":-1}}`, "fairness_hold_ms"},
		"a fairness hold past a minute":          {cp + `{"classes":[{"name":"a","ttft_budget_ms":1}],"fairness_hold_ms":60001}}`, "fairness_hold_ms"},
		"a fairness hold without classes":        {cp + `{"fairness_hold_ms":2000}}`, "need overload.classes"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseConfig([]byte(c.json))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestClassComesFromTheHeaderThenTheTenantThenTheDefault(t *testing.T) {
	c, err := ParseConfig([]byte(withClasses))
	require.NoError(t, err)
	cases := []struct {
		name, header, tenant string
		want                 int
	}{
		{"the header names a class", "critical", "batch", 0},
		{"a header naming no class is ignored", "gold", "batch", 2},
		{"the tenant's class", "", "batch", 2},
		{"the default", "", "acme", 1},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) { assert.Equal(t, k.want, c.Overload.ClassOf(k.header, k.tenant)) })
	}
}
