package main

import "strings"

// Every value a host call returns (a header, the request body, a shared-data value) is
// written by the host into guest memory it asks the guest for with
// proxy_on_memory_allocate. The SDK's allocator makes a new buffer each time: 11 a
// request, one of them the whole 32 KB body, all garbage a moment later. With the SDK's
// other allocations below, that garbage makes the guest collect often, each
// collection's marking charged to the requests that allocate while it runs
// (BenchmarkKvrouteThroughProxy counts the collections).
//
// The filter has its own allocator (hostcall_wasm.go; `make wasm` exports it as
// proxy_on_memory_allocate, wasmpatch.UseAllocator): a host call made through a hostBuf
// writes its value into that buffer, reused call after call. What such a call returns is
// valid until the next call made with the same buffer; keep a copy of anything needed
// longer. Built without the patch (or natively, under the SDK's emulator) the calls
// return buffers of their own, as before.
//
// The hostBuf methods (requestHeader, responseHeader, requestBody, responseBody,
// sharedData, property) are the SDK's calls of the same names: natively they are the
// SDK's (hostcall_native.go); compiled for the proxy they call the host themselves
// (hostcall_wasm.go), because the SDK's versions pass the host pointers to locals for
// their results, which the compiler moves to the heap: two or three allocations a call,
// 22 a request.
type hostBuf struct {
	b    []byte
	keep int // values larger than this get a buffer of their own (not kept)
}

// hostBufs are the request path's buffers, one VM's.
type hostBufs struct {
	body  hostBuf // the request body, while it is routed
	chunk hostBuf // a response body chunk, until its tail is kept
	value hostBuf // a header, a shared-data value or a property, used before the next
}

func newHostBufs(maxBody int) hostBufs {
	return hostBufs{body: hostBuf{keep: maxBody + 1}, chunk: hostBuf{keep: 1 << 20}, value: hostBuf{keep: 64 << 10}}
}

// propertyPath is a property's path, as the SDK takes it and as the ABI spells it (its
// parts NUL-separated), so reading it builds nothing.
type propertyPath struct {
	parts []string
	abi   string
}

func newPropertyPath(parts ...string) *propertyPath {
	return &propertyPath{parts: parts, abi: strings.Join(parts, "\x00")}
}

// names are the strings a VM keeps from what host calls return (tenants, model headers,
// upstream addresses): a handful of distinct values, each copied out of host memory the
// first time only.
type names map[string]string

// keep returns s as a string of its own (s may be a view of a hostBuf).
func (n *names) keep(s string) string {
	if v, ok := (*n)[s]; ok {
		return v
	}
	if *n == nil || len(*n) >= 4096 {
		*n = names{}
	}
	v := strings.Clone(s)
	(*n)[v] = v
	return v
}
