// Runs a Go program built for wasip1 (a `go test -c` binary, say) in Node's V8, the
// engine Envoy embeds, through Node's WASI: the filter's own code measured where it
// runs in production, not only under wazero. Used by go_wasip1_node_exec:
//
//	GOOS=wasip1 GOARCH=wasm go test -exec $PWD/wasmtest/v8host/go_wasip1_node_exec ./shared/prefix -run '^$' -bench .
//
// The whole file system is preopened at / and PWD passed on, as Go's own wasip1
// wrappers do for wasmtime and wazero (GOROOT/lib/wasm/go_wasip1_wasm_exec).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';

const [, , path, ...args] = process.argv;
const wasi = new WASI({
  version: 'preview1',
  args: [path, ...args],
  env: { PWD: process.cwd(), PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/' },
  preopens: { '/': '/' },
  returnOnExit: true,
});
const module = await WebAssembly.compile(await readFile(path));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
process.exitCode = wasi.start(instance);
