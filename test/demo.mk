# Makefile fragment for `make demo`: a local Kubernetes GPU cluster without
# GPUs (see docs/demo.md). The root Makefile includes it after test/test.mk,
# whose k8s-bins and test-etcd targets (and TEST_* variables) it uses.
#
# Targets:
#   demo       build what is missing, start the cluster (control plane,
#              tessera-extender, simulated nodes), submit a sample workload
#              and show a live per-GPU occupancy table until Ctrl-C
#   demo-bins  the binaries the demo runs, in bin/
#
# Variables (DEMO_ prefix, overridable on the command line):
#   DEMO_NODES  simulated nodes, name=profile,... (profiles: gpu/nvmlmock/profiles; default: two dgx-a100,
#               one dgx-1v, one pcie-2numa)
#   DEMO_FLAGS  further flags of tessera-localcluster (e.g. --workload=false,
#               --once, --dir=DIR)
#   DEMO_EXTENDER_FLAGS  flags of the extender, space-separated, after the
#               demo's own (--reservation-wait=10s), e.g.
#               "--consolidation --reservation-wait=1m"
#   DEMO_SCHEDULER  extender (default: kube-scheduler + the tessera-extender
#               process) or plugin (tessera-scheduler: kube-scheduler with
#               Tessera's plugin, the extender in its process)

DEMO_NODES ?= a100-1=dgx-a100,a100-2=dgx-a100,v100-1=dgx-1v,l40s-1=pcie-2numa
DEMO_FLAGS ?=
DEMO_EXTENDER_FLAGS ?=
DEMO_SCHEDULER ?= extender

.PHONY: demo demo-bins

# go build reuses its cache: a second run only links. tessera-scheduler is
# built for DEMO_SCHEDULER=plugin and for --scheduler=plugin in DEMO_FLAGS
# (which tessera-localcluster takes last): a stale bin/tessera-scheduler
# would run otherwise.
demo-bins: $(BIN)/tessera-node $(BIN)/tessera-extender $(if $(filter plugin,$(DEMO_SCHEDULER))$(findstring --scheduler=plugin,$(DEMO_FLAGS)),scheduler)
	@echo "go build tessera-nodesim tessera-localcluster (test/ module)"
	@cd $(TEST_DIR) && $(TEST_GO) build -o $(BIN)/tessera-nodesim ./cmd/tessera-nodesim && \
		$(TEST_GO) build -o $(BIN)/tessera-localcluster ./cmd/tessera-localcluster

demo: k8s-bins test-etcd demo-bins ## local GPU cluster without GPUs: control plane, extender, 4 simulated nodes, sample workload, live occupancy (Ctrl-C stops; needs root)
	TESSERA_TEST_K8S_BIN_DIR=$(TEST_K8S_BIN_DIR) TESSERA_TEST_ETCD=$(TEST_ETCD) \
		$(BIN)/tessera-localcluster --repo=$(CURDIR) --bin-dir=$(BIN) --nodes=$(DEMO_NODES) --scheduler=$(DEMO_SCHEDULER) \
		$(foreach f,$(DEMO_EXTENDER_FLAGS),--extender-flag=$(f)) $(DEMO_FLAGS)
