//go:build !wasip1

package main

import "github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

// Natively the SDK's emulator answers the SDK's calls, and returns its own memory: the
// buffer is not used (hostmem.go).

func (b *hostBuf) requestHeader(key string) (string, error) {
	return proxywasm.GetHttpRequestHeader(key)
}

func (b *hostBuf) responseHeader(key string) (string, error) {
	return proxywasm.GetHttpResponseHeader(key)
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
