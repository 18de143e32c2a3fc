package wasmpatch

import (
	"errors"
	"fmt"
)

// reader decodes the binary format's primitives; the first error sticks.
type reader struct {
	b   []byte
	pos int
	err error
}

var errShort = errors.New("unexpected end of input")

func (r *reader) byte() byte {
	if r.err != nil || r.pos >= len(r.b) {
		r.fail(errShort)
		return 0
	}
	c := r.b[r.pos]
	r.pos++
	return c
}

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (r *reader) u32() uint32 {
	var v uint32
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		if r.err != nil {
			return 0
		}
		v |= uint32(c&0x7f) << shift
		if c&0x80 == 0 {
			return v
		}
	}
	r.fail(errors.New("LEB128 u32 longer than 5 bytes"))
	return 0
}

// skipLEB passes over a signed or unsigned LEB128 of at most max bytes.
func (r *reader) skipLEB(max int) {
	for i := 0; i < max; i++ {
		if r.byte()&0x80 == 0 || r.err != nil {
			return
		}
	}
	r.fail(fmt.Errorf("LEB128 longer than %d bytes", max))
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n < 0 || r.pos+n > len(r.b) {
		r.fail(errShort)
		return nil
	}
	b := r.b[r.pos : r.pos+n]
	r.pos += n
	return b
}

func (r *reader) name() string { return string(r.bytes(int(r.u32()))) }

func (r *reader) limits() {
	switch flag := r.byte(); flag {
	case 0x00:
		r.u32()
	case 0x01:
		r.u32()
		r.u32()
	default:
		r.fail(fmt.Errorf("limits flag 0x%x", flag))
	}
}

func appendU32(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// rewriteBody copies one function body (locals and expression), replacing the function
// index of every call and return_call to from with to. It decodes every instruction, so
// an index is never mistaken for an immediate of another instruction.
func rewriteBody(body []byte, from, to uint32) ([]byte, int, error) {
	r := &reader{b: body}
	groups := r.u32()
	for i := uint32(0); i < groups && r.err == nil; i++ {
		r.u32()  // count
		r.byte() // value type
	}
	if r.err != nil {
		return nil, 0, fmt.Errorf("locals: %w", r.err)
	}
	out := make([]byte, 0, len(body)+8)
	out = append(out, body[:r.pos]...)
	sites := 0
	for r.pos < len(body) {
		at := r.pos
		op := r.byte()
		callee, err := skipImmediates(r, op)
		if err != nil {
			return nil, 0, fmt.Errorf("byte %d: %w", at, err)
		}
		if (op == opCall || op == opReturnCall) && callee == from {
			out = append(out, op)
			out = appendU32(out, to)
			sites++
			continue
		}
		out = append(out, body[at:r.pos]...)
	}
	return out, sites, nil
}

const (
	opCall       = 0x10
	opReturnCall = 0x12
)

// skipImmediates passes over the immediates of the instruction with opcode op and returns
// the callee of a call or return_call (else 0). The opcodes are those of the WebAssembly
// 2.0 core specification that carry no vector type (section 5.4): the MVP, sign
// extension, saturating truncation, bulk memory, reference types and tail calls. Anything
// else (SIMD, threads, GC) is an error: the Go toolchain does not emit it, and guessing
// its length could corrupt the body.
func skipImmediates(r *reader, op byte) (callee uint32, err error) {
	switch {
	case op == 0x02 || op == 0x03 || op == 0x04: // block, loop, if: blocktype
		switch t := r.byte(); {
		case t == 0x40 || (t >= 0x7b && t <= 0x7f) || t == 0x70 || t == 0x6f:
		default: // a type index as s33: t was its first byte
			r.pos--
			r.skipLEB(5)
		}
	case op == 0x0c || op == 0x0d: // br, br_if
		r.u32()
	case op == 0x0e: // br_table
		n := r.u32()
		for i := uint32(0); i <= n && r.err == nil; i++ {
			r.u32()
		}
	case op == opCall || op == opReturnCall:
		callee = r.u32()
	case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect: type, table
		r.u32()
		r.u32()
	case op == 0x1c: // select t*
		n := r.u32()
		r.bytes(int(n))
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		r.u32()
	case op >= 0x28 && op <= 0x3e: // loads and stores: memarg
		r.u32()
		r.u32()
	case op == 0x3f || op == 0x40: // memory.size, memory.grow: memory index
		r.u32()
	case op == 0x41: // i32.const
		r.skipLEB(5)
	case op == 0x42: // i64.const
		r.skipLEB(10)
	case op == 0x43:
		r.bytes(4)
	case op == 0x44:
		r.bytes(8)
	case op == 0xd0: // ref.null t
		r.byte()
	case op == 0xd2: // ref.func
		r.u32()
	case op == 0xfc:
		skipPrefixed(r)
	case op <= 0x01 || op == 0x05 || op == 0x0b || op == 0x0f || op == 0x1a || op == 0x1b ||
		(op >= 0x45 && op <= 0xc4) || op == 0xd1:
		// no immediates
	default:
		return 0, fmt.Errorf("opcode 0x%02x is not supported", op)
	}
	return callee, r.err
}

// skipPrefixed passes over a 0xFC instruction: saturating truncation (0-7), bulk memory
// and table instructions (8-17).
func skipPrefixed(r *reader) {
	switch sub := r.u32(); {
	case sub <= 7:
	case sub == 8: // memory.init data, memory
		r.u32()
		r.u32()
	case sub == 9: // data.drop
		r.u32()
	case sub == 10: // memory.copy dst, src
		r.u32()
		r.u32()
	case sub == 11: // memory.fill
		r.u32()
	case sub == 12 || sub == 14: // table.init, table.copy
		r.u32()
		r.u32()
	case sub == 13 || (sub >= 15 && sub <= 17): // elem.drop, table.grow/size/fill
		r.u32()
	default:
		r.fail(fmt.Errorf("opcode 0xfc %d is not supported", sub))
	}
}
