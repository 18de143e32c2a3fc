//go:build wasip1

package main

import (
	"errors"
	"strconv"
	"unsafe"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// memoryAllocate is the filter's proxy_on_memory_allocate (see hostmem.go). The Go
// linker refuses a second export of that name beside the SDK's, so the filter exports it
// as kvroute_memory_allocate and `make wasm` (wasmpatch.UseAllocator) points the
// proxy_on_memory_allocate export here. Like every allocator the host calls, it may not
// call the host (but to log); it never does.
//
//lint:ignore U1000 the host calls it: //go:wasmexport, which staticcheck does not see as a use
//go:wasmexport kvroute_memory_allocate
func memoryAllocate(size uint32) *byte {
	b := hostNext
	hostNext = nil
	if b == nil {
		return &make([]byte, max(size, 1))[0]
	}
	return b.take(max(int(size), 1))
}

// hostNext is the buffer the guest's next proxy_on_memory_allocate hands out (nil: a
// new one). Set only for the duration of one host call.
var hostNext *hostBuf

// take returns memory for a value of size bytes: b's buffer, grown if it must be, or a
// new buffer for a value larger than b keeps.
func (b *hostBuf) take(size int) *byte {
	if size > b.keep {
		return &make([]byte, size)[0]
	}
	if len(b.b) < size {
		b.b = make([]byte, min(max(size, 2*len(b.b)), b.keep))
	}
	return &b.b[0]
}

// The host functions the request path calls for values, as the SDK declares them
// (proxywasm/internal/abi_hostcalls.go), with the results written to globals (out)
// rather than to locals the compiler would move to the heap. A VM runs one callback at
// a time, and no call here calls back into the guest but for proxy_on_memory_allocate.

//go:wasmimport env proxy_get_header_map_value
func hostGetHeaderMapValue(mapType uint32, key *byte, keySize int32, value unsafe.Pointer, valueSize unsafe.Pointer) uint32

//go:wasmimport env proxy_get_buffer_bytes
func hostGetBufferBytes(bufferType uint32, start, maxSize int32, data unsafe.Pointer, size unsafe.Pointer) uint32

//go:wasmimport env proxy_get_shared_data
func hostGetSharedData(key *byte, keySize int32, value unsafe.Pointer, valueSize unsafe.Pointer, cas unsafe.Pointer) uint32

//go:wasmimport env proxy_dequeue_shared_queue
func hostDequeueSharedQueue(queueID uint32, data unsafe.Pointer, size unsafe.Pointer) uint32

//go:wasmimport env proxy_get_property
func hostGetProperty(path *byte, pathSize int32, value unsafe.Pointer, valueSize unsafe.Pointer) uint32

// The ABI's map and buffer types (proxywasm/internal/abi_enums.go).
const (
	mapRequestHeaders      = 0
	mapResponseHeaders     = 2
	mapCallResponseHeaders = 6
	bufRequestBody         = 0
	bufResponseBody        = 1
)

// out receives a call's results. data is a pointer as the SDK's is (its upper half stays
// zero: guest addresses are 32 bits), read and cleared right after the call.
var out struct {
	data *byte
	size int32
	cas  uint32
}

// call arms b for the value the host returns and runs the host call; the value, in b's
// buffer (or, without the filter's allocator, in one of its own), is what it returns.
func (b *hostBuf) call(f func() uint32) ([]byte, uint32, error) {
	hostNext = b
	out.data, out.size = nil, 0
	st := f()
	hostNext = nil
	data, size := out.data, int(out.size)
	out.data = nil
	if err := statusErr(st); err != nil {
		return nil, 0, err
	}
	if data == nil || size == 0 {
		return nil, out.cas, nil
	}
	return unsafe.Slice(data, size), out.cas, nil
}

func (b *hostBuf) header(mapType uint32, key string) (string, error) {
	v, _, err := b.call(func() uint32 {
		return hostGetHeaderMapValue(mapType, unsafe.StringData(key), int32(len(key)),
			unsafe.Pointer(&out.data), unsafe.Pointer(&out.size))
	})
	return unsafe.String(unsafe.SliceData(v), len(v)), err
}

func (b *hostBuf) requestHeader(key string) (string, error) {
	return b.header(mapRequestHeaders, key)
}

func (b *hostBuf) responseHeader(key string) (string, error) {
	return b.header(mapResponseHeaders, key)
}

// callResponseHeader reads a header of the http-call response being delivered.
func (b *hostBuf) callResponseHeader(key string) (string, error) {
	return b.header(mapCallResponseHeaders, key)
}

// buffer is getBuffer's answer: an empty buffer is not found.
func (b *hostBuf) buffer(bufferType uint32, size int) ([]byte, error) {
	v, _, err := b.call(func() uint32 {
		return hostGetBufferBytes(bufferType, 0, int32(size), unsafe.Pointer(&out.data), unsafe.Pointer(&out.size))
	})
	if err == nil && len(v) == 0 {
		return nil, types.ErrorStatusNotFound
	}
	return v, err
}

func (b *hostBuf) requestBody(size int) ([]byte, error) { return b.buffer(bufRequestBody, size) }

func (b *hostBuf) responseBody(size int) ([]byte, error) { return b.buffer(bufResponseBody, size) }

func (b *hostBuf) sharedData(key string) ([]byte, uint32, error) {
	out.cas = 0
	return b.call(func() uint32 {
		return hostGetSharedData(unsafe.StringData(key), int32(len(key)),
			unsafe.Pointer(&out.data), unsafe.Pointer(&out.size), unsafe.Pointer(&out.cas))
	})
}

// property reads the property at path.
func (b *hostBuf) property(path *propertyPath) ([]byte, error) {
	p := path.abi
	v, _, err := b.call(func() uint32 {
		return hostGetProperty(unsafe.StringData(p), int32(len(p)), unsafe.Pointer(&out.data), unsafe.Pointer(&out.size))
	})
	return v, err
}

func (b *hostBuf) dequeue(queueID uint32) ([]byte, error) {
	v, _, err := b.call(func() uint32 {
		return hostDequeueSharedQueue(queueID, unsafe.Pointer(&out.data), unsafe.Pointer(&out.size))
	})
	return v, err
}

// statusErr is the SDK's StatusToError.
func statusErr(st uint32) error {
	switch st {
	case 0:
		return nil
	case 1:
		return types.ErrorStatusNotFound
	case 2:
		return types.ErrorStatusBadArgument
	case 7:
		return types.ErrorStatusEmpty
	case 8:
		return types.ErrorStatusCasMismatch
	case 10:
		return types.ErrorInternalFailure
	case 12:
		return types.ErrorUnimplemented
	}
	return errors.New("unknown status code: " + strconv.Itoa(int(st)))
}
