# kvroute: build, test and run. Every target works on a fresh machine with Go 1.26.
GO       ?= go
BIN      := bin
WASM     := $(BIN)/kvroute.wasm
# Executions per fuzz target inside `make test` (a smoke run, not a campaign; see .ci/fuzz).
FUZZTIME ?= 50000x

.PHONY: all build first-build wasm native test testdeps vet staticcheck fmt-check unit fuzz soak run demo bench clean

all: build ## the default: same as make build

build: first-build wasm native ## bin/kvroute.wasm and every command in bin/

# The first build downloads and compiles every module the commands need (the Kubernetes,
# Istio and Envoy ones of the manifests tool among them): say so before minutes of
# "go: downloading" (README.md, "The two commands").
first-build:
	@[ -x $(BIN)/kvroute-mesh ] || echo "kvroute: first build: Go downloads and compiles the modules the commands need, several minutes (once)"

# The filter: a WASI reactor loaded by Envoy (proxy-wasm), built with upstream Go, then
# patched so the Go runtime never calls the host's poll_oneoff (filter/wasmpatch: Envoy
# 1.35-1.38 answer it with ENOSYS and the runtime dies at its first GC), and so the host
# writes the values it returns into the filter's reused buffers (wasmpatch.UseAllocator).
wasm: ## bin/kvroute.wasm, the filter (built with upstream Go, then patched by kvroute-wasmpatch)
	@mkdir -p $(BIN)
	GOOS=wasip1 GOARCH=wasm $(GO) build -buildmode=c-shared -trimpath -o $(BIN)/kvroute.go.wasm ./filter
	$(GO) run ./filter/cmd/kvroute-wasmpatch -in $(BIN)/kvroute.go.wasm -out $(WASM)

# Native commands: every main package under a cmd/ directory lands in bin/.
native: ## every command (each main package under a cmd/ directory) into bin/
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./controlplane/cmd/... ./wasmtest/cmd/... ./filter/cmd/... ./manifests/cmd/...

vet: ## go vet, native and wasip1
	$(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./filter/... ./shared/...

# staticcheck (honnef.co/go/tools, pinned by go.mod's tool directive), natively on every
# package and for wasip1 on what the filter is built from, the two runs merged: code one
# build alone uses (the filter's wasm host calls, helpers of the native tests) counts as
# used. Each exception is a //lint:ignore line in the code, with its reason.
staticcheck: ## staticcheck, native and wasip1 runs merged (exceptions: //lint:ignore lines with a reason)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/staticcheck honnef.co/go/tools/cmd/staticcheck
	$(BIN)/staticcheck -f binary ./... > $(BIN)/staticcheck.native
	GOOS=wasip1 GOARCH=wasm $(BIN)/staticcheck -f binary ./filter/... ./shared/... ./internal/... > $(BIN)/staticcheck.wasip1
	$(BIN)/staticcheck -merge $(BIN)/staticcheck.native $(BIN)/staticcheck.wasip1

fmt-check: ## fail if any Go file needs gofmt
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# npm packages the end-to-end tests use (the official openai and @anthropic-ai/sdk clients),
# pinned by the lockfile.
# python3-zmq gives TestZsubReadsALibzmqPublisher libzmq, vLLM's ZMQ library; best effort
# (as root with apt-get): without it that test is skipped and says so.
testdeps: ## the npm packages the end-to-end tests use (npm ci); libzmq's python3-zmq if it can
	npm ci --prefix wasmtest/mesh/testdata/openai --no-audit --no-fund --loglevel=error
	@/usr/bin/python3 -c 'import zmq' 2>/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		{ apt-get install -y -q python3-zmq >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && \
		apt-get install -y -q python3-zmq >/dev/null 2>&1; }; }; } || \
		echo "testdeps: no python3-zmq (libzmq); TestZsubReadsALibzmqPublisher will be skipped"

# KVROUTE_REQUIRE_NODE: the openai client test fails, rather than skips, without Node.
# The end-to-end mesh tests run after the rest, alone: they route on wall-clock engine
# queues scraped every 100 ms, and with other packages compiling and testing beside them
# on 2 cores a repeat could see the previous request still queued and spill (seen once:
# TestTwentyRepeatsAtZeroSpacingAllHit, 7 of 19, in a cold-cache run).
MESH := ./wasmtest/mesh
# The packages that run goroutines run under the race detector (instead of plainly): the
# control plane, the proxy in front of the wasm host, the engine simulator's servers and
# publisher, the fleet simulator's parallel runs, the commands that start them, and the
# mesh. -race needs cgo (a C compiler). The proxy, kvroute-mesh and the mesh wait on the
# wall clock (timeouts, start-up), several times slower raced, so they run one package at
# a time, after the rest. Left plain: shared/ and filter/ (one thread, as in a proxy-wasm
# VM); wasmtest/host, whose tests drive the guest on a virtual clock from one goroutine
# (its wall-clock calls and parallel VM start are raced through the proxy and the mesh,
# and its 2 x 20,000-request survival run alone would take minutes raced); manifests/,
# whose one goroutine feeds a channel. Run plainly instead of raced, since -race makes
# them meaningless: controlplane's memory and freshness floods (they skip themselves
# raced), the proxy's slow-client cuts (a 500 ms idle timeout against 12 MB of bodies the
# raced proxy takes longer than that to take in), and whether the proxy's upstream request
# carries a Content-Length (decided by whether the filter's body release has landed when
# the forwarding goroutine starts, a scheduling order -race changes).
RACE      := ./controlplane/... ./wasmtest/engine/publisher ./wasmtest/engine/replica \
	./wasmtest/engine/server ./wasmtest/fleet ./wasmtest/cmd/kvroute-enginesim
RACE_WALL := ./wasmtest/proxy ./wasmtest/cmd/kvroute-mesh
PLAIN_ONLY := TestReportFlood|TestKVEventFlood|TestModelFloodSparesOtherModels|TestAttackSlowClients|TestForwardsToTheEndpointTheFilterChose
unit: testdeps ## go test: most packages plainly, those with goroutines under -race, the mesh last and alone
	KVROUTE_REQUIRE_NODE=1 $(GO) test $(filter-out $(shell $(GO) list $(RACE) $(RACE_WALL) $(MESH)),$(shell $(GO) list ./...))
	KVROUTE_REQUIRE_NODE=1 $(GO) test -run '^($(PLAIN_ONLY))$$' ./controlplane ./wasmtest/proxy
	KVROUTE_REQUIRE_NODE=1 $(GO) test -race $(RACE)
	KVROUTE_REQUIRE_NODE=1 $(GO) test -race -p 1 -skip '^($(PLAIN_ONLY))$$' $(RACE_WALL)
	KVROUTE_REQUIRE_NODE=1 $(GO) test -race $(MESH)

# Short fuzz runs of every decoder that sees untrusted bytes.
fuzz: ## short fuzz runs of every decoder of untrusted bytes (FUZZTIME=50000x)
	@./.ci/fuzz $(FUZZTIME)

test: build vet staticcheck fmt-check unit fuzz ## everything CI runs: build, vet, staticcheck, gofmt check, all tests, fuzz

# 100,000 requests through the compiled filter under every host profile (wazero and V8),
# the strictest cpp-host included; make test runs 20,000. About 5 minutes.
soak: wasm testdeps ## 100,000 requests through the compiled filter on wazero and V8 (about 5 minutes)
	KVROUTE_SOAK_REQUESTS=100000 KVROUTE_V8_REQUESTS=100000 KVROUTE_REQUIRE_NODE=1 \
		$(GO) test -count=1 -timeout 30m -run 'TestFilterSurvives|TestFilterOnCppHost' -v ./wasmtest/host/ ./wasmtest/v8host/

run: build ## the whole system on loopback until Ctrl-C (ARGS=--help lists the flags; --engine for your own engines)
	@exec $(BIN)/kvroute-mesh $(ARGS)

demo: build ## round robin against kvroute through the same proxy, 30 s each, then a table
	$(BIN)/kvroute-mesh --demo $(ARGS)

bench: build ## the fleet simulator: every policy on the same arrivals (ARGS=--help)
	$(BIN)/kvroute-bench $(ARGS)

# docs/performance.md's pictures, regenerated: seed 000 (all eight policies, the full
# 10 minutes of arrivals) at 22 replicas, each policy's TTFT distribution, then the
# fewest-replicas search for a TTFT p95 of 1 s. About 100 s on 2 idle cores (24 s + 74 s),
# 11 minutes on 2 busy ones; ARGS go to both runs (e.g. ARGS="--duration 2m" for a quick look).
.PHONY: plots
plots: ## docs/performance.md's pictures: docs/img/ttft.svg and docs/img/replicas.svg (about 2 minutes)
	@mkdir -p $(BIN) docs/img
	$(GO) build -o $(BIN)/ ./wasmtest/cmd/kvroute-bench
	$(BIN)/kvroute-bench --plot docs/img/ttft.svg $(ARGS)
	$(BIN)/kvroute-bench --find-replicas --slo-ttft-p95 1 --plot docs/img/replicas.svg $(ARGS)

# kvroute against the best other policy on each figure, over seeds, where the cache binds
# (docs/performance.md, "The yardstick"): the GPU-only 2,000-customer workload at 26 req/s
# (seeds 1-8), the CPU tier at 34 req/s (1-10: the halves of 5 disagreed) and, with
# MOONCAKE_TRACE set to Mooncake's public synthetic trace (docs/performance.md says where
# it is), the trace at 4 replicas (1-24: past capacity each seed tips or not, and 8 did
# not tell); with MOONCAKE_CONVERSATION_TRACE set to Mooncake's conversation trace, that
# trace at 5 replicas (seeds 1-6), on which the rule was not chosen. About 25 minutes on 2
# idle cores; ARGS go to every run (e.g. ARGS=--stock-metrics).
MOONCAKE_TRACE ?=
MOONCAKE_CONVERSATION_TRACE ?=
.PHONY: yardstick
yardstick: ## kvroute against the best other policy over seeds where the cache binds (about 25 minutes)
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./wasmtest/cmd/kvroute-bench
	@if [ -n "$(MOONCAKE_TRACE)" ]; then \
		echo "$(BIN)/kvroute-bench --trace $(MOONCAKE_TRACE) --replicas 4 --seeds 1:24 $(ARGS)"; \
		$(BIN)/kvroute-bench --trace $(MOONCAKE_TRACE) --replicas 4 --seeds 1:24 $(ARGS); \
	else echo "yardstick: MOONCAKE_TRACE is not set: the trace at 4 replicas is left out"; fi
	@if [ -n "$(MOONCAKE_CONVERSATION_TRACE)" ]; then \
		echo "$(BIN)/kvroute-bench --trace $(MOONCAKE_CONVERSATION_TRACE) --replicas 5 --seeds 1:6 $(ARGS)"; \
		$(BIN)/kvroute-bench --trace $(MOONCAKE_CONVERSATION_TRACE) --replicas 5 --seeds 1:6 $(ARGS); \
	else echo "yardstick: MOONCAKE_CONVERSATION_TRACE is not set: the conversation trace is left out"; fi
	$(BIN)/kvroute-bench --replicas 14 --customers 2000 --duration 600 --warmup 180 --rate 26 --seeds 1:8 $(ARGS)
	$(BIN)/kvroute-bench --replicas 14 --customers 2000 --cpu-tier-tokens 1500000 --duration 600 --warmup 180 --rate 34 --seeds 1:10 $(ARGS)

clean: ## remove bin/
	rm -rf $(BIN)

# The filter as an OCI image in the format istio-agent pulls (Istio's "compat" Wasm image:
# one tar+gzip layer holding plugin.wasm), under out/: an OCI layout directory and an
# oci-archive tarball. Prints the manifest digest, the `sha256` WasmPlugins and
# EnvoyFilters need. OCI_REF is the reference it will be pushed as; OCI_PIN=<release.yaml>
# writes OCI_REF and the digest into that file (manifests/README.md, "Images").
OCI_REF ?= ghcr.io/kvroute/kvroute-wasm:dev
.PHONY: oci manifests-test
oci: wasm ## the filter as an OCI image under out/ (OCI_REF=..., OCI_PIN=...)
	$(GO) run ./manifests/cmd/kvroute-oci -wasm $(WASM) -out out/kvroute-wasm -archive out/kvroute-wasm.oci.tar -ref $(OCI_REF) $(if $(OCI_PIN),-pin $(OCI_PIN))

# The manifests' tests alone (strict decoding, kustomize renders, the OCI image).
manifests-test: ## the manifests' tests alone
	$(GO) test ./manifests/...

# Every target with a "##" comment, one line each.
.PHONY: help
help: ## this list
	@awk 'BEGIN { FS = ":[^#]*## " } /^[a-zA-Z_-]+:[^=]*## / { printf "  make %-15s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
