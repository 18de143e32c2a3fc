package version

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/wasmtest/engine/kvevents"
	"github.com/kvroute/kvroute/wasmtest/engine/radix"
	"github.com/kvroute/kvroute/wasmtest/engine/sched"
	"github.com/kvroute/kvroute/wasmtest/engine/timing"
)

// SGLangDefault is what --sglang-version imitates unless told otherwise: SGLang's main
// branch as read on 2026-07-20.
const SGLangDefault = "main"

// SGLang is an SGLang revision (--sglang-version) and what changed between them, each
// switch citing the SGLang change it follows (PR numbers are sgl-project/sglang):
//
//		revision          page hash, root parent       medium  BlockRemoved  split events  metrics
//		0.4.7-0.5.0rc0    hash(tuple(page)), hash(())  none    one per page  yes           old labels
//		main              SHA-256 chain, None          "GPU"   one per node  none          new labels
//
//	  - Page hashes: #6824 (June 2025) published CPython's hash() of each page's tokens,
//	    #13488 (v0.5.6) a SHA-256 chain; the root's children named hash(()) as their
//	    parent until #9030 made it None (radix_cache.py @95769b28 and @006b0e3d; package
//	    radix has the details).
//	  - medium "GPU" on BlockStored and BlockRemoved: #18205; one BlockRemoved per radix
//	    node: #29265; no events on a node split: #13488.
//	  - Metrics (python/sglang/srt/metrics/collector.py and the scheduler's labels):
//	    scheduler gauges gain moe_ep_rank, tokenizer metrics engine_type,
//	    cached_tokens_total a cache_source label; sglang:max_total_num_tokens and
//	    sglang:page_size are new gauges; E2E latency buckets end at 800 s in 0.4.7-0.5.0rc0
//	    and at 2400 s later (package metrics, SGLangMetrics).
//
// The revisions in between (0.5.0 to main) mix these changes in ways not modelled
// here, so they are refused. The zero SGLang is main.
type SGLang struct{ old bool }

// ParseSGLang reads "main", or a release from 0.4.7 to 0.5.0rc0 ("v" prefix allowed).
func ParseSGLang(s string) (SGLang, error) {
	v := strings.TrimPrefix(strings.TrimSpace(s), "v")
	if v == "" || v == "main" {
		return SGLang{}, nil
	}
	if v == "0.5.0rc0" {
		return SGLang{old: true}, nil
	}
	parts := strings.Split(v, ".")
	if len(parts) == 3 && parts[0] == "0" && parts[1] == "4" {
		if p, err := strconv.Atoi(parts[2]); err == nil && p >= 7 {
			return SGLang{old: true}, nil
		}
	}
	return SGLang{}, fmt.Errorf("sglang version %q: not modelled (0.4.7 to 0.5.0rc0, and main, are)", s)
}

func (v SGLang) String() string {
	if v.old {
		return "0.5.0rc0"
	}
	return "main"
}

// Radix returns the radix cache's event behaviour at page size pageSize.
func (v SGLang) Radix(pageSize int) radix.Options {
	if v.old {
		return radix.Options{PageSize: pageSize, Scheme: radix.SchemeTuple, SplitEvents: true}
	}
	return radix.Options{PageSize: pageSize, Scheme: radix.SchemeSHA256, Medium: kvevents.MediumGPU, RemovePerNode: true}
}

// NewLabels: scheduler gauges carry moe_ep_rank, tokenizer metrics engine_type and
// cached_tokens_total cache_source, and sglang:max_total_num_tokens and
// sglang:page_size are exported (main; not in 0.4.7-0.5.0rc0).
func (v SGLang) NewLabels() bool { return !v.old }

// EmptyPromptRefused: an empty prompt answers 400 "Prompt cannot be empty" (main).
func (v SGLang) EmptyPromptRefused() bool { return !v.old }

// ModelFieldAdapter: a request's model "base:adapter" picks the LoRA adapter after the
// first colon (main; 0.4.7-0.5.0rc0 read no adapter from the model field).
func (v SGLang) ModelFieldAdapter() bool { return !v.old }

// ModelInfo: the model information is served at /model_info, /get_model_info being a
// deprecated alias, and carries the multimodal flags, model_type and architectures
// (main; 0.4.7-0.5.0rc0 have /get_model_info alone).
func (v SGLang) ModelInfo() bool { return !v.old }

// Engine returns the engine configuration of an SGLang replica with profile prof:
// pages of pageSize tokens in place of vLLM blocks, poolTokens of KV (0: the profile's
// pool), and this revision's radix cache.
func (v SGLang) Engine(prof timing.Profile, pageSize, poolTokens int) sched.Config {
	ro := v.Radix(pageSize)
	prof.BlockSize = pageSize
	return sched.Config{Profile: prof, NumGPUBlocks: max(poolTokens, 0) / pageSize, Radix: &ro}
}

// SGLangSetup is an SGLang revision at a page size.
type SGLangSetup struct {
	Version  SGLang
	PageSize int
}

// SGLangSetups are the modelled revisions, newest first, each at page size 1 (SGLang's
// default) and 16: what a test of SGLang's events runs through.
func SGLangSetups() []SGLangSetup {
	var out []SGLangSetup
	for _, v := range []SGLang{{}, {old: true}} {
		out = append(out, SGLangSetup{v, 1}, SGLangSetup{v, 16})
	}
	return out
}
