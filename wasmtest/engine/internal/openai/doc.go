// Package openai holds the request and response shapes of vLLM's OpenAI-compatible
// API (vllm/entrypoints/openai/protocol.py) that the simulator serves, the parsing of
// every prompt form vLLM accepts, and vLLM-style errors in both envelopes:
//
//	Nested (vLLM >= 0.10.1): {"error":{"message":"...","type":"BadRequestError","param":null,"code":400}}
//	Flat (<= 0.10.0):        {"object":"error","message":"...","type":"BadRequestError","param":null,"code":400}
//
// Field order in responses follows vLLM's pydantic models.
package openai
