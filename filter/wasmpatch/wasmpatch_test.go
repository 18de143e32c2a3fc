package wasmpatch_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"

	"github.com/kvroute/kvroute/filter/wasmpatch"
)

// A module assembled by hand in the binary format, shaped like what Go emits: two WASI
// imports (poll_oneoff second, so its index is 1), a memory, one function that calls
// poll_oneoff from inside nested blocks next to instructions with every kind of
// immediate, a table element, and a name section.

func leb(v uint32) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func vec(items ...[]byte) []byte {
	out := leb(uint32(len(items)))
	for _, it := range items {
		out = append(out, it...)
	}
	return out
}

func str(s string) []byte { return append(leb(uint32(len(s))), s...) }

func section(id byte, content []byte) []byte {
	return append(append([]byte{id}, leb(uint32(len(content)))...), content...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// body calls poll_oneoff(0, 0, 1, 32) and returns the errno plus the nevents it wrote
// times 1000, so a test sees both.
var body = cat(
	[]byte{1, 1, 0x7e}, // one local of i64
	[]byte{0x42, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x7f, 0x21, 0}, // i64.const -2^63 (10-byte LEB), local.set 0
	[]byte{0x41, 32, 0x41, 0xf7, 0x07, 0x36, 2, 0},                                    // i32.store [32] = 1015 (a value the shim must overwrite)
	[]byte{0x02, 0x7f},                                         // block (result i32)
	[]byte{0x03, 0x40, 0x02, 0x40},                             // loop, block
	[]byte{0x41, 0, 0x0e, 2, 0, 0, 0},                          // i32.const 0; br_table 0 0 0: leaves the inner block
	[]byte{0x0b, 0x0b},                                         // end block, end loop
	[]byte{0x41, 0, 0x41, 0, 0x41, 1, 0x41, 32, 0x10, 1},       // call poll_oneoff
	[]byte{0x41, 32, 0x28, 2, 0, 0x41, 0xe8, 0x07, 0x6c, 0x6a}, // + nevents*1000
	[]byte{0x0b},             // end block
	[]byte{0xfc, 0x00, 0x1a}, // (a 0xFC opcode needs a float: replaced below)
	[]byte{0x0b},             // end func
)

func init() {
	// i32.trunc_sat_f32_s needs an f32 operand: f32.const 1.5 then trunc_sat, drop.
	body = bytes.Replace(body, []byte{0xfc, 0x00, 0x1a}, []byte{0x43, 0, 0, 0xc0, 0x3f, 0xfc, 0x00, 0x1a}, 1)
}

func testModule() []byte {
	i32x4 := []byte{0x60, 4, 0x7f, 0x7f, 0x7f, 0x7f, 1, 0x7f}
	noArgs := []byte{0x60, 0, 1, 0x7f}
	names := cat(str("name"), section(1, vec(cat(leb(0), str("sched_yield")), cat(leb(1), str("poll_oneoff")), cat(leb(2), str("run")))))
	return cat(
		[]byte("\x00asm\x01\x00\x00\x00"),
		section(1, vec(i32x4, noArgs)),
		section(2, vec(
			cat(str("wasi_snapshot_preview1"), str("sched_yield"), []byte{0}, leb(1)),
			cat(str("wasi_snapshot_preview1"), str("poll_oneoff"), []byte{0}, leb(0)),
		)),
		section(3, vec(leb(1))),
		section(4, vec([]byte{0x70, 0, 1})), // table funcref min 1
		section(5, vec([]byte{0, 1})),       // memory min 1 page
		section(7, vec(cat(str("run"), []byte{0}, leb(2)), cat(str("memory"), []byte{2}, leb(0)))),
		section(9, vec(cat(leb(0), []byte{0x41, 0, 0x0b}, vec(leb(2))))), // table[0] = run
		section(10, vec(append(leb(uint32(len(body))), body...))),
		section(0, names),
	)
}

// run instantiates the module with a poll_oneoff that fails the test if it is ever
// called, and returns what "run" returns.
func run(t *testing.T, module []byte) uint32 {
	t.Helper()
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	_, err := r.NewHostModuleBuilder("wasi_snapshot_preview1").
		NewFunctionBuilder().WithFunc(func() uint32 { return 0 }).Export("sched_yield").
		NewFunctionBuilder().WithFunc(func(_, _, _, _ uint32) uint32 { return 52 }).Export("poll_oneoff").
		Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Instantiate(ctx, module)
	if err != nil {
		t.Fatalf("instantiate: %v", err)
	}
	res, err := m.ExportedFunction("run").Call(ctx)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return api.DecodeU32(res[0])
}

func TestShimAnswersInsteadOfTheHost(t *testing.T) {
	orig := testModule()
	if got := run(t, orig); got != 52+1015*1000 {
		t.Fatalf("unpatched module returns %d, want the host's ENOSYS (52) and nevents untouched", got)
	}
	patched, res, err := wasmpatch.PollOneoffShim(orig)
	if err != nil {
		t.Fatal(err)
	}
	if res.Import != 1 || res.Shim != 3 || res.CallSites != 1 {
		t.Fatalf("result = %+v, want import 1, shim 3, one call site", res)
	}
	if got := run(t, patched); got != 0 {
		t.Fatalf("patched module returns %d, want success (0) with nevents 0", got)
	}

	// The shim is named, and the module still imports poll_oneoff (every cpp-host has it).
	ctx := context.Background()
	r := wazero.NewRuntime(ctx)
	defer r.Close(ctx)
	cm, err := r.CompileModule(ctx, patched)
	if err != nil {
		t.Fatal(err)
	}
	var imported bool
	for _, f := range cm.ImportedFunctions() {
		if _, name, _ := f.Import(); name == "poll_oneoff" {
			imported = true
		}
	}
	if !imported {
		t.Error("the poll_oneoff import is gone")
	}
	if !bytes.Contains(patched, []byte(wasmpatch.ShimName)) {
		t.Error("the name section does not name the shim")
	}

	// Patching again changes nothing.
	again, res2, err := wasmpatch.PollOneoffShim(patched)
	if err != nil || res2.CallSites != 0 || !bytes.Equal(again, patched) {
		t.Fatalf("second patch: err %v, result %+v, changed %v", err, res2, !bytes.Equal(again, patched))
	}
}

func TestShimRefusesWhatItCannotPatchSafely(t *testing.T) {
	good := testModule()
	cases := []struct {
		name   string
		module []byte
		want   string
	}{
		{"not wasm", []byte("hello, world"), "not a WebAssembly"},
		{"truncated", good[:len(good)-20], "runs past"},
		{"SIMD opcode", bytes.Replace(good, []byte{0xfc, 0x00, 0x1a}, []byte{0xfc, 0x00, 0xfd}, 1), "not supported"},
		{"no poll_oneoff", bytes.Replace(good, []byte("poll_oneoff"), []byte("poll_twooff"), -1), "does not import"},
		{"exported", bytes.Replace(good, cat(str("run"), []byte{0}, leb(2)), cat(str("run"), []byte{0}, leb(1)), 1), "exported"},
		{"in the table", bytes.Replace(good, cat([]byte{0x41, 0, 0x0b}, vec(leb(2))), cat([]byte{0x41, 0, 0x0b}, vec(leb(1))), 1), "element"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := wasmpatch.PollOneoffShim(c.module)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want one saying %q", err, c.want)
			}
			if c.name == "no poll_oneoff" && !errors.Is(err, wasmpatch.ErrNoPollOneoff) {
				t.Fatalf("err = %v, want ErrNoPollOneoff", err)
			}
		})
	}
}

func FuzzPollOneoffShim(f *testing.F) {
	f.Add(testModule())
	f.Fuzz(func(t *testing.T, module []byte) {
		out, _, err := wasmpatch.PollOneoffShim(module)
		if err == nil && len(out) == 0 {
			t.Fatal("no error and no module")
		}
	})
}
