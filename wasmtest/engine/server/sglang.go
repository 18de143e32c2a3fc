// --engine sglang: what SGLang's HTTP server answers differently from vLLM's
// (python/sglang/srt/entrypoints/http_server.py @0025436e,
// entrypoints/openai/protocol.py, serving_base.py @012bcb5f).

package server

import (
	"net/http"
	"strings"
	"time"

	"github.com/kvroute/kvroute/wasmtest/engine/internal/openai"
	"github.com/kvroute/kvroute/wasmtest/engine/replica"
)

func (s *Server) isSGLang() bool { return s.cfg.Replica.Kind == replica.EngineSGLang }

// sglangFlushBody is /flush_cache's text answer, the same for 200 and 400.
const sglangFlushBody = "Cache flushed.\nPlease check backend logs for more details. " +
	"(When there are running or waiting requests, the operation will not be performed.)\n"

// sglangRoutes adds SGLang's native routes: GET/POST /flush_cache (clears the radix
// cache and publishes AllBlocksCleared, 400 while requests run or wait), GET
// /get_model_info and, on main, GET /model_info.
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
	// tokenizer_path defaults to model_path, weight_version to "default",
	// preferred_sampling_params to None (ServerArgs).
	base := sglangModelInfo{ModelPath: s.cfg.ModelName, TokenizerPath: s.cfg.ModelName,
		IsGeneration: true, WeightVersion: "default"}
	if !s.cfg.Replica.SGLang.ModelInfo() {
		mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, base)
		})
		return
	}
	// Main: model_info() adds the model config's multimodal flags (false: a text
	// model) and its HF config's model_type and architectures, None here: the
	// simulator has no HF config (http_server.py, getattr(hf_config, ..., None)).
	info := sglangMainModelInfo{sglangModelInfo: base}
	serve := func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, info) }
	mux.HandleFunc("GET /model_info", serve)
	mux.HandleFunc("GET /get_model_info", serve) // deprecated alias, same answer
}

type sglangModelInfo struct {
	ModelPath               string  `json:"model_path"`
	TokenizerPath           string  `json:"tokenizer_path"`
	IsGeneration            bool    `json:"is_generation"`
	PreferredSamplingParams *string `json:"preferred_sampling_params"`
	WeightVersion           string  `json:"weight_version"`
}

// sglangMainModelInfo is main's /model_info.
type sglangMainModelInfo struct {
	sglangModelInfo
	HasImageUnderstanding bool      `json:"has_image_understanding"`
	HasAudioUnderstanding bool      `json:"has_audio_understanding"`
	ModelType             *string   `json:"model_type"`
	Architectures         *[]string `json:"architectures"`
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

// sglangModel resolves a request's model as SGLang does: any name is the base model
// (the model field is not checked against the served name); on main "base:adapter"
// picks the adapter after the first colon, trimmed (serving_base.py
// _parse_model_parameter, sgl-project/sglang#11570), and one that is not loaded is the
// LoRA registry's ValueError, a 400 (lora_registry.py acquire; the keys rendered as
// sgl-project/sglang#12745 shows them).
func (s *Server) sglangModel(name string) (lora string, loraID int, e *openai.Error) {
	_, adapter, ok := strings.Cut(name, ":")
	adapter = strings.TrimSpace(adapter)
	if !ok || adapter == "" || !s.cfg.Replica.SGLang.ModelFieldAdapter() {
		return "", 0, nil
	}
	if id, ok := s.loras[adapter]; ok {
		return adapter, id, nil
	}
	loaded := make([]string, len(s.cfg.LoRAModules))
	for i, m := range s.cfg.LoRAModules {
		loaded[i] = "'" + m.Name + "'"
	}
	return "", 0, openai.BadRequest("The following requested LoRA adapters are not loaded: %s\nLoaded adapters: dict_keys([%s]).",
		adapter, strings.Join(loaded, ", "))
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
