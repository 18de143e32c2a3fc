package host

import "sort"

// Profile is the behaviour of one range of proxy-wasm-cpp-host commits, the library inside
// Envoy that hosts proxy-wasm plugins. Envoy pins one commit per release
// (bazel/repository_locations.bzl, proxy_wasm_cpp_host), so a profile stands for the Envoy
// and Istio releases that pin a commit in its range. A profile fixes:
//
//   - the WASI surface: which functions exist, with cpp-host's signatures, and what each
//     answers (an import outside it fails the load, as V8's link does);
//   - the host calls allowed while _initialize runs and while proxy_on_memory_allocate runs
//     (any other call traps with "restricted_callback", cpp-host src/v8/v8.cc);
//
// and, the same in every profile so far, the start sequence: _initialize, then for the
// root context proxy_on_context_create, proxy_on_vm_start, proxy_on_configure
// (src/wasm.cc startVm, src/context.cc onStart and onConfigure).
type Profile struct {
	// Name is "cpp-host-" and the first commit of the range.
	Name string
	// Commits is the range of cpp-host commits whose behaviour this is.
	Commits string
	// Envoy lists the Envoy (and Istio) releases that pin a commit in the range.
	Envoy string

	wasi       []wasiFunc
	startAllow map[string]bool // host calls allowed during _initialize
	allocAllow map[string]bool // host calls allowed during proxy_on_memory_allocate
}

// CppHostC4d7bb0 is proxy-wasm-cpp-host from c4d7bb0 (2024-12-19, the first with every WASI
// import of Go's wasip1 runtime) to 3930b7b (2026-04-01, the last without 94091cd). Its WASI
// functions are in include/proxy-wasm/exports.h (FOR_ALL_WASI_FUNCTIONS) and
// src/exports.cc, identical across the range; poll_oneoff answers ENOSYS (52), and during
// proxy_on_memory_allocate only proxy_log, fd_write and clock_time_get may be called
// (include/proxy-wasm/wasm.h, WasmBase::allocMemory). Envoy 1.35 to 1.38 (Istio 1.27 to
// 1.30) pin it: Envoy main moved past it only with envoyproxy/envoy#45756 (2026-06-22),
// after 1.38.0, and no release branch took it back. It is the strictest profile, and the
// default.
var CppHostC4d7bb0 = &Profile{
	Name:    "cpp-host-c4d7bb0",
	Commits: "c4d7bb0fda912e24c64daf2aa749ec54cec99412..3930b7b9a098d4ffc854e1fcf5fa07c9875e58c4",
	Envoy:   "Envoy 1.35-1.38 (Istio 1.27-1.30)",
	wasi:    wasiC4d7bb0(),
	// src/wasm.cc WasmBase::startVm at 3930b7b.
	startAllow: allowSet([]string{"env.emscripten_notify_memory_growth", "env.proxy_log"},
		"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"fd_prestat_get", "fd_prestat_dir_name", "clock_time_get", "random_get",
		"fd_fdstat_get", "fd_fdstat_set_flags"),
	// include/proxy-wasm/wasm.h WasmBase::allocMemory at 3930b7b.
	allocAllow: allowSet([]string{"env.proxy_log"}, "fd_write", "clock_time_get"),
}

// CppHost94091cd is proxy-wasm-cpp-host from 94091cd ("add all wasi hostcalls used by Go
// SDK", 2026-04-06) on: every WASI preview 1 function Go's syscall package imports exists,
// poll_oneoff writes nevents 0 and succeeds without sleeping, and it may be called during
// _initialize and proxy_on_memory_allocate (src/exports.cc, include/proxy-wasm/wasm.h,
// src/wasm.cc at 94091cd; unchanged through 52a0291, 2026-07-01). Envoy main pins
// f2db56a (bazel/deps.yaml, release_date 2026-06-23) since envoyproxy/envoy#45756; Envoy
// 1.39 (Istio 1.31) is the first release after it.
var CppHost94091cd = &Profile{
	Name:    "cpp-host-94091cd",
	Commits: "94091cdb2fff10c9450e87d998714692632766d1..52a02917b301c679ff43565064cffd2c3c750f6d",
	Envoy:   "Envoy 1.39 and later (Istio 1.31 and later)",
	wasi:    wasi94091cd(),
	startAllow: allowSet([]string{"env.emscripten_notify_memory_growth", "env.proxy_log"},
		"fd_write", "args_sizes_get", "args_get", "environ_sizes_get", "environ_get",
		"clock_time_get", "clock_res_get", "random_get", "poll_oneoff", "fd_fdstat_get",
		"fd_fdstat_set_flags", "fd_advise", "fd_allocate", "fd_datasync",
		"fd_fdstat_set_rights", "fd_filestat_get", "fd_filestat_set_size",
		"fd_filestat_set_times", "fd_pread", "fd_prestat_dir_name", "fd_prestat_get",
		"fd_pwrite", "fd_readdir", "fd_renumber", "fd_sync", "fd_tell",
		"path_create_directory", "path_filestat_get", "path_filestat_set_times", "path_link",
		"path_readlink", "path_remove_directory", "path_rename", "path_symlink",
		"path_unlink_file", "sock_accept", "sock_recv", "sock_send", "sock_shutdown"),
	allocAllow: allowSet([]string{"env.proxy_log"}, "fd_write", "clock_time_get", "poll_oneoff"),
}

// Profiles lists every profile, strictest (oldest) first.
func Profiles() []*Profile { return []*Profile{CppHostC4d7bb0, CppHost94091cd} }

// ProfileByName returns the profile with that Name, or nil.
func ProfileByName(name string) *Profile {
	for _, p := range Profiles() {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// WASIFunctions lists the WASI functions the profile provides, sorted.
func (p *Profile) WASIFunctions() []string {
	out := make([]string, 0, len(p.wasi))
	for _, f := range p.wasi {
		out = append(out, f.name)
	}
	sort.Strings(out)
	return out
}

func (p *Profile) String() string { return p.Name }

// allowSet builds a restricted-callback allow list: proxy names as given, WASI names under
// both module names cpp-host registers them with (src/wasm.cc registerCallbacks).
func allowSet(proxy []string, wasi ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range proxy {
		m[n] = true
	}
	for _, n := range wasi {
		m[wasiModule+"."+n] = true
		m[wasiUnstableModule+"."+n] = true
	}
	return m
}
