package wasmpatch

import (
	"errors"
	"fmt"
)

// Allocator is the export through which the filter offers its own
// proxy_on_memory_allocate: the SDK exports one that allocates a new buffer for every
// value a host call returns (a 32 KB request body, a header, a shared-data value), and
// Go does not let a second package export the same name. UseAllocator points the
// proxy_on_memory_allocate export at this function instead.
const Allocator = "kvroute_memory_allocate"

// MemoryAllocate is the proxy-wasm export hosts call to get guest memory for the values
// they return.
const MemoryAllocate = "proxy_on_memory_allocate"

// ErrNoExport is returned when the export to take over is not in the module.
var ErrNoExport = errors.New("wasmpatch: module does not export the function")

// UseAllocator returns a copy of module whose proxy_on_memory_allocate export is the
// function exported as Allocator (which is then no longer exported under that name).
// A module without the Allocator export returns ErrNoExport; one already patched has
// none, so patching twice is harmless.
func UseAllocator(module []byte) ([]byte, error) {
	return ReplaceExport(module, MemoryAllocate, Allocator)
}

// ReplaceExport returns a copy of module in which the function export name refers to the
// function exported as with, and with is no longer exported. Only the export section
// changes: no function, index or body moves, so the function name refers to before
// stays in the module, unexported.
func ReplaceExport(module []byte, name, with string) ([]byte, error) {
	m, err := parse(module)
	if err != nil {
		return nil, err
	}
	for _, s := range m.sections {
		if s.id != secExport {
			continue
		}
		sec, err := replaceExport(module[s.start:s.end], name, with)
		if err != nil {
			return nil, err
		}
		out := append([]byte(nil), module[:s.head]...)
		out = append(out, secExport)
		out = appendU32(out, uint32(len(sec)))
		out = append(out, sec...)
		return append(out, module[s.end:]...), nil
	}
	return nil, fmt.Errorf("%w %q: no export section", ErrNoExport, with)
}

type export struct {
	name  string
	kind  byte
	index uint32
}

// replaceExport re-encodes an export section's content with name pointing at with's
// function, and with dropped.
func replaceExport(content []byte, name, with string) ([]byte, error) {
	r := &reader{b: content}
	n := r.u32()
	var exports []export
	target, found := -1, -1
	for i := uint32(0); i < n && r.err == nil; i++ {
		e := export{name: r.name(), kind: r.byte(), index: r.u32()}
		switch {
		case e.name == name:
			target = len(exports)
		case e.name == with:
			found = len(exports)
		}
		exports = append(exports, e)
	}
	if r.err != nil {
		return nil, fmt.Errorf("wasmpatch: export section: %w", r.err)
	}
	if r.pos != len(content) {
		return nil, errors.New("wasmpatch: export section: bytes after the last export")
	}
	switch {
	case found < 0:
		return nil, fmt.Errorf("%w %q", ErrNoExport, with)
	case target < 0:
		return nil, fmt.Errorf("%w %q", ErrNoExport, name)
	case exports[target].kind != 0 || exports[found].kind != 0:
		return nil, fmt.Errorf("wasmpatch: %q or %q is not a function export", name, with)
	}
	exports[target].index = exports[found].index
	out := appendU32(nil, uint32(len(exports)-1))
	for i, e := range exports {
		if i == found {
			continue
		}
		out = appendU32(out, uint32(len(e.name)))
		out = append(out, e.name...)
		out = append(out, e.kind)
		out = appendU32(out, e.index)
	}
	return out, nil
}
