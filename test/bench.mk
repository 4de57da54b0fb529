# Makefile fragment for the scheduler throughput benchmark (test/bench, in
# the test/ module). The root Makefile includes it after test/test.mk, whose
# k8s-bins and test-etcd targets (and TEST_* variables) it uses. See
# docs/bench.md.
#
# Targets:
#   bench-scheduler  GPU pods/s of kube-scheduler with and without
#                    tessera-extender at BENCH_NODES fake nodes, and the
#                    extender's per-verb latency; prints tables
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

.PHONY: bench-scheduler

bench-scheduler: k8s-bins test-etcd ## kube-scheduler GPU pods/s with and without tessera-extender (1000 and 5000 fake nodes), extender verb latency
	cd $(TEST_DIR) && \
		TESSERA_TEST_K8S_BIN_DIR=$(TEST_K8S_BIN_DIR) \
		TESSERA_TEST_ETCD=$(TEST_ETCD) \
		$(TEST_GO) run ./bench --repo=$(CURDIR) --nodes=$(BENCH_NODES) --pods=$(BENCH_PODS) \
			$(if $(BENCH_LOGS),--logs=$(BENCH_LOGS)) $(BENCH_FLAGS)
