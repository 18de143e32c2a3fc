package host

import (
	"context"
	"syscall"

	"github.com/tetratelabs/wazero/experimental"
)

// withReservedMemory makes each VM's linear memory grow in place, as V8's does: V8
// reserves a wasm memory's whole address range (with guard regions) up front and grows
// it by making more of it readable and writable (BackingStore::GrowWasmMemoryInPlace in
// src/objects/backing-store.cc; nodejs/node's deps/v8 at ad55fbf6). By itself wazero
// grows a memory by appending to a Go slice, a copy of the whole memory when its capacity
// runs out: a guest heap's growth after warm-up would stall the one request it lands in
// (BenchmarkKvrouteRequestPath's maximum, runtime.(*mheap).grow in the guest profile), a
// stall no proxy running V8 has.
func withReservedMemory(ctx context.Context) context.Context {
	return experimental.WithMemoryAllocator(ctx, experimental.MemoryAllocatorFunc(reserveMemory))
}

// reservedMemory is a linear memory's address range, mapped without access, of which
// the first len(mem) bytes are readable and writable.
type reservedMemory struct {
	whole []byte // the reservation: max bytes
	mem   []byte
}

func reserveMemory(_, max uint64) experimental.LinearMemory {
	b, err := syscall.Mmap(-1, 0, int(max), syscall.PROT_NONE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return &copyingMemory{} // no address space to reserve: grow as wazero does
	}
	return &reservedMemory{whole: b}
}

// Reallocate makes the first size bytes accessible (a memory only grows), or returns
// nil (memory.grow fails, as in V8 when the system refuses).
func (r *reservedMemory) Reallocate(size uint64) []byte {
	if size > uint64(len(r.whole)) {
		return nil
	}
	if size > uint64(len(r.mem)) {
		if err := syscall.Mprotect(r.whole[len(r.mem):size], syscall.PROT_READ|syscall.PROT_WRITE); err != nil {
			return nil
		}
	}
	r.mem = r.whole[:size:size]
	return r.mem
}

func (r *reservedMemory) Free() {
	if r.whole != nil {
		_ = syscall.Munmap(r.whole)
		r.whole, r.mem = nil, nil
	}
}

// copyingMemory grows by copying, as wazero's own memory does.
type copyingMemory struct{ b []byte }

func (c *copyingMemory) Reallocate(size uint64) []byte {
	if size > uint64(cap(c.b)) {
		c.b = append(c.b[:cap(c.b)], make([]byte, size-uint64(cap(c.b)))...)
	}
	c.b = c.b[:size]
	return c.b
}

func (c *copyingMemory) Free() { c.b = nil }
