package host

import (
	"context"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/kvroute/kvroute/wasmtest/wasmbuild"
)

// A VM's memory grows where it is, keeping what it holds, as V8's does
// (memory_linux.go): with wazero's own memory the guest's growth moved it, a copy of
// all of it, and this test failed on the first Grow ("moved").
func TestVMMemoryGrowsInPlace(t *testing.T) {
	path, cleanup, err := wasmbuild.BuildTemp("testdata/floor")
	require.NoError(t, err)
	t.Cleanup(cleanup)
	ctx := context.Background()
	h, err := Load(ctx, path, Config{})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(ctx) })
	mem := h.VM(0).mem
	size := mem.Size()
	require.True(t, mem.WriteUint64Le(size-8, 0x6b76726f757465))
	at := func() unsafe.Pointer {
		b, ok := mem.Read(0, 1)
		require.True(t, ok)
		return unsafe.Pointer(unsafe.SliceData(b))
	}
	start := at()
	for range 4 {
		_, ok := mem.Grow(1024) // 64 MiB a time
		require.True(t, ok)
		require.Equal(t, start, at(), "moved")
	}
	require.Equal(t, size+4*1024*65536, mem.Size())
	v, ok := mem.ReadUint64Le(size - 8)
	require.True(t, ok)
	require.Equal(t, uint64(0x6b76726f757465), v, "what it held")
	require.True(t, mem.WriteUint64Le(mem.Size()-8, 1), "the new end is writable")
}

// A reservation grows up to its size and no further; past it, memory.grow fails (nil)
// and the memory is what it was.
func TestReservedMemoryStopsAtItsSize(t *testing.T) {
	r := reserveMemory(0, 4<<16)
	t.Cleanup(r.Free)
	b := r.Reallocate(1 << 16)
	require.Len(t, b, 1<<16)
	b[len(b)-1] = 7
	b = r.Reallocate(4 << 16)
	require.Len(t, b, 4<<16)
	require.Equal(t, byte(7), b[1<<16-1])
	require.Nil(t, r.Reallocate(5<<16))
	require.Len(t, r.(*reservedMemory).mem, 4<<16)
}
