# Makefile fragment for the integration-test module in test/ (a separate Go
# module, so that k8s.io/kubernetes stays out of the root go.mod).
#
# The root Makefile includes this file; $(CURDIR) is then the repository root.
# It can also be used on its own: make -C <repo> -f test/test.mk test-integration
#
# Targets:
#   k8s-bins          build kube-apiserver, kube-scheduler, kube-controller-manager into $(TEST_K8S_BIN_DIR)
#                     (skipped when the stamp there names the same versions)
#   node-bins         build the real node's kubelet, containerd, ctr and runc shim
#                     into $(TEST_NODE_BIN_DIR) (skipped when up to date)
#   test-node-deps    node-bins + Debian's runc, CNI plugins and busybox-static
#   test-deps         k8s-bins + etcd (apt-get install etcd-server when etcd is
#                     not on PATH) + test-node-deps
#   test-integration  test-deps, then go test in test/ against the real binaries
#                     (TEST_ALONE, the e2e suite, after the others and alone)
#
# All variables carry a TEST_ prefix and can be overridden on the command line.

TEST_DIR         ?= $(CURDIR)/test
TEST_GO          ?= go
TEST_K8S_BIN_DIR ?= $(CURDIR)/bin/k8s
TEST_NODE_BIN_DIR ?= $(CURDIR)/bin/node
# etcd binary the tests run (a name looked up on PATH, or a path).
TEST_ETCD        ?= etcd
# Off by default: with a cold build cache -race recompiles every Kubernetes
# package the tests import (minutes on 2 cores, see test/README.md).
# Use TEST_RACE=-race when the cache is warm.
TEST_RACE        ?=
TEST_TIMEOUT     ?= 25m
TEST_PKGS        ?= ./...
# Packages of TEST_PKGS run after the others, alone: the e2e suite's
# timings assume the machine is not also compiling and linking the other
# test binaries (with a cold cache, minutes of both cores).
TEST_ALONE       ?= ./e2e
TEST_FLAGS       ?= -count=1
TEST_APT_GET     ?= apt-get

.PHONY: k8s-bins node-bins test-deps test-etcd test-node-deps test-integration test-vet

k8s-bins: ## build kube-apiserver, kube-scheduler and kube-controller-manager (test/go.mod's version) into bin/k8s
	@$(TEST_DIR)/hack/build-k8s-bins.sh $(TEST_K8S_BIN_DIR)

# Installs Debian's etcd-server (etcd 3.4) when no etcd is on PATH. Needs root.
test-etcd: ## install etcd-server with apt-get when etcd is not on PATH
	@if command -v $(TEST_ETCD) >/dev/null 2>&1; then \
		echo "test-etcd: using $$(command -v $(TEST_ETCD)) ($$($(TEST_ETCD) --version 2>/dev/null | head -n1))"; \
	else \
		echo "test-etcd: $(TEST_ETCD) not found, installing etcd-server with $(TEST_APT_GET)"; \
		$(TEST_APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(TEST_APT_GET) install -y -qq --no-install-recommends etcd-server; \
	fi

node-bins: ## build the real node's kubelet and containerd (test/hack/nodebins) into bin/node
	@$(TEST_DIR)/hack/build-node-bins.sh $(TEST_NODE_BIN_DIR)

# The real node (test/framework/realnode) runs Debian's runc (1.1.5, with
# seccomp: a runc built from its module without libseccomp fails every CRI
# container), the CNI plugins (/usr/lib/cni) and busybox-static (the one
# binary of the test image). Installed when missing. Needs root.
TEST_NODE_PKGS ?= runc containernetworking-plugins busybox-static
test-node-deps: node-bins ## node-bins, and runc, the CNI plugins and busybox-static from Debian when missing
	@missing=""; for p in $(TEST_NODE_PKGS); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -z "$$missing" ]; then echo "test-node-deps: $(TEST_NODE_PKGS) installed"; else \
		echo "test-node-deps: installing$$missing with $(TEST_APT_GET)"; \
		$(TEST_APT_GET) update -qq && \
		DEBIAN_FRONTEND=noninteractive $(TEST_APT_GET) install -y -qq --no-install-recommends $$missing; \
	fi

test-deps: k8s-bins test-etcd test-node-deps ## everything the integration tests run: k8s-bins, etcd and the real node's parts

# The device-manager tests re-exec themselves in a new mount namespace, like
# `unshare -m --propagation private` (see
# test/framework/kubelet/mountns.go), so they need root (or CAP_SYS_ADMIN).
# helm for test/chart and the e2e tests that render the chart: the root
# Makefile's bin/tools/helm (charts/chart.mk), built once; on its own, the
# tests build it with go tool.
TEST_HELM ?= $(HELM)
test-integration: test-deps $(TEST_HELM) ## go test in test/ against real etcd, kube-apiserver, kube-scheduler and device manager
	@cd $(TEST_DIR) && \
		all=$$($(TEST_GO) list $(TEST_PKGS)) && \
		alone=$$($(TEST_GO) list $(TEST_ALONE) | grep -xF "$$all" || true) && \
		rest=$$(echo "$$all" | grep -vxF "$${alone:-/}" || true) && \
		export TESSERA_TEST_K8S_BIN_DIR=$(TEST_K8S_BIN_DIR) \
			TESSERA_TEST_NODE_BIN_DIR=$(TEST_NODE_BIN_DIR) \
			TESSERA_TEST_HELM=$(TEST_HELM) \
			TESSERA_TEST_ETCD=$(TEST_ETCD) && \
		rc=0 && for pkgs in "$$rest" "$$alone"; do \
			[ -n "$$pkgs" ] || continue; \
			echo "go test $(TEST_RACE) $(TEST_FLAGS) -timeout $(TEST_TIMEOUT)" $$pkgs; \
			$(TEST_GO) test $(TEST_RACE) $(TEST_FLAGS) -timeout $(TEST_TIMEOUT) $$pkgs || rc=1; \
		done && exit $$rc

# gofmt, go vet and staticcheck for the test module (the root lint stops at
# the module boundary). Included from the root Makefile, staticcheck is its
# pinned one (TEST_STATICCHECK); on its own, the one on PATH.
TEST_STATICCHECK ?= $(or $(STATICCHECK),staticcheck)
test-vet: $(STATICCHECK) ## gofmt, go vet and staticcheck of the test/ module
	@out=$$(cd $(TEST_DIR) && gofmt -l .); \
		if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	cd $(TEST_DIR) && $(TEST_GO) vet ./...
	cd $(TEST_DIR) && $(TEST_STATICCHECK) ./...
