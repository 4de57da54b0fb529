# Makefile fragment for the scheduler throughput benchmark (test/bench, in
# the test/ module). The root Makefile includes it after test/test.mk, whose
# k8s-bins and test-etcd targets (and TEST_* variables) it uses. See
# docs/bench.md.
#
# Targets:
#   bench-scheduler  GPU pods/s of kube-scheduler alone, with
#                    tessera-extender and as tessera-scheduler (Tessera's
#                    plugin in process) at BENCH_NODES fake nodes, and the
#                    extender's per-verb latency; prints tables
#   peer-bins        build the peers of bench-peers into bin/peers
#                    (test/hack/build-peer-bins.sh): scheduler-plugins'
#                    kube-scheduler and, with HAMI_GIT (a git copy of HAMi),
#                    HAMi's scheduler extender
#   bench-peers      the same GPU pods through kube-scheduler alone,
#                    kube-scheduler + tessera-extender, tessera-scheduler,
#                    kube-scheduler + HAMi's extender and scheduler-plugins (coscheduling,
#                    capacityscheduling): pods/s, gang bind latency,
#                    extender verb latency, a plot (docs/bench.md)
#
# Variables (BENCH_ prefix, overridable on the command line):
#   BENCH_NODES   node counts, ascending (default 1000,5000)
#   BENCH_PODS    GPU pods per run (default 1000)
#   BENCH_LOGS    when set, component logs are copied into this directory
#   BENCH_FLAGS   further flags of test/bench (go run ./bench -h)

BENCH_NODES ?= 1000,5000
BENCH_PODS  ?= 1000
BENCH_LOGS  ?=
BENCH_FLAGS ?=

# bench-peers (BENCH_LOGS and BENCH_FLAGS apply too):
#   BENCH_PEERS_NODES      node counts, ascending (default 1000)
#   BENCH_PEERS_PODS       pods per throughput run (default 1000)
#   BENCH_PEERS_SYSTEMS    kube-scheduler,tessera,tessera-plugin,hami,scheduler-plugins
#   BENCH_PEERS_WORKLOADS  whole,mixed,gang; or trace alone: the trace
#                          replay (Alibaba GPU trace, on a cluster shaped
#                          like its nodes; BENCH_PEERS_NODES not used)
#   BENCH_PEERS_GANGS      gangs per system and node count (default 3)
#   BENCH_PEERS_GANG       members x GPUs of a gang (default 16x8)
#   BENCH_PEERS_SVG        write the plot there (default: none)
#   BENCH_PEER_BIN_DIR     where peer-bins builds (default bin/peers)
#   HAMI_GIT               git copy of github.com/Project-HAMi/HAMi for
#                          peer-bins (HAMi's module is not on the module proxy)
#   BENCH_PEERS_TRACE_DIR  with trace: the trace's folder (default
#                          ../shared/traces/alibaba-gpu-v2023 next to the
#                          repository; read in place)
#   BENCH_PEERS_TRACE_PODS with trace: pods sampled (default 2000)
#   BENCH_PEERS_TRACE_SEED with trace: seed of the sample (default 42)
BENCH_PEERS_NODES     ?= 1000
BENCH_PEERS_PODS      ?= 1000
BENCH_PEERS_SYSTEMS   ?= kube-scheduler,tessera,tessera-plugin,hami,scheduler-plugins
BENCH_PEERS_WORKLOADS ?= whole,mixed,gang
BENCH_PEERS_GANGS     ?= 3
BENCH_PEERS_GANG      ?= 16x8
BENCH_PEERS_SVG       ?=
BENCH_PEER_BIN_DIR    ?= $(CURDIR)/bin/peers
HAMI_GIT              ?=
BENCH_PEERS_TRACE_DIR  ?=
BENCH_PEERS_TRACE_PODS ?= 2000
BENCH_PEERS_TRACE_SEED ?= 42

.PHONY: bench-scheduler peer-bins bench-peers

bench-scheduler: k8s-bins test-etcd ## kube-scheduler GPU pods/s alone, with tessera-extender and as tessera-scheduler (1000 and 5000 fake nodes), extender verb latency
	cd $(TEST_DIR) && \
		TESSERA_TEST_K8S_BIN_DIR=$(TEST_K8S_BIN_DIR) \
		TESSERA_TEST_ETCD=$(TEST_ETCD) \
		$(TEST_GO) run ./bench --repo=$(CURDIR) --nodes=$(BENCH_NODES) --pods=$(BENCH_PODS) \
			$(if $(BENCH_LOGS),--logs=$(BENCH_LOGS)) $(BENCH_FLAGS)

peer-bins: ## build bench-peers' peers into bin/peers: scheduler-plugins' kube-scheduler, HAMi's extender (needs HAMI_GIT)
	@HAMI_GIT=$(HAMI_GIT) $(TEST_DIR)/hack/build-peer-bins.sh $(BENCH_PEER_BIN_DIR)

bench-peers: k8s-bins test-etcd peer-bins ## the same GPU pods through kube-scheduler, tessera, HAMi and scheduler-plugins: pods/s, gang latency, extender verbs, plot; or (BENCH_PEERS_WORKLOADS=trace) an Alibaba trace replay: unallocated GPU %
	cd $(TEST_DIR) && \
		TESSERA_TEST_K8S_BIN_DIR=$(TEST_K8S_BIN_DIR) \
		TESSERA_TEST_ETCD=$(TEST_ETCD) \
		$(TEST_GO) run ./bench --peers --repo=$(CURDIR) --nodes=$(BENCH_PEERS_NODES) --pods=$(BENCH_PEERS_PODS) \
			--peer-systems=$(BENCH_PEERS_SYSTEMS) --peer-workloads=$(BENCH_PEERS_WORKLOADS) --peer-bin-dir=$(BENCH_PEER_BIN_DIR) \
			--gangs=$(BENCH_PEERS_GANGS) --gang-members=$(word 1,$(subst x, ,$(BENCH_PEERS_GANG))) --gang-gpus=$(word 2,$(subst x, ,$(BENCH_PEERS_GANG))) \
			--trace-sample=$(BENCH_PEERS_TRACE_PODS) --trace-seed=$(BENCH_PEERS_TRACE_SEED) $(if $(BENCH_PEERS_TRACE_DIR),--trace-dir=$(abspath $(BENCH_PEERS_TRACE_DIR))) \
			$(if $(BENCH_PEERS_SVG),--svg=$(abspath $(BENCH_PEERS_SVG))) $(if $(BENCH_LOGS),--logs=$(BENCH_LOGS)) $(BENCH_FLAGS)
