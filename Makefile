# kvroute: build, test and run. Every target works on a fresh machine with Go 1.26.
GO       ?= go
BIN      := bin
WASM     := $(BIN)/kvroute.wasm
# Executions per fuzz target inside `make test` (a smoke run, not a campaign; see .ci/fuzz).
FUZZTIME ?= 50000x

.PHONY: all build wasm native test testdeps vet fmt-check unit fuzz soak run demo bench clean

all: build

build: wasm native

# The filter: a WASI reactor loaded by Envoy (proxy-wasm), built with upstream Go, then
# patched so the Go runtime never calls the host's poll_oneoff (filter/wasmpatch: Envoy
# 1.35-1.38 answer it with ENOSYS and the runtime dies at its first GC).
wasm:
	@mkdir -p $(BIN)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(BIN)/kvroute.go.wasm ./filter
	$(GO) run ./filter/cmd/kvroute-wasmpatch -in $(BIN)/kvroute.go.wasm -out $(WASM)

# Native commands: every main package under a cmd/ directory lands in bin/.
native:
	@mkdir -p $(BIN)
	@pkgs="$$($(GO) list ./controlplane/cmd/... ./wasmtest/cmd/... 2>/dev/null)"; \
	if [ -n "$$pkgs" ]; then echo "go build -o $(BIN)/ $$pkgs"; $(GO) build -o $(BIN)/ $$pkgs; fi

vet:
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

fmt-check:
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# npm packages the end-to-end tests use (the official openai client), pinned by the lockfile.
testdeps:
	npm ci --prefix wasmtest/mesh/testdata/openai --no-audit --no-fund --loglevel=error

# KVROUTE_REQUIRE_NODE: the openai client test fails, rather than skips, without Node.
unit: testdeps
	KVROUTE_REQUIRE_NODE=1 $(GO) test ./...

# Short fuzz runs of every decoder that sees untrusted bytes.
fuzz:
	@./.ci/fuzz $(FUZZTIME)

test: build vet fmt-check unit fuzz

# 100,000 requests through the compiled filter under every host profile (wazero and V8),
# the strictest cpp-host included; make test runs 20,000. About 5 minutes.
soak: wasm testdeps
	KVROUTE_SOAK_REQUESTS=100000 KVROUTE_V8_REQUESTS=100000 KVROUTE_REQUIRE_NODE=1 \
		$(GO) test -count=1 -timeout 30m -run 'TestFilterSurvives|TestFilterOnCppHost' -v ./wasmtest/host/ ./wasmtest/v8host/

run: build
	@if [ -x $(BIN)/kvroute-mesh ]; then exec $(BIN)/kvroute-mesh $(ARGS); \
	else echo "kvroute-mesh is not built yet: the local mesh (issue 6) is missing." >&2; exit 2; fi

demo: build
	$(BIN)/kvroute-mesh --demo $(ARGS)

bench: build
	$(BIN)/kvroute-bench $(ARGS)

clean:
	rm -rf $(BIN)

# The filter as an OCI image in the format istio-agent pulls (Istio's "compat" Wasm image:
# one tar+gzip layer holding plugin.wasm), under out/: an OCI layout directory and an
# oci-archive tarball. Prints the manifest digest, the `sha256` WasmPlugins and
# EnvoyFilters need. OCI_REF is the reference it will be pushed as; OCI_PIN=<release.yaml>
# writes OCI_REF and the digest into that file (manifests/README.md, "Images").
OCI_REF ?= ghcr.io/kvroute/kvroute-wasm:dev
.PHONY: oci manifests-test
oci: wasm
	$(GO) run ./manifests/cmd/kvroute-oci -wasm $(WASM) -out out/kvroute-wasm -archive out/kvroute-wasm.oci.tar -ref $(OCI_REF) $(if $(OCI_PIN),-pin $(OCI_PIN))

# The manifests' tests alone (strict decoding, kustomize renders, the OCI image).
manifests-test:
	$(GO) test ./manifests/...
