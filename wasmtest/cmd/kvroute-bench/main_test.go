package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/fleet"
)

// tiny: a seconds-long GSP run on the fast profile.
var tiny = []string{"--workload", "gsp", "--profile", "fast", "--gsp-groups", "4", "--gsp-prompts-per-group", "8",
	"--gsp-system-prompt-len", "256", "--gsp-question-len", "32", "--gsp-output-len", "16", "--rate", "20", "--replicas", "2"}

func TestCompareTableAndJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.json")
	var out, errOut bytes.Buffer
	require.NoError(t, run(append(tiny, "--json", path, "--policies", "round-robin,kvroute,oracle"), &out, &errOut), errOut.String())
	s := out.String()
	assert.Contains(t, s, "workload  gsp: 4 groups x 8 prompts")
	assert.Contains(t, s, "replicas  2 (2 GPUs)")
	for _, p := range []string{"round-robin", "kvroute", "oracle"} {
		assert.Contains(t, s, p)
	}
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var doc struct {
		Workload string `json:"workload"`
		Replicas int    `json:"replicas"`
		Policies []struct {
			Name     string `json:"name"`
			Requests int    `json:"requests"`
		} `json:"policies"`
	}
	require.NoError(t, json.Unmarshal(b, &doc))
	assert.Equal(t, "gsp", doc.Workload)
	assert.Equal(t, 2, doc.Replicas)
	require.Len(t, doc.Policies, 3)
	assert.Equal(t, 32, doc.Policies[1].Requests)
}

func TestFindReplicas(t *testing.T) {
	var out bytes.Buffer
	args := append(tiny, "--find-replicas", "--slo-ttft-p95", "0.5", "--policies", "oracle,random")
	require.NoError(t, run(args, &out, &out), out.String())
	assert.Contains(t, out.String(), "fewest replicas with TTFT p95 <= 0.5 s (GPUs = replicas x 1)")
	assert.Regexp(t, `oracle\s+1\s+1\s`, out.String(), "one fast replica is plenty")
}

func TestFaultsAndHotFlags(t *testing.T) {
	var out bytes.Buffer
	args := []string{"--profile", "fast", "--duration", "5s", "--customers", "10", "--prompt-tokens", "400",
		"--shared-fraction", "0.5", "--output-tokens", "20", "--rate", "20", "--replicas", "3", "--hot",
		"--kill-replica", "2s:1", "--restart-replica", "3s", "--routers", "2", "--stale", "200", "--policies", "kvroute"}
	require.NoError(t, run(args, &out, &out), out.String())
	s := out.String()
	assert.Contains(t, s, "customer 0 sends 10%")
	assert.Contains(t, s, "kill replica 1 at 2s, restart replica 0 at 3s")
	assert.Contains(t, s, "2 routers")
	assert.Contains(t, s, "tables 200ms stale")
	assert.Contains(t, s, "hot customer (group 0)")
}

func TestBadFlags(t *testing.T) {
	cases := [][]string{
		{"--policies", "nope"},
		{"--workload", "nope"},
		{"--kill-replica", "soon"},
		{"--shared-fraction", "2"},
		{"--trace", "x.jsonl", "--trace-format", "other"},
		{"extra"},
	}
	for _, c := range cases {
		var out bytes.Buffer
		assert.Error(t, run(c, &out, &out), strings.Join(c, " "))
	}
}

func TestParseDuration(t *testing.T) {
	d, err := parseDuration("500", time.Millisecond)
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, d)
	d, err = parseDuration("1.5", time.Second)
	require.NoError(t, err)
	assert.Equal(t, 1500*time.Millisecond, d)
	d, err = parseDuration("2m", time.Second)
	require.NoError(t, err)
	assert.Equal(t, 2*time.Minute, d)
}

// svgTexts checks that path holds a well-formed SVG document and returns its text
// elements' contents.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	dec := xml.NewDecoder(bytes.NewReader(b))
	var texts []string
	var root string
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		require.NoError(t, err, "not well-formed XML")
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	require.Equal(t, "svg", root)
	return texts
}

// legendHas reports whether some text element starts with the policy's name and a
// space (the legend entry "NAME (...)"), so "kvroute" does not match "kvroute-wasm".
func legendHas(texts []string, policy string) bool {
	for _, s := range texts {
		if strings.HasPrefix(s, policy+" (") {
			return true
		}
	}
	return false
}

func TestPlotTTFT(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ttft.svg")
	var out bytes.Buffer
	require.NoError(t, run(append(tiny, "--plot", path), &out, &out), out.String())
	texts := svgTexts(t, path)
	for _, p := range fleet.Policies {
		assert.True(t, legendHas(texts, p), "no legend entry for %s in %q", p, texts)
	}
	assert.Contains(t, texts, "time to first token (s, log scale)")
	assert.Contains(t, texts, "TTFT per policy at 2 replicas (2 GPUs)")
}

func TestPlotSearch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "replicas.svg")
	var out bytes.Buffer
	args := append(tiny, "--find-replicas", "--slo-ttft-p95", "0.5", "--policies", "oracle,random,kvroute", "--plot", path)
	require.NoError(t, run(args, &out, &out), out.String())
	texts := svgTexts(t, path)
	for _, p := range []string{"oracle", "random", "kvroute"} {
		assert.True(t, legendHas(texts, p), "no legend entry for %s in %q", p, texts)
	}
	assert.Contains(t, texts, "oracle (1 replica)")
	assert.Contains(t, texts, "SLO: p95 ≤ 0.5 s")
}

func TestPlotFormat(t *testing.T) {
	var out bytes.Buffer
	err := run(append(tiny, "--plot", filepath.Join(t.TempDir(), "x.gif")), &out, &out)
	require.ErrorContains(t, err, "want a .svg, .png or .pdf file")
	assert.NotContains(t, out.String(), "policy", "the flag is checked before any simulation runs")
}
