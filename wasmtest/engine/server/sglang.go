// --engine sglang: what SGLang's HTTP server answers differently from vLLM's
// (python/sglang/srt/entrypoints/http_server.py @0025436e,
// entrypoints/openai/protocol.py, serving_base.py @012bcb5f).

package server

import (
	"net/http"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
)

func (s *Server) isSGLang() bool { return s.cfg.Replica.Kind == replica.EngineSGLang }

// sglangFlushBody is /flush_cache's text answer, the same for 200 and 400.
const sglangFlushBody = "Cache flushed.\nPlease check backend logs for more details. " +
	"(When there are running or waiting requests, the operation will not be performed.)\n"

// sglangRoutes adds SGLang's native routes: GET/POST /flush_cache (clears the radix
// cache and publishes AllBlocksCleared, 400 while requests run or wait) and GET
// /get_model_info.
func (s *Server) sglangRoutes(mux *http.ServeMux) {
	flush := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if s.rep.ResetPrefixCache() {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusBadRequest)
		}
		w.Write([]byte(sglangFlushBody))
	}
	mux.HandleFunc("GET /flush_cache", flush)
	mux.HandleFunc("POST /flush_cache", flush)
	mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
		// tokenizer_path defaults to model_path, weight_version to "default",
		// preferred_sampling_params to None (ServerArgs).
		writeJSON(w, http.StatusOK, sglangModelInfo{ModelPath: s.cfg.ModelName, TokenizerPath: s.cfg.ModelName,
			IsGeneration: true, WeightVersion: "default"})
	})
}

type sglangModelInfo struct {
	ModelPath               string  `json:"model_path"`
	TokenizerPath           string  `json:"tokenizer_path"`
	IsGeneration            bool    `json:"is_generation"`
	PreferredSamplingParams *string `json:"preferred_sampling_params"`
	WeightVersion           string  `json:"weight_version"`
}

// sglangModelCard is protocol.py's ModelCard (@004c82e0): id, object, created,
// owned_by "sglang", root, parent (null for the base model), max_model_len (the
// model's context length); no permission list.
type sglangModelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root"`
	Parent      *string `json:"parent"`
	MaxModelLen int     `json:"max_model_len"`
}

type sglangModelList struct {
	Object string            `json:"object"`
	Data   []sglangModelCard `json:"data"`
}

// sglangModels is GET /v1/models: the served model name alone (available_models).
func (s *Server) sglangModels(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, sglangModelList{Object: "list", Data: []sglangModelCard{{ID: s.cfg.ModelName,
		Object: "model", Created: time.Now().Unix(), OwnedBy: "sglang", Root: s.cfg.ModelName,
		MaxModelLen: s.rep.Profile().MaxModelLen}}})
}

// sglangError is how SGLang's OpenAI routes render e: the flat ErrorResponse
// (object, message, type, param, code) that create_error_response fills without a
// param.
func sglangError(e *openai.Error) *openai.Error {
	c := *e
	c.Param = ""
	return &c
}

// usage renders u as the engine does: vLLM's as it is; SGLang's UsageInfo adds
// reasoning_tokens (0) and reports prompt_tokens_details only with
// --enable-cache-report and a hit (UsageProcessor._details_if_cached, "only when
// N > 0", entrypoints/openai/usage_processor.py).
func (s *Server) usage(u *openai.Usage) *openai.Usage {
	if !s.isSGLang() {
		return u
	}
	zero := 0
	u.ReasoningTokens = &zero
	if !s.cfg.SGLangCacheReport || u.PromptTokensDetails == nil || u.PromptTokensDetails.CachedTokens == 0 {
		u.PromptTokensDetails = nil
	}
	return u
}
