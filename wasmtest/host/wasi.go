package host

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"strings"

	"github.com/tetratelabs/wazero/api"
)

// The WASI functions as proxy-wasm-cpp-host implements them (src/exports.cc): enough for
// logging, clocks, randomness and the Go runtime's start-up, and otherwise stubs. The
// answers cite cpp-host at 3930b7b unless a function says otherwise; the function list
// and signatures are cpp-host's own (include/proxy-wasm/exports.h), which differ from the
// WASI specification for path_link and path_symlink.

const (
	wasiModule         = "wasi_snapshot_preview1"
	wasiUnstableModule = "wasi_unstable"
)

// WASI errno values (wasi_snapshot_preview1).
const (
	errnoSuccess = 0
	errnoBadf    = 8
	errnoFault   = 21
	errnoInval   = 28
	errnoNoent   = 44
	errnoNosys   = 52
	errnoNotdir  = 20
	errnoNotsup  = 58
)

// randomGetMax is PROXY_WASM_HOST_WASI_RANDOM_GET_MAX_SIZE_BYTES (include/proxy-wasm/limits.h).
const randomGetMax = 64 * 1024

type wasiFunc struct {
	name     string
	params   []api.ValueType
	noResult bool // proc_exit
	call     func(vm *VM, a []uint64) uint32
}

// sig spells a signature: 'w' is a Word (i32 on wasm32), 'l' a 64-bit integer.
func sig(s string) []api.ValueType {
	p := make([]api.ValueType, len(s))
	for i, c := range s {
		if c == 'l' {
			p[i] = i64
		} else {
			p[i] = i32
		}
	}
	return p
}

func errno(e uint32) func(*VM, []uint64) uint32 { return func(*VM, []uint64) uint32 { return e } }

// wasiC4d7bb0 is FOR_ALL_WASI_FUNCTIONS from c4d7bb0 to 3930b7b.
func wasiC4d7bb0() []wasiFunc {
	return []wasiFunc{
		{name: "fd_write", params: sig("wwww"), call: wasiFdWrite},
		{name: "fd_read", params: sig("wwww"), call: errno(errnoNosys)},
		// fd_seek and fd_close log an error and succeed.
		{name: "fd_seek", params: sig("wlww"), call: wasiLogError("wasi_unstable fd_seek")},
		{name: "fd_close", params: sig("w"), call: wasiLogError("wasi_unstable fd_close")},
		{name: "fd_fdstat_get", params: sig("ww"), call: wasiFdFdstatGet},
		{name: "fd_fdstat_set_flags", params: sig("ww"), call: errno(errnoNosys)},
		{name: "environ_get", params: sig("ww"), call: wasiEnvironGet},
		{name: "environ_sizes_get", params: sig("ww"), call: wasiEnvironSizesGet},
		{name: "args_get", params: sig("ww"), call: errno(errnoSuccess)},
		{name: "args_sizes_get", params: sig("ww"), call: wasiArgsSizesGet},
		{name: "clock_time_get", params: sig("wlw"), call: wasiClockTimeGet},
		{name: "random_get", params: sig("ww"), call: wasiRandomGet},
		{name: "sched_yield", params: sig(""), call: errno(errnoSuccess)},
		// The answer that kills an unpatched Go module: Go's netpoll throws on it.
		{name: "poll_oneoff", params: sig("wwww"), call: errno(errnoNosys)},
		// proc_exit logs an error and returns: the module goes on running.
		{name: "proc_exit", params: sig("w"), noResult: true, call: wasiLogError("wasi_unstable proc_exit")},
		{name: "path_open", params: sig("wwwwwllww"), call: errno(errnoNoent)},
		{name: "fd_prestat_get", params: sig("ww"), call: errno(errnoBadf)},
		{name: "fd_prestat_dir_name", params: sig("www"), call: errno(errnoNosys)},
	}
}

// wasi94091cd is FOR_ALL_WASI_FUNCTIONS from 94091cd on: the earlier set with poll_oneoff
// answering success, and stubs for the rest of WASI preview 1.
func wasi94091cd() []wasiFunc {
	fns := wasiC4d7bb0()
	for i := range fns {
		if fns[i].name == "poll_oneoff" {
			fns[i].call = wasiPollOneoffNoEvents
		}
	}
	stdio := func(ok uint32) func(*VM, []uint64) uint32 {
		return func(_ *VM, a []uint64) uint32 {
			if fd := uint32(a[0]); fd != 1 && fd != 2 {
				return errnoBadf
			}
			return ok
		}
	}
	return append(fns,
		wasiFunc{name: "clock_res_get", params: sig("ww"), call: wasiClockResGet},
		wasiFunc{name: "fd_advise", params: sig("wllw"), call: errno(errnoSuccess)},
		wasiFunc{name: "fd_allocate", params: sig("wll"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_datasync", params: sig("w"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_fdstat_set_rights", params: sig("wll"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_filestat_get", params: sig("ww"), call: errno(errnoBadf)},
		wasiFunc{name: "fd_filestat_set_size", params: sig("wl"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_filestat_set_times", params: sig("wllw"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_pread", params: sig("wwwlw"), call: errno(errnoNosys)},
		wasiFunc{name: "fd_pwrite", params: sig("wwwlw"), call: wasiFdPwrite},
		wasiFunc{name: "fd_readdir", params: sig("wwwlw"), call: wasiZeroWord(4, errnoNotdir)},
		wasiFunc{name: "fd_renumber", params: sig("ww"), call: wasiFdRenumber},
		wasiFunc{name: "fd_sync", params: sig("w"), call: stdio(errnoSuccess)},
		wasiFunc{name: "fd_tell", params: sig("ww"), call: wasiFdTell},
		wasiFunc{name: "path_create_directory", params: sig("www"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_filestat_get", params: sig("wwwww"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_filestat_set_times", params: sig("wwwwllw"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_link", params: sig("wwwwww"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_readlink", params: sig("wwwwww"), call: wasiZeroWord(5, errnoNotsup)},
		wasiFunc{name: "path_remove_directory", params: sig("www"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_rename", params: sig("wwwwww"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_symlink", params: sig("wwww"), call: errno(errnoNotsup)},
		wasiFunc{name: "path_unlink_file", params: sig("www"), call: errno(errnoNotsup)},
		wasiFunc{name: "sock_accept", params: sig("www"), call: wasiSockAccept},
		wasiFunc{name: "sock_recv", params: sig("wwwwww"), call: wasiSockRecv},
		wasiFunc{name: "sock_send", params: sig("wwwww"), call: wasiZeroWord(4, errnoNotsup)},
		wasiFunc{name: "sock_shutdown", params: sig("ww"), call: errno(errnoNotsup)},
	)
}

// instantiateWASI registers the profile's WASI functions under both module names, as
// cpp-host's registerCallbacks does.
func (h *Host) instantiateWASI(ctx context.Context) ([]api.Module, error) {
	var mods []api.Module
	for _, name := range []string{wasiModule, wasiUnstableModule} {
		b := h.runtime.NewHostModuleBuilder(name)
		for _, f := range h.profile.wasi {
			f := f
			qualified := name + "." + f.name
			calls, timer := h.hostCallCounter(qualified), h.hostCallTimer(qualified)
			var results []api.ValueType
			if !f.noResult {
				results = []api.ValueType{i32}
			}
			b.NewFunctionBuilder().
				WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, _ api.Module, stack []uint64) {
					for i, t := range f.params {
						if t == i32 {
							stack[i] = uint64(uint32(stack[i]))
						}
					}
					vm := ctx.Value(vmKey{}).(*VM)
					vm.checkRestricted(qualified)
					calls.Add(1)
					start := timer.begin()
					r := f.call(vm, stack)
					timer.end(start)
					if !f.noResult {
						stack[0] = uint64(r)
					}
				}), f.params, results).
				WithName(f.name).
				Export(f.name)
		}
		m, err := b.Instantiate(ctx)
		if err != nil {
			return nil, err
		}
		mods = append(mods, m)
	}
	return mods, nil
}

// fd_write: stdout is an info log, stderr an error log, one entry per call with one
// trailing newline removed (writevImpl); other descriptors are EBADF.
func wasiFdWrite(vm *VM, a []uint64) uint32 {
	n, e := vm.writev(uint32(a[0]), uint32(a[1]), uint32(a[2]))
	if e != errnoSuccess {
		return e
	}
	if !vm.mem.WriteUint32Le(uint32(a[3]), n) {
		return errnoFault
	}
	return errnoSuccess
}

// fd_pwrite (94091cd): fd_write on stdout and stderr, ignoring the offset.
func wasiFdPwrite(vm *VM, a []uint64) uint32 {
	if fd := uint32(a[0]); fd != 1 && fd != 2 {
		return errnoBadf
	}
	n, e := vm.writev(uint32(a[0]), uint32(a[1]), uint32(a[2]))
	if e != errnoSuccess {
		return e
	}
	if !vm.mem.WriteUint32Le(uint32(a[4]), n) {
		return errnoFault
	}
	return errnoSuccess
}

func (vm *VM) writev(fd, iovs, count uint32) (uint32, uint32) {
	level := LevelInfo
	switch fd {
	case 1:
	case 2:
		level = LevelError
	default:
		return 0, errnoBadf
	}
	var s strings.Builder
	for i := uint32(0); i < count; i++ {
		buf, ok1 := vm.mem.ReadUint32Le(iovs + i*8)
		n, ok2 := vm.mem.ReadUint32Le(iovs + i*8 + 4)
		if !ok1 || !ok2 {
			return 0, errnoFault
		}
		if n == 0 {
			continue
		}
		b, ok := vm.mem.Read(buf, n)
		if !ok {
			return 0, errnoFault
		}
		s.Write(b)
	}
	text := s.String()
	if text != "" {
		if fd == 2 {
			_, _ = io.WriteString(vm.err, text) // the tail names a failed VM's panic
		}
		vm.host.logs.add(vm.host.clock.Now(), vm.index, level, strings.TrimSuffix(text, "\n"))
	}
	return uint32(len(text)), errnoSuccess
}

func wasiLogError(msg string) func(*VM, []uint64) uint32 {
	return func(vm *VM, _ []uint64) uint32 {
		vm.host.logs.add(vm.host.clock.Now(), vm.index, LevelError, msg)
		return errnoSuccess
	}
}

// fd_fdstat_get: stdout and stderr only, a zeroed fdstat with fs_rights_base FD_WRITE (64).
func wasiFdFdstatGet(vm *VM, a []uint64) uint32 {
	if fd := uint32(a[0]); fd != 1 && fd != 2 {
		return errnoBadf
	}
	var st [24]byte
	binary.LittleEndian.PutUint64(st[8:], 64)
	vm.mem.Write(uint32(a[1]), st[:]) // cpp-host ignores a failed write here
	return errnoSuccess
}

func wasiEnvironSizesGet(vm *VM, a []uint64) uint32 {
	env := vm.host.environ()
	size := 0
	for _, kv := range env {
		size += len(kv) + 1
	}
	if !vm.mem.WriteUint32Le(uint32(a[0]), uint32(len(env))) || !vm.mem.WriteUint32Le(uint32(a[1]), uint32(size)) {
		return errnoFault
	}
	return errnoSuccess
}

func wasiEnvironGet(vm *VM, a []uint64) uint32 {
	ptrs, buf := uint32(a[0]), uint32(a[1])
	for _, kv := range vm.host.environ() {
		if !vm.mem.WriteUint32Le(ptrs, buf) || !vm.mem.Write(buf, append([]byte(kv), 0)) {
			return errnoFault
		}
		ptrs += 4
		buf += uint32(len(kv)) + 1
	}
	return errnoSuccess
}

// args_sizes_get: no arguments.
func wasiArgsSizesGet(vm *VM, a []uint64) uint32 {
	if !vm.mem.WriteUint32Le(uint32(a[0]), 0) || !vm.mem.WriteUint32Le(uint32(a[1]), 0) {
		return errnoFault
	}
	return errnoSuccess
}

// clock_time_get: realtime (0) and monotonic (1); the CPU-time clocks are ENOTSUP.
func wasiClockTimeGet(vm *VM, a []uint64) uint32 {
	var t uint64
	switch uint32(a[0]) {
	case 0:
		t = uint64(vm.host.clock.Now().UnixNano())
	case 1:
		t = uint64(vm.host.nanotime())
	default:
		return errnoNotsup
	}
	if !vm.mem.WriteUint64Le(uint32(a[2]), t) {
		return errnoFault
	}
	return errnoSuccess
}

// clock_res_get (94091cd): 1 ns for realtime and monotonic.
func wasiClockResGet(vm *VM, a []uint64) uint32 {
	if id := uint32(a[0]); id != 0 && id != 1 {
		return errnoNotsup
	}
	if !vm.mem.WriteUint64Le(uint32(a[1]), 1) {
		return errnoFault
	}
	return errnoSuccess
}

// random_get: at most 64 KiB a call (EINVAL above).
func wasiRandomGet(vm *VM, a []uint64) uint32 {
	n := uint32(a[1])
	if n > randomGetMax {
		return errnoInval
	}
	if n == 0 {
		return errnoSuccess
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(vm.rand, b); err != nil {
		panic(fmt.Sprintf("random source: %v", err))
	}
	if !vm.mem.Write(uint32(a[0]), b) {
		return errnoFault
	}
	return errnoSuccess
}

// poll_oneoff (94091cd): no events, success, no sleep.
func wasiPollOneoffNoEvents(vm *VM, a []uint64) uint32 {
	if !vm.mem.WriteUint32Le(uint32(a[3]), 0) {
		return errnoFault
	}
	return errnoSuccess
}

// wasiZeroWord writes a 0 Word to argument i, then answers e (fd_readdir, path_readlink,
// sock_send at 94091cd).
func wasiZeroWord(i int, e uint32) func(*VM, []uint64) uint32 {
	return func(vm *VM, a []uint64) uint32 {
		if !vm.mem.WriteUint32Le(uint32(a[i]), 0) {
			return errnoFault
		}
		return e
	}
}

func wasiFdRenumber(_ *VM, a []uint64) uint32 {
	for _, fd := range a[:2] {
		if fd := uint32(fd); fd != 1 && fd != 2 {
			return errnoBadf
		}
	}
	return errnoNotsup
}

func wasiFdTell(vm *VM, a []uint64) uint32 {
	if fd := uint32(a[0]); fd != 1 && fd != 2 {
		return errnoBadf
	}
	if !vm.mem.WriteUint64Le(uint32(a[1]), 0) {
		return errnoFault
	}
	return errnoSuccess
}

// sock_accept (94091cd) writes a 64-bit zero (setDatatype of 0UL) before ENOTSUP.
func wasiSockAccept(vm *VM, a []uint64) uint32 {
	if !vm.mem.WriteUint64Le(uint32(a[2]), 0) {
		return errnoFault
	}
	return errnoNotsup
}

func wasiSockRecv(vm *VM, a []uint64) uint32 {
	if !vm.mem.WriteUint32Le(uint32(a[4]), 0) || !vm.mem.WriteUint16Le(uint32(a[5]), 0) {
		return errnoFault
	}
	return errnoNotsup
}
