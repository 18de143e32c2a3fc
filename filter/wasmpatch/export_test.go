package wasmpatch_test

import (
	"context"
	"errors"
	"testing"

	"github.com/tetratelabs/wazero"

	"github.com/kvroute/kvroute/filter/wasmpatch"
)

// allocModule exports proxy_on_memory_allocate (returns 1), kvroute_memory_allocate
// (returns 2) and a memory, in the order Go's linker might.
func allocModule() []byte {
	sizeToPtr := []byte{0x60, 1, 0x7f, 1, 0x7f}
	ret := func(v byte) []byte { b := []byte{0, 0x41, v, 0x0b}; return append(leb(uint32(len(b))), b...) }
	return cat(
		[]byte("\x00asm\x01\x00\x00\x00"),
		section(1, vec(sizeToPtr)),
		section(3, vec(leb(0), leb(0))),
		section(5, vec([]byte{0, 1})),
		section(7, vec(
			cat(str(wasmpatch.MemoryAllocate), []byte{0}, leb(0)),
			cat(str("memory"), []byte{2}, leb(0)),
			cat(str(wasmpatch.Allocator), []byte{0}, leb(1)),
		)),
		section(10, vec(ret(1), ret(2))),
	)
}

func callExport(t *testing.T, module []byte, name string) (uint64, bool) {
	t.Helper()
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	m, err := r.Instantiate(ctx, module)
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	f := m.ExportedFunction(name)
	if f == nil {
		return 0, false
	}
	res, err := f.Call(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	return res[0], true
}

func TestUseAllocatorPointsTheExportAtTheFiltersFunction(t *testing.T) {
	orig := allocModule()
	if got, _ := callExport(t, orig, wasmpatch.MemoryAllocate); got != 1 {
		t.Fatalf("unpatched: %s returns %d, want 1", wasmpatch.MemoryAllocate, got)
	}
	patched, err := wasmpatch.UseAllocator(orig)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := callExport(t, patched, wasmpatch.MemoryAllocate); got != 2 {
		t.Fatalf("patched: %s returns %d, want 2 (the filter's)", wasmpatch.MemoryAllocate, got)
	}
	if _, ok := callExport(t, patched, wasmpatch.Allocator); ok {
		t.Errorf("%s is still exported", wasmpatch.Allocator)
	}
	// A second pass finds nothing to do.
	if _, err := wasmpatch.UseAllocator(patched); !errors.Is(err, wasmpatch.ErrNoExport) {
		t.Fatalf("second pass: err = %v, want ErrNoExport", err)
	}
	// Modules built without the filter's allocator are left to the caller.
	if _, err := wasmpatch.UseAllocator(testModule()); !errors.Is(err, wasmpatch.ErrNoExport) {
		t.Fatalf("module without it: err = %v, want ErrNoExport", err)
	}
}
