# Tessera's build. `make help` lists the targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

GO        ?= go
BIN       := $(CURDIR)/bin
TOOLS     := $(BIN)/tools
IMAGE     ?= tessera:dev
VERSION   ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
GOFLAGS_BUILD := -trimpath -ldflags '-s -w'

STATICCHECK_VERSION := v0.8.2
STATICCHECK         := $(TOOLS)/staticcheck-$(STATICCHECK_VERSION)

# Every command under cmd/ is built into bin/. All are fully static
# (CGO_ENABLED=0) except tessera-node: go-nvml reaches the driver's
# libnvidia-ml.so.1 through dlopen, which needs cgo, and a statically linked
# glibc cannot safely dlopen a library linked against the shared glibc. So
# tessera-node links glibc dynamically and nothing else (checked below).
COMMANDS     := $(notdir $(wildcard cmd/*))
CGO_COMMANDS := tessera-node
BINARIES     := $(addprefix $(BIN)/,$(COMMANDS))

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

.PHONY: build
build: $(BINARIES) ## build every command into bin/

.PHONY: FORCE
FORCE:

$(BIN)/%: FORCE
	@mkdir -p $(BIN)
	@if [[ " $(CGO_COMMANDS) " == *" $* "* ]]; then \
		echo "go build $* (cgo, glibc dynamic)"; \
		CGO_ENABLED=1 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/$*; \
		libs=$$(readelf -d $@ | awk '/NEEDED/ {print $$5}' | tr -d '[]' | sort | tr '\n' ' '); \
		for lib in $$libs; do case $$lib in libc.so.6|libdl.so.2|libpthread.so.0|libm.so.6|libresolv.so.2) ;; \
			*) echo "$@ links $$lib: only glibc may be linked dynamically" >&2; exit 1;; esac; done; \
	else \
		echo "go build $* (static)"; \
		CGO_ENABLED=0 $(GO) build $(GOFLAGS_BUILD) -o $@ ./cmd/$*; \
	fi

.PHONY: deps
deps: ## install what a fresh Debian machine lacks for the unit tests (gcc for -race)
	@command -v gcc >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc libc6-dev; }

.PHONY: test
test: lint unit test-more ## everything CI runs: lint, unit tests with -race, and the suites below

.PHONY: unit
unit: deps ## unit tests of the main module with the race detector
	CGO_ENABLED=1 $(GO) test -race -count=1 ./...

# Suites that live beside the unit tests join `make test` through test-more.
# test/test.mk: the separate test module, run against a real kube-apiserver,
# kube-scheduler, etcd and the kubelet's device manager (built or installed
# on first use). charts/chart.mk first: test.mk hands the tests its helm.
include charts/chart.mk
include test/test.mk
include test/bench.mk
# make demo: a local GPU cluster without GPUs (docs/demo.md).
include test/demo.mk
# make plugin: the kubectl plugin (docs/kubectl-tessera.md).
include cmd/kubectl-tessera/plugin.mk
# make scheduler: tessera-scheduler, kube-scheduler with Tessera's plugin.
include scheduler/scheduler.mk

.PHONY: test-more
test-more: chart-test test-vet scheduler-test test-integration test-repro

# The FGD reproduction on the Alibaba trace (sim/repro_test.go, build tag
# simrepro; the trace at ../shared/traces, a failure under CI=true when it is
# missing): 280 simulations, 1-6 min on the 2 shared cores here. test-repro,
# part of make test, checks the published random/bestfit/fgd values, the
# exact baseline curves, tessera below fgd on every variant and tessera's
# <= 4.0 goal on the default trace (3.95, docs/sim.md). No -race here:
# `make unit` already runs sim/ under the race detector. `make repro` is the
# same run, kept as the name docs/sim.md uses.
.PHONY: test-repro repro
test-repro: ## the FGD reproduction: published values, tessera below fgd everywhere, tessera's <= 4.0 goal
	$(GO) test -tags simrepro -count=1 -timeout 20m -run '^TestRepro' -v ./sim/

repro: test-repro ## the full FGD reproduction (same as test-repro)

.PHONY: lint
lint: $(STATICCHECK) ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
		if [[ -n "$$out" ]]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(STATICCHECK) ./...

$(STATICCHECK):
	@mkdir -p $(TOOLS)
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(TOOLS)/staticcheck $@

.PHONY: bench bench-go
bench: bench-go bench-scheduler ## Go benchmarks, then kube-scheduler throughput with and without the extender (test/bench.mk)

bench-go: ## Go benchmarks of the main module (allocation, scoring, extender verbs, device plugin)
	$(GO) test -run='^$$' -bench=. -benchmem ./...

# Fuzz targets (func FuzzX in a _test.go of the main module), each in turn:
# go test -fuzz runs one target at a time. New failing inputs land in the
# package's testdata/fuzz/FuzzX, where `go test` replays them.
FUZZTIME ?= 10m
.PHONY: fuzz
fuzz: ## run every fuzz target of the main module in turn, FUZZTIME each (default 10m)
	@for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./test/' | xargs -r -n1 dirname | sort -u); do \
		list=$$($(GO) test -list 'Fuzz.*' $$dir); \
		for target in $$(echo "$$list" | grep '^Fuzz' || true); do \
			echo "== $$dir $$target ($(FUZZTIME))"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) -parallel 1 $$dir; \
		done; \
	done

.PHONY: image
image: ## build the container image holding every binary (needs a Docker engine)
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

.PHONY: clean
clean: ## remove build outputs
	rm -rf $(BIN)
