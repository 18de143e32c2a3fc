package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPyFloat(t *testing.T) {
	for v, want := range map[float64]string{-1: "-1.0", 2.5: "2.5", 0: "0.0", 1e-5: "1e-05", 0.0001: "0.0001", 1e16: "1e+16", 123456789012345678: "1.2345678901234568e+17", 0.1: "0.1", -3e-7: "-3e-07"} {
		assert.Equal(t, want, PyFloat(v), "%v", v)
	}
}

// vLLM's messages, from SamplingParams._verify_args (vllm/sampling_params.py @00388f65).
func TestSamplingVerify(t *testing.T) {
	for body, want := range map[string]string{
		`{"n":0}`:                    `{"message":"n must be at least 1, got 0.","type":"BadRequestError","param":null,"code":400}`,
		`{"n":20000}`:                `{"message":"n must be at most 16384, got 20000. To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable.","type":"BadRequestError","param":null,"code":400}`,
		`{"presence_penalty":3}`:     `{"message":"presence_penalty must be in [-2, 2], got 3.0.","type":"BadRequestError","param":null,"code":400}`,
		`{"frequency_penalty":-2.5}`: `{"message":"frequency_penalty must be in [-2, 2], got -2.5.","type":"BadRequestError","param":null,"code":400}`,
		`{"repetition_penalty":0}`:   `{"message":"repetition_penalty must be greater than zero, got 0.0.","type":"BadRequestError","param":null,"code":400}`,
		`{"temperature":-1}`:         `{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)","type":"BadRequestError","param":"temperature","code":400}`,
		`{"temperature":2.5}`:        `{"message":"temperature must be in [0, 2], got 2.5. (parameter=temperature, value=2.5)","type":"BadRequestError","param":"temperature","code":400}`,
		`{"top_p":2}`:                `{"message":"top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0)","type":"BadRequestError","param":"top_p","code":400}`,
		`{"top_p":0}`:                `{"message":"top_p must be in (0, 1], got 0.0. (parameter=top_p, value=0.0)","type":"BadRequestError","param":"top_p","code":400}`,
		`{"top_k":-2}`:               `{"message":"top_k must be 0 (disable), or at least 1, got -2.","type":"BadRequestError","param":null,"code":400}`,
		`{"min_p":1.5}`:              `{"message":"min_p must be in [0, 1], got 1.5.","type":"BadRequestError","param":null,"code":400}`,
		`{"min_tokens":-1}`:          `{"message":"min_tokens must be greater than or equal to 0, got -1.","type":"BadRequestError","param":null,"code":400}`,
		`{"min_tokens":20}`:          `{"message":"min_tokens must be less than or equal to max_tokens=16, got 20.","type":"BadRequestError","param":null,"code":400}`,
		`{"stop":["a",""]}`:          `{"message":"stop cannot contain an empty string.","type":"BadRequestError","param":null,"code":400}`,
	} {
		var p Sampling
		require.NoError(t, json.Unmarshal([]byte(body), &p))
		e := p.Verify(16)
		require.NotNil(t, e, body)
		assert.Equal(t, `{"error":`+want+`}`, string(e.JSON(Nested)), body)
	}
	var p Sampling
	require.NoError(t, json.Unmarshal([]byte(`{"n":3,"temperature":0,"top_p":1,"top_k":-1,"stop":"x","min_tokens":16}`), &p))
	assert.Nil(t, p.Verify(16))
	assert.Contains(t, p.Verify(0).Message, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)")
}
