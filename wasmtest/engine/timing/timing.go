// Package timing is the simulator's cost model: how long one scheduler step takes on
// the simulated hardware. It is pure arithmetic on a [Profile]; nothing here reads a
// clock.
//
// A step that computes P uncached prompt tokens (any number of requests, chunked or
// not) and decodes one token for each of D sequences holding C context tokens in total
// takes
//
//	P x prefill_per_token + (D > 0 ? decode_step(C) : 0)
//	prefill_per_token = 2 x params / (GPUs x peak FLOP/s x MFU)               (compute bound)
//	decode_step(C)    = (weight bytes per GPU + C x KV bytes per token / GPUs)
//	                    / (HBM bandwidth x MBU)                                (memory bound)
//
// The two terms add, as docs/rule.md's fleet arithmetic adds prefill and decode
// replica-seconds; a step with prefill only pays no weight read (it is hidden under the
// compute), which keeps TTFT of a lone request = its uncached tokens x prefill_per_token,
// docs/rule.md's 570 ms cold / 143 ms warm.
//
// Not an API: kvroute's own, free to change in any release (README, "What is an API").
package timing

import (
	"fmt"
	"math"
	"time"
)

// Profile describes the simulated hardware, model and engine limits.
type Profile struct {
	Name string

	// Prefill (compute bound).
	Params    float64 // model parameters (FLOPs per token = 2 x Params)
	GPUs      int     // tensor-parallel degree
	PeakFLOPS float64 // per GPU, dense
	MFU       float64 // model FLOPs utilisation during prefill

	// Decode (memory bound).
	WeightBytesPerGPU float64 // weight bytes each GPU reads per step
	KVBytesPerToken   float64 // KV cache bytes per token, all layers, all GPUs
	HBMBandwidth      float64 // bytes/s per GPU
	MBU               float64 // memory bandwidth utilisation during decode

	// KV pool.
	PoolTokens int // KV capacity in tokens
	BlockSize  int // tokens per block (vLLM --block-size)

	// Engine limits (vLLM flags of the same names).
	MaxNumSeqs          int
	MaxNumBatchedTokens int // chunked-prefill token budget per step
	MaxModelLen         int
}

// Seed000 is docs/rule.md's replica: Llama 3.3 70B, FP8 weights, BF16 KV, TP=2 H200.
func Seed000() Profile {
	return Profile{
		Name:      "seed000",
		Params:    70.55e9,
		GPUs:      2,
		PeakFLOPS: 1979e12, // H200 dense FP8
		MFU:       0.50,    // docs/rule.md: assumed 50% MFU for prefill
		// 35.3 GB: half of the 70.55 GB FP8 weights on each of the 2 GPUs (docs/rule.md).
		WeightBytesPerGPU: 35.3e9,
		// 80 layers x 8 KV heads x 128 dims x 2 (K,V) x 2 B = 320 KiB per token (docs/rule.md).
		KVBytesPerToken: 327680,
		HBMBandwidth:    4.8e12,
		MBU:             0.75, // docs/rule.md: assumed 75% MBU for decode
		// docs/rule.md's worked example states 558,124 tokens for (2 x (141e9 x 0.92 - 3e9) - 70.55e9) / 327,680;
		// the formula gives 558,136 (see PoolTokensFromMemory). The seed's number is kept.
		PoolTokens:          558124,
		BlockSize:           16,
		MaxNumSeqs:          256,
		MaxNumBatchedTokens: 8192,
		MaxModelLen:         131072, // Llama 3.3's 128K context
	}
}

// Fast is a tiny profile for end-to-end tests: 10 us per prefill token, 1 ms per decode
// step plus 1 us per 1,000 context tokens, 4,096 blocks of 16 tokens.
func Fast() Profile {
	return Profile{
		Name:                "fast",
		Params:              1e9,
		GPUs:                1,
		PeakFLOPS:           2e14,
		MFU:                 1,
		WeightBytesPerGPU:   1e9,
		KVBytesPerToken:     1000,
		HBMBandwidth:        1e12,
		MBU:                 1,
		PoolTokens:          65536,
		BlockSize:           16,
		MaxNumSeqs:          64,
		MaxNumBatchedTokens: 8192,
		MaxModelLen:         32768,
	}
}

// ByName returns a built-in profile ("seed000" or "fast").
func ByName(name string) (Profile, error) {
	switch name {
	case "seed000":
		return Seed000(), nil
	case "fast":
		return Fast(), nil
	}
	return Profile{}, fmt.Errorf("unknown timing profile %q (want seed000 or fast)", name)
}

// Validate reports the first field that makes p unusable.
func (p Profile) Validate() error {
	switch {
	case p.Params <= 0 || p.GPUs <= 0 || p.PeakFLOPS <= 0 || p.MFU <= 0:
		return fmt.Errorf("profile %s: prefill parameters must be positive", p.Name)
	case p.WeightBytesPerGPU < 0 || p.KVBytesPerToken < 0 || p.HBMBandwidth <= 0 || p.MBU <= 0:
		return fmt.Errorf("profile %s: decode parameters must be positive", p.Name)
	case p.BlockSize <= 0:
		return fmt.Errorf("profile %s: block size %d must be positive", p.Name, p.BlockSize)
	case p.PoolTokens < 2*p.BlockSize:
		return fmt.Errorf("profile %s: pool of %d tokens is smaller than two blocks", p.Name, p.PoolTokens)
	case p.MaxNumSeqs <= 0 || p.MaxNumBatchedTokens <= 0 || p.MaxModelLen <= 0:
		return fmt.Errorf("profile %s: engine limits must be positive", p.Name)
	}
	return nil
}

// NumGPUBlocks is vLLM's num_gpu_blocks: the pool in whole blocks.
func (p Profile) NumGPUBlocks() int { return p.PoolTokens / p.BlockSize }

// PrefillSecondsPerToken = 2 x params / (GPUs x peak x MFU); docs/rule.md: 71.3 us.
func (p Profile) PrefillSecondsPerToken() float64 {
	return 2 * p.Params / (float64(p.GPUs) * p.PeakFLOPS * p.MFU)
}

// PrefillTime is the compute time of n uncached prompt tokens.
func (p Profile) PrefillTime(n int) time.Duration {
	return seconds(float64(n) * p.PrefillSecondsPerToken())
}

// DecodeStepSeconds is one decode step with ctxTokens context tokens summed over the
// batch; docs/rule.md: (35.3 GB + 64 x 8,150 x 327,680 B / 2) / (4.8e12 x 0.75) = 33.5 ms.
func (p Profile) DecodeStepSeconds(ctxTokens int) float64 {
	bytes := p.WeightBytesPerGPU + float64(ctxTokens)*p.KVBytesPerToken/float64(p.GPUs)
	return bytes / (p.HBMBandwidth * p.MBU)
}

// DecodeStep is [Profile.DecodeStepSeconds] as a duration.
func (p Profile) DecodeStep(ctxTokens int) time.Duration {
	return seconds(p.DecodeStepSeconds(ctxTokens))
}

// Step is the duration of a scheduler step (see the package comment). A step always
// takes at least 1 ns so simulated time advances.
func (p Profile) Step(prefillTokens, decodeSeqs, decodeCtxTokens int) time.Duration {
	s := float64(prefillTokens) * p.PrefillSecondsPerToken()
	if decodeSeqs > 0 {
		s += p.DecodeStepSeconds(decodeCtxTokens)
	}
	return max(seconds(s), 1)
}

// PoolTokensFromMemory is the KV pool implied by memory: (GPUs x (HBM x utilisation -
// overhead) - weight bytes) / KV bytes per token.
func PoolTokensFromMemory(gpus int, hbmBytes, utilisation, overheadBytes, weightBytes, kvBytesPerToken float64) int {
	return int((float64(gpus)*(hbmBytes*utilisation-overheadBytes) - weightBytes) / kvBytesPerToken)
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * 1e9)) }
