// Package wasmpatch rewrites the compiled filter so it runs on every proxy-wasm host that
// Istio ships, including the ones whose WASI poll_oneoff is a stub that fails.
//
// # Why
//
// Go's wasip1 runtime calls WASI poll_oneoff from netpoll: on every stop-the-world once
// any timer exists (runtime/proc.go startTheWorldWithSema calls netpoll(0); the GC's
// scavenger arms a timer after the first cycle), and when the scheduler idles until a
// timer. It throws "poll_oneoff failed" on any error but EINTR
// (runtime/netpoll_wasip1.go). proxy-wasm-cpp-host answers poll_oneoff with ENOSYS (52)
// in every commit that precedes 94091cd (src/exports.cc, wasi_unstable_poll_oneoff), and
// there also traps it as a restricted call inside proxy_on_memory_allocate
// (include/proxy-wasm/wasm.h, allocMemory), where Go's allocator can start a GC. Envoy
// 1.35 to 1.38 (Istio 1.27 to 1.30) pin such a cpp-host, so an unpatched Go filter dies
// at its second or third garbage collection there (golang/go#78513).
//
// # What
//
// PollOneoffShim adds one function to the module and points every call to the imported
// poll_oneoff at it. The function answers exactly as cpp-host does from 94091cd on: it
// writes 0 to *nevents and returns 0 (success), without sleeping. For the Go runtime that
// means netpoll finds no ready descriptor (a filter has none) and an idle scheduler spins
// to its next timer instead of sleeping in the host, which is what a current Envoy does
// to the same module. The import itself stays (every cpp-host provides it, so the module
// still links everywhere) but is never called.
//
// The rewrite works on the binary format (WebAssembly Core Specification 2.0, section 5):
// the new function gets the next free index, so no existing index moves; only the
// function and code sections change, and the "name" custom section gets the new
// function's name. An instruction the decoder does not know fails the rewrite rather
// than risk a wrong one.
//
// An API on purpose: meant for reuse outside kvroute and kept compatible within a minor
// version (README, "What is an API").
package wasmpatch

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// ShimName is the name the added function gets in the module's name section.
const ShimName = "kvroute.poll_oneoff_shim"

// Result says what PollOneoffShim did.
type Result struct {
	Import    uint32 // function index of the imported poll_oneoff
	Shim      uint32 // function index of the added function
	CallSites int    // calls redirected
}

// ErrNoPollOneoff is returned for a module that does not import poll_oneoff.
var ErrNoPollOneoff = errors.New("wasmpatch: module does not import wasi_snapshot_preview1.poll_oneoff")

// PollOneoffShim returns a copy of module whose calls to the imported WASI poll_oneoff go
// to a local function that reports no events and success. A module that imports it but
// no longer calls it (already patched) comes back unchanged with CallSites 0.
func PollOneoffShim(module []byte) ([]byte, Result, error) {
	m, err := parse(module)
	if err != nil {
		return nil, Result{}, err
	}
	imp, typ, ok := m.pollOneoffImport()
	if !ok {
		return nil, Result{}, ErrNoPollOneoff
	}
	if err := m.checkSignature(typ); err != nil {
		return nil, Result{}, err
	}
	shim := m.numImportedFuncs + m.numDefinedFuncs
	res := Result{Import: imp, Shim: shim}

	sites, err := m.redirectCalls(imp, shim)
	if err != nil {
		return nil, Result{}, err
	}
	res.CallSites = sites
	if sites == 0 {
		return append([]byte(nil), module...), res, nil
	}
	if err := m.checkNoOtherReferences(imp); err != nil {
		return nil, Result{}, err
	}

	// Code: every body, then the shim's.
	code := appendU32(nil, m.numDefinedFuncs+1)
	code = append(code, m.rewrittenBodies...)
	code = append(code, shimBody...)
	// Function: every type index, then the shim's (the import's own type).
	fn := appendU32(nil, m.numDefinedFuncs+1)
	fn = append(fn, m.funcTypes...)
	fn = appendU32(fn, typ)

	out := append([]byte(nil), module[:8]...)
	for _, s := range m.sections {
		body := module[s.start:s.end]
		switch {
		case s.id == secFunction:
			body = fn
		case s.id == secCode:
			body = code
		case s.id == secCustom && s.name == "name":
			if nb, err := appendFunctionName(body, shim, ShimName); err == nil {
				body = nb
			} // a name section we cannot extend is left as it is: names are optional
		}
		out = append(out, s.id)
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
	}
	return out, res, nil
}

// shimBody is the code entry of: (func (param i32 i32 i32 i32) (result i32)
// (i32.store (local.get 3) (i32.const 0)) (i32.const 0)).
var shimBody = []byte{
	11,      // body size
	0,       // no locals
	0x20, 3, // local.get 3 (nevents)
	0x41, 0, // i32.const 0
	0x36, 2, 0, // i32.store align=4 offset=0
	0x41, 0, // i32.const 0 (ESUCCESS)
	0x0b, // end
}

const (
	secCustom   = 0
	secType     = 1
	secImport   = 2
	secFunction = 3
	secElement  = 9
	secCode     = 10
	secExport   = 7
	secStart    = 8
)

type section struct {
	id         byte
	head       int    // where the section's id byte is, within the module
	start, end int    // content, within the module
	name       string // custom sections
}

type module struct {
	raw              []byte
	sections         []section
	types            [][2][]byte // params, results
	imports          []importedFunc
	numImportedFuncs uint32
	numDefinedFuncs  uint32
	funcTypes        []byte // the function section's type indices, encoded
	bodies           []byte // the code section after its count
	rewrittenBodies  []byte
}

type importedFunc struct {
	module, name string
	index, typ   uint32
}

func parse(b []byte) (*module, error) {
	if len(b) < 8 || !bytes.Equal(b[:4], []byte("\x00asm")) || binary.LittleEndian.Uint32(b[4:8]) != 1 {
		return nil, errors.New("wasmpatch: not a WebAssembly 1.0 binary module")
	}
	m := &module{raw: b}
	r := &reader{b: b, pos: 8}
	for r.pos < len(b) {
		head := r.pos
		id := r.byte()
		size := r.u32()
		start := r.pos
		end := start + int(size)
		if r.err != nil || end > len(b) || end < start {
			return nil, fmt.Errorf("wasmpatch: section %d at byte %d runs past the end", id, start)
		}
		s := section{id: id, head: head, start: start, end: end}
		sr := &reader{b: b[:end], pos: start}
		var err error
		switch id {
		case secCustom:
			s.name = sr.name()
			err = sr.err
		case secType:
			err = m.parseTypes(sr)
		case secImport:
			err = m.parseImports(sr)
		case secFunction:
			m.numDefinedFuncs = sr.u32()
			m.funcTypes = b[sr.pos:end]
			err = sr.err
		case secCode:
			if n := sr.u32(); sr.err == nil && n != m.numDefinedFuncs {
				err = fmt.Errorf("code section has %d bodies for %d functions", n, m.numDefinedFuncs)
			}
			m.bodies = b[sr.pos:end]
		}
		if err != nil {
			return nil, fmt.Errorf("wasmpatch: section %d: %w", id, err)
		}
		m.sections = append(m.sections, s)
		r.pos = end
	}
	if r.err != nil {
		return nil, fmt.Errorf("wasmpatch: %w", r.err)
	}
	return m, nil
}

func (m *module) parseTypes(r *reader) error {
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		if form := r.byte(); form != 0x60 {
			return fmt.Errorf("type %d: form 0x%x is not a function type", i, form)
		}
		params := r.bytes(int(r.u32()))
		results := r.bytes(int(r.u32()))
		m.types = append(m.types, [2][]byte{params, results})
	}
	return r.err
}

func (m *module) parseImports(r *reader) error {
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		mod, name := r.name(), r.name()
		switch kind := r.byte(); kind {
		case 0x00: // function
			m.imports = append(m.imports, importedFunc{module: mod, name: name, index: m.numImportedFuncs, typ: r.u32()})
			m.numImportedFuncs++
		case 0x01: // table: reftype, limits
			r.byte()
			r.limits()
		case 0x02: // memory: limits
			r.limits()
		case 0x03: // global: valtype, mutability
			r.byte()
			r.byte()
		default:
			return fmt.Errorf("import %s.%s: unknown kind 0x%x", mod, name, kind)
		}
	}
	return r.err
}

func (m *module) pollOneoffImport() (index, typ uint32, ok bool) {
	for _, f := range m.imports {
		if f.module == "wasi_snapshot_preview1" && f.name == "poll_oneoff" {
			return f.index, f.typ, true
		}
	}
	return 0, 0, false
}

// checkSignature requires poll_oneoff's WASI type, (i32 i32 i32 i32) -> i32, which the
// shim's body assumes.
func (m *module) checkSignature(typ uint32) error {
	if int(typ) >= len(m.types) {
		return fmt.Errorf("wasmpatch: poll_oneoff has type %d of %d", typ, len(m.types))
	}
	t := m.types[typ]
	if !bytes.Equal(t[0], []byte{0x7f, 0x7f, 0x7f, 0x7f}) || !bytes.Equal(t[1], []byte{0x7f}) {
		return fmt.Errorf("wasmpatch: poll_oneoff has type %x -> %x, want (i32 i32 i32 i32) -> i32", t[0], t[1])
	}
	return nil
}

// redirectCalls decodes every body, rewrites call/return_call of from into to, and keeps
// the re-encoded bodies (each with its new size) in m.rewrittenBodies.
func (m *module) redirectCalls(from, to uint32) (int, error) {
	r := &reader{b: m.bodies}
	out := make([]byte, 0, len(m.bodies)+64)
	sites := 0
	for i := uint32(0); i < m.numDefinedFuncs; i++ {
		size := int(r.u32())
		start := r.pos
		end := start + size
		if r.err != nil || end > len(r.b) {
			return 0, fmt.Errorf("wasmpatch: body of function %d runs past the code section", m.numImportedFuncs+i)
		}
		body, n, err := rewriteBody(r.b[start:end], from, to)
		if err != nil {
			return 0, fmt.Errorf("wasmpatch: function %d: %w", m.numImportedFuncs+i, err)
		}
		sites += n
		out = appendU32(out, uint32(len(body)))
		out = append(out, body...)
		r.pos = end
	}
	m.rewrittenBodies = out
	return sites, nil
}

// checkNoOtherReferences refuses a module that takes poll_oneoff's index anywhere but in
// a direct call (an export, a table element, the start function): those would still
// reach the host's answer.
func (m *module) checkNoOtherReferences(imp uint32) error {
	for _, s := range m.sections {
		r := &reader{b: m.raw[:s.end], pos: s.start}
		switch s.id {
		case secStart:
			if r.u32() == imp {
				return errors.New("wasmpatch: poll_oneoff is the start function")
			}
		case secExport:
			n := r.u32()
			for i := uint32(0); i < n && r.err == nil; i++ {
				name := r.name()
				if kind, idx := r.byte(), r.u32(); kind == 0 && idx == imp {
					return fmt.Errorf("wasmpatch: poll_oneoff is exported as %q", name)
				}
			}
		case secElement:
			if elementsMention(m.raw[s.start:s.end], imp) {
				return errors.New("wasmpatch: poll_oneoff is in a table element segment")
			}
		}
		if r.err != nil {
			return fmt.Errorf("wasmpatch: section %d: %w", s.id, r.err)
		}
	}
	return nil
}

// elementsMention reports whether an element section of the kinds Go emits (active, table
// 0, function indices: flag 0) lists index idx.
func elementsMention(sec []byte, idx uint32) bool {
	r := &reader{b: sec}
	n := r.u32()
	for i := uint32(0); i < n && r.err == nil; i++ {
		if flag := r.u32(); flag != 0 {
			return true // a kind we do not decode: assume the worst
		}
		if err := skipExpr(r); err != nil {
			return true
		}
		count := r.u32()
		for j := uint32(0); j < count && r.err == nil; j++ {
			if r.u32() == idx {
				return true
			}
		}
	}
	return r.err != nil
}

func skipExpr(r *reader) error {
	for r.err == nil {
		op := r.byte()
		if op == 0x0b {
			return nil
		}
		if _, err := skipImmediates(r, op); err != nil {
			return err
		}
	}
	return r.err
}

// appendFunctionName adds (index, name) to the function-name subsection of a "name"
// custom section's content, which must list indices in increasing order.
func appendFunctionName(content []byte, index uint32, name string) ([]byte, error) {
	r := &reader{b: content}
	r.name() // "name"
	head := r.pos
	var out []byte
	out = append(out, content[:head]...)
	found := false
	for r.pos < len(content) && r.err == nil {
		id := r.byte()
		size := int(r.u32())
		start := r.pos
		end := start + size
		if r.err != nil || end > len(content) {
			return nil, errors.New("name subsection runs past the end")
		}
		sub := content[start:end]
		if id == 1 {
			sr := &reader{b: sub}
			count := sr.u32()
			entries := sr.pos
			var last uint32
			for i := uint32(0); i < count && sr.err == nil; i++ {
				last = sr.u32()
				sr.name()
			}
			if sr.err != nil || (count > 0 && last >= index) {
				return nil, errors.New("function names not in increasing order")
			}
			nsub := appendU32(nil, count+1)
			nsub = append(nsub, sub[entries:]...)
			nsub = appendU32(nsub, index)
			nsub = appendU32(nsub, uint32(len(name)))
			nsub = append(nsub, name...)
			sub = nsub
			found = true
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(sub)))
		out = append(out, sub...)
		r.pos = end
	}
	if r.err != nil || !found {
		return nil, errors.New("no function-name subsection")
	}
	return out, nil
}
