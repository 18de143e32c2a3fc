//go:build !wasip1

package main

import (
	"strings"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// Natively the SDK's emulator answers the SDK's calls, and returns its own memory: the
// buffer is not used (hostmem.go).

func (b *hostBuf) requestHeader(key string) (string, error) {
	return proxywasm.GetHttpRequestHeader(key)
}

func (b *hostBuf) responseHeader(key string) (string, error) {
	return proxywasm.GetHttpResponseHeader(key)
}

// callResponseHeader: the SDK has no single-header read for a call's response.
func (b *hostBuf) callResponseHeader(key string) (string, error) {
	hs, err := proxywasm.GetHttpCallResponseHeaders()
	if err != nil {
		return "", err
	}
	for _, h := range hs {
		if strings.EqualFold(h[0], key) {
			return h[1], nil
		}
	}
	return "", types.ErrorStatusNotFound
}

func (b *hostBuf) requestBody(size int) ([]byte, error) {
	return proxywasm.GetHttpRequestBody(0, size)
}

func (b *hostBuf) responseBody(size int) ([]byte, error) {
	return proxywasm.GetHttpResponseBody(0, size)
}

func (b *hostBuf) sharedData(key string) ([]byte, uint32, error) {
	return proxywasm.GetSharedData(key)
}

func (b *hostBuf) property(path *propertyPath) ([]byte, error) {
	return proxywasm.GetProperty(path.parts)
}

func (b *hostBuf) dequeue(queueID uint32) ([]byte, error) {
	return proxywasm.DequeueSharedQueue(queueID)
}
